"""A round's hang cases in etcd: the keys and their JSON, nothing of the protocol that uses them
(that is ``launcher.hangs.cases``):

    <job>/hangs/<round>/s/<case>          the suspicion (created once; its creator decides)
    <job>/hangs/<round>/r/<case>/<node>   each node's report of its ranks
    <job>/hangs/<round>/k/<case>/<node>   the stacks of its stopped ranks (written with the report)
    <job>/hangs/<round>/v/<case>          the verdict (created once), which every node acts on
    <job>/hangs/<round>/q/<ask>           a question of elastic-ctl status: the nodes' heartbeat ages
    <job>/hangs/<round>/a/<ask>/<node>    each node's answer, on the asker's lease

Every key is on a lease: a case's on its writer's, an ask and its answers on the asker's, revoked
when it has read them. Agents watch only suspicions, verdicts and asks, so a case costs the job K
reports and one range read by the decider, not K events for each of K nodes; and a running job
writes nothing at all while no hang is suspected and nobody asks. The stacks are kept apart from
the reports so that the decider's one range read stays small: it reads only the stacks it shows.
What this module reads is JSON, checked on decode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from rendezvous.errors import LeaseNotFoundError, RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.recipes import create_once
from rendezvous.etcd.txn import op_put
from rendezvous.etcd.watch import EventType, KeyRange, Watch

from .keys import JobKeys

_KINDS = {"s": "suspect", "v": "verdict", "q": "ask"}

__all__ = ["CaseEvent", "HangBoard", "HangChannel", "ask_heartbeats", "ASK_WAIT"]

ASK_WAIT = 1.0  # seconds an asker waits for the nodes' answers
_ASK_TTL = 10  # seconds: the asker's lease, revoked as soon as it has read the answers


@dataclass(frozen=True)
class CaseEvent:
    kind: str  # "suspect", "verdict" or "ask"
    case: int  # the case's number (an ask's id)
    data: dict


def _decode(raw: bytes) -> dict | None:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _encode(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class HangBoard:
    """One round's hang cases, for one node."""

    def __init__(self, client: EtcdClient, keys: JobKeys, round_: int, node: str, lease_id: int) -> None:
        self._client = client
        self._prefix = keys.hangs(round_)
        self._node = node
        self._lease = lease_id
        existing, revision = client.get_prefix(self._prefix)
        self._pending = [e for e in (self._event(kv.key, kv.value) for kv in existing) if e is not None]
        self._watch = Watch(
            client,
            KeyRange(self._prefix + "s/", prefix=True),
            KeyRange(self._prefix + "v/", prefix=True),
            KeyRange(self._prefix + "q/", prefix=True),
            start_revision=revision + 1,
        )

    def _event(self, key: bytes, value: bytes) -> CaseEvent | None:
        rest = key.decode(errors="replace")[len(self._prefix) :]
        kind, _, case = rest.partition("/")
        data = _decode(value)
        if kind not in _KINDS or not case.isdigit() or data is None:
            return None  # a report, an answer, or a value that is not ours
        return CaseEvent(_KINDS[kind], int(case), data)

    def poll(self) -> list[CaseEvent]:
        """Suspicions and verdicts that arrived since the last poll, in order."""
        events, self._pending = self._pending, []
        for event in self._watch.drain():
            if event.type is EventType.PUT:
                found = self._event(event.key, event.value)
                if found is not None:
                    events.append(found)
        return events

    def _create(self, key: str, data: dict) -> tuple[bool, dict | None]:
        """Write ``key`` unless it exists; (whether we wrote it, the value that stands)."""
        created = create_once(self._client, key, _encode(data), lease=self._lease)
        if created.written:
            return True, data
        return False, _decode(created.current.value) if created.current is not None else None

    def suspect(self, case: int, data: dict) -> bool:
        """Open case ``case``; True when this node opened it (and so decides it)."""
        return self._create(f"{self._prefix}s/{case}", {**data, "node": self._node})[0]

    def report(self, case: int, data: dict, stacks: dict[str, str]) -> None:
        """This node's report of its ranks and, in the same write, their stacks (by rank)."""
        puts = [
            op_put(f"{self._prefix}r/{case}/{self._node}", _encode(data), lease=self._lease),
            op_put(f"{self._prefix}k/{case}/{self._node}", _encode(stacks), lease=self._lease),
        ]
        self._client.txn([], puts)

    def stacks(self, case: int, node: str) -> dict[str, str]:
        """The stacks ``node`` wrote with its report of ``case``, by rank ({} when none)."""
        kv = self._client.get(f"{self._prefix}k/{case}/{node}")
        data = _decode(kv.value) if kv is not None else None
        return {k: v for k, v in (data or {}).items() if isinstance(v, str)}

    def reports(self, case: int) -> list[dict]:
        kvs, _ = self._client.get_prefix(f"{self._prefix}r/{case}/")
        return [data for data in (_decode(kv.value) for kv in kvs) if data is not None]

    def verdict(self, case: int) -> dict | None:
        """The verdict of ``case``, read now (None: none stands yet)."""
        kv = self._client.get(f"{self._prefix}v/{case}")
        return _decode(kv.value) if kv is not None else None

    def settle(self, case: int, verdict: dict) -> dict | None:
        """Write the verdict unless one stands; the one that stands."""
        return self._create(f"{self._prefix}v/{case}", verdict)[1]

    def answer(self, ask: CaseEvent, data: dict) -> None:
        """Answer an ask, on the asker's lease (gone already: the asker stopped waiting; nothing to do)."""
        lease = ask.data.get("lease")
        if not isinstance(lease, int) or isinstance(lease, bool) or lease <= 0:
            return
        try:
            self._client.put(f"{self._prefix}a/{ask.case}/{self._node}", _encode(data), lease=lease)
        except LeaseNotFoundError:
            pass

    def close(self) -> None:
        self._watch.close()


class HangChannel:
    """What an agent needs of etcd for hangs: each round's board."""

    def __init__(self, client: EtcdClient, keys: JobKeys, node: str) -> None:
        self._client, self._keys, self._node = client, keys, node

    def board(self, round_: int, lease_id: int) -> HangBoard:
        return HangBoard(self._client, self._keys, round_, self._node, lease_id)


def ask_heartbeats(
    client: EtcdClient, keys: JobKeys, round_: int, nodes: int, wait: float = ASK_WAIT
) -> dict[str, dict]:
    """Ask the agents of ``round_`` for their workers' heartbeats; each node's answer, by node.

    The ask and the answers live on a lease of the asker's, revoked once it has read them (or
    within its TTL if it dies): asking leaves nothing behind. Waits until ``nodes`` answered or
    ``wait`` seconds passed. While etcd is out of space nothing can be asked: RendezvousNoSpaceError.
    """
    prefix = keys.hangs(round_)
    ask = time.time_ns()
    lease = client.grant_lease(_ASK_TTL)
    try:
        revision = client.put(f"{prefix}q/{ask}", _encode({"lease": lease}), lease=lease)
        found: dict[str, dict] = {}
        # Every answer comes after the ask: a watch from the ask's revision on misses none.
        with Watch(client, KeyRange(f"{prefix}a/{ask}/", prefix=True), start_revision=revision + 1) as watch:
            deadline = time.monotonic() + wait
            while len(found) < nodes and (left := deadline - time.monotonic()) > 0:
                event = watch.get(timeout=left)
                data = _decode(event.value) if event is not None and event.type is EventType.PUT else None
                if data is not None:
                    found[event.key.decode(errors="replace").rpartition("/")[2]] = data
        return found
    finally:
        try:
            client.revoke_lease(lease, timeout=2.0)
        except RendezvousError:
            pass  # the lease ends by itself within its TTL
