"""The write recipes every layer above shares, each one etcd transaction guarded by a revision, as
etcd's ``client/v3/concurrency`` writes them:

- ``create_once``: ``If(create_revision(k) == 0) Then(Put) Else(Get)`` -- the first writer wins,
  and a loser learns the value that stands in the same round trip (a hang case, its verdict);
- ``swap``: compare-and-swap against a token (the key's ``mod_revision``; None: the key must not
  exist), reading the current value when the race is lost (a job's state, a store counter);
- ``read_together``: several reads at one revision without a transaction (etcd refuses even a
  read-only transaction while its NOSPACE alarm is raised; plain ranges still work);
- ``Election``: a key held on a lease by whoever created it first, as etcd's election campaigns
  (the round's coordinator): its claim goes into a transaction of the caller's, its holder is read
  from that transaction, and its end is the key's deletion (the holder's lease ended).

Pure protobuf building and one call each; nothing here knows what the keys mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .client import EtcdClient
from .txn import KeyValue, compare_created, compare_mod_revision, op_get, op_put
from .watch import KeyRange

__all__ = ["Swapped", "create_once", "swap", "valid_token", "read_together", "Election", "Held"]


@dataclass(frozen=True)
class Swapped:
    """What a guarded write did: ``written``, the store ``revision`` after it, and (when not written)
    the value that stands instead (None: there is none)."""

    written: bool
    revision: int
    current: KeyValue | None = None


def valid_token(token: Any) -> bool:
    """A token is a key's mod_revision: a positive int (a bool is not one)."""
    return isinstance(token, int) and not isinstance(token, bool) and token > 0


def _guarded(
    client: EtcdClient, guard: Any, key: str | bytes, value: bytes, lease: int, also: Sequence[Any]
) -> Swapped:
    response = client.txn([guard], [op_put(key, value, lease=lease), *also], [op_get(key)])
    if response.succeeded:
        return Swapped(True, response.header.revision)
    kvs = response.responses[0].response_range.kvs
    return Swapped(False, response.header.revision, KeyValue.from_proto(kvs[0]) if kvs else None)


def create_once(client: EtcdClient, key: str | bytes, value: bytes, *, lease: int = 0) -> Swapped:
    """Write ``key`` unless it exists; otherwise return the value that stands (one round trip)."""
    return _guarded(client, compare_created(key, 0), key, value, lease, ())


def swap(
    client: EtcdClient, key: str | bytes, value: bytes, token: int | None, *, lease: int = 0, also: Sequence[Any] = ()
) -> Swapped:
    """Write ``value`` if nobody wrote ``key`` since ``token`` (None: if the key does not exist), with the
    operations ``also`` in the same transaction; otherwise return the value that stands.

    A token that is not a mod_revision never matches: the current value is returned, nothing written.
    """
    if token is not None and not valid_token(token):
        current = client.get(key)
        return Swapped(False, 0, current)
    guard = compare_created(key, 0) if token is None else compare_mod_revision(key, token)
    return _guarded(client, guard, key, value, lease, also)


@dataclass(frozen=True)
class Held:
    """An election's key as one read saw it: its ``holder`` (None: nobody), the answers (RangeResponses)
    of the reads made with it, and the store ``revision`` they were read at."""

    holder: str | None
    reads: list[Any]
    revision: int


def read_together(client: EtcdClient, ops: Sequence[Any]) -> tuple[list[Any], int]:
    """The answers (RangeResponses) of range ``ops`` (``txn.op_get``) as of one revision, and that revision:
    the first read is linearizable, the others read the store as of its revision."""
    answers: list[Any] = []
    revision = 0
    for op in ops:
        request = type(op.request_range)()
        request.CopyFrom(op.request_range)
        request.revision = revision
        answer = client.range(request)
        revision = revision or answer.header.revision
        answers.append(answer)
    return answers, revision


class Election:
    """A key held on a lease by whoever created it first (etcd's ``election.Campaign``, without a queue).

    The claim is written only where nobody holds the key; when the holder's lease ends the key is
    deleted, and everyone watching ``vacated()`` hears it and may claim it again.
    """

    def __init__(self, key: str) -> None:
        self.key = key

    def campaign(
        self, client: EtcdClient, candidate: str, lease: int, *, before: Sequence[Any] = (), reads: Sequence[Any] = ()
    ) -> Held:
        """Claim the key for ``candidate`` on ``lease`` unless someone holds it, in one transaction with
        the writes ``before`` and the ``reads``."""
        claim = op_put(self.key, candidate.encode(), lease=lease)
        answer = [op_get(self.key), *reads]
        response = client.txn([compare_created(self.key, 0)], [*before, claim, *answer], [*before, *answer])
        return self._answer(response, len(reads))

    def observe(self, client: EtcdClient, *, before: Sequence[Any] = (), reads: Sequence[Any] = ()) -> Held:
        """The holder (None: nobody), read with ``reads`` after the writes ``before`` (one transaction
        with them; with no write, plain reads at one revision, which work while etcd is out of space)."""
        if before:
            return self._answer(client.txn([], [*before, op_get(self.key), *reads]), len(reads))
        answers, revision = read_together(client, [op_get(self.key), *reads])
        held = answers[0].kvs
        return Held(held[0].value.decode(errors="replace") if held else None, answers[1:], revision)

    def vacated(self) -> KeyRange:
        """The watch range that hears the holder go: the key's deletions only."""
        return KeyRange(self.key, deletes_only=True)

    @staticmethod
    def _answer(response: Any, reads: int) -> Held:
        got = list(response.responses)
        held = got[len(got) - reads - 1].response_range.kvs
        holder = held[0].value.decode(errors="replace") if held else None
        return Held(holder, [r.response_range for r in got[len(got) - reads :]], response.header.revision)
