"""A job's state, typed: read it, compare-and-swap it, or update it with retries -- the one path every
writer of ``<prefix>/<run_id>/state`` takes (the rounds, the agent's close, the operator's close and
new round). ``decode_state`` is the one decoding of a stored value: the store's reads use it, and so
do the round reads and watches of ``rendezvous.rounds.snapshot``, which read the state together with the
nodes in one transaction.

Writes keep torch's bytes-and-token contract (``EtcdRendezvousBackend``); this store speaks
``JobState``. The token is the state key's etcd ``mod_revision``. Every write puts the state on the
job's lease (``JobState.keep``): the store grants it with the job's first write, and grants a new
one if it ended, so the job's keys are never left without one (unless kept forever: retention 0).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import replace

from rendezvous.errors import LeaseNotFoundError, RendezvousError, RendezvousNoSpaceError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.session import refresh_lease
from rendezvous.etcd.txn import compare_mod_revision, op_delete, op_put

from .backend import EtcdRendezvousBackend
from .history import Event
from .keys import JobKeys, unwrap_state
from .state import JobState

__all__ = ["JobStateStore", "StateUnchanged", "GaveUp", "decode_state"]


def decode_state(keys: JobKeys, value: bytes) -> JobState:
    """The JobState stored as ``value`` under the state key; RendezvousStateError if it is not one."""
    return JobState.decode(unwrap_state(keys.state, value), f"job state at {keys.state}")


class GaveUp(RendezvousError):
    """An update kept losing its compare-and-swap (the state kept changing) until its tries or time ran out."""


class StateUnchanged(Exception):
    """Raised by an update's change function: nothing to write (the update returns the state as it is)."""


class JobStateStore:
    """``read`` / ``compare_and_swap`` / ``update`` of one job's state."""

    def __init__(self, client: EtcdClient, keys: JobKeys) -> None:
        self.keys = keys
        self._client = client
        self._backend = EtcdRendezvousBackend(client, keys.run_id, keys.prefix)

    def read(self) -> tuple[JobState | None, int | None]:
        """The state and its token; (None, None) when the job has none. RendezvousStateError when corrupt."""
        kv = self._client.get(self.keys.state)
        if kv is None:
            return None, None
        return decode_state(self.keys, kv.value), kv.mod_revision

    def compare_and_swap(self, state: JobState, token: int | None) -> bool:
        """Write ``state`` if the stored one is still ``token``'s (None: if there is none); True when written."""
        state, granted = self.leased(state)
        try:
            written = self._write(state, token)
        except LeaseNotFoundError:  # the job's lease ended under it: the keys go on a new one
            state, granted = self.leased(replace(state, keep=state.keep._replace(lease=0)))
            written = self._write(state, token)
        if granted and not written:
            self.release(state.keep.lease)
        return written

    def leased(self, state: JobState) -> tuple[JobState, bool]:
        """``state`` with the job's lease (granted now, and True, when it has none and keeps its keys
        for a retention period): whatever else is written for the job goes on the same lease."""
        keep = state.keep
        if keep.lease or not keep.retention:
            return state, False
        lease = self._client.grant_lease(keep.retention)
        return replace(state, keep=keep._replace(lease=lease)), True

    def renew(self, state: JobState | None) -> None:
        """Start the job's retention period again in full (while it runs, and when it closes)."""
        if state is not None and state.keep.lease:
            refresh_lease(self._client, state.keep.lease, timeout=self._client.timeout)

    def _write(self, state: JobState, token: int | None) -> bool:
        result = self._backend.set_state(state.encode(), token, lease=state.keep.lease)
        return result is not None and result[2]

    def release(self, lease: int) -> None:
        """Revoke a lease granted for a write that lost its race (its keys go with it); best effort."""
        try:
            self._client.revoke_lease(lease)
        except RendezvousError:
            pass  # it ends by itself (with the keys written on it: a lost race's rank table)

    def rerun(self, closed: JobState, token: int, record: Event) -> bool:
        """Clear the closed job ``closed`` (stored as ``token``) for a new run of its id, in one
        transaction: its state and every working key go (``JobKeys.working``); its history stays,
        on its lease, with ``record`` (``job_rerun``) after it. False when the state changed first
        (another node of the new launch cleared it)."""
        deletes = [op_delete(self.keys.state)] + [op_delete(prefix, prefix=True) for prefix in self.keys.working]
        put = op_put(record.key(self.keys.root), record.encode(), lease=closed.keep.lease)
        try:
            done = self._client.txn([compare_mod_revision(self.keys.state, token)], [*deletes, put])
        except LeaseNotFoundError:  # its retention ran out as it was read: the record goes without a lease
            put = op_put(record.key(self.keys.root), record.encode())
            done = self._client.txn([compare_mod_revision(self.keys.state, token)], [*deletes, put])
        return bool(done.succeeded)

    def update(
        self,
        change: Callable[[JobState | None], JobState],
        *,
        tries: int | None = 20,
        timeout: float | None = None,
        what: str = "update",
        through_no_space: bool = False,
    ) -> tuple[JobState | None, JobState | None]:
        """Apply ``change(state) -> new state`` by compare-and-swap until it holds; (before, after).

        ``change`` raises StateUnchanged when there is nothing to write (after is before then), or
        an error of its own to refuse. It is called again with the fresh state after a lost race,
        up to ``tries`` times (None: no count) and within ``timeout`` seconds (GaveUp after).
        ``through_no_space``: etcd out of space (an operator may be freeing it) is tried again, once
        a second, until ``timeout``; then its error, which names the alarm and the fix, is raised.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(tries) if tries is not None else itertools.count():
            state, token = self.read()
            try:
                after = change(state)
            except StateUnchanged:
                return state, state
            try:
                if self.compare_and_swap(after, token):
                    return state, after
            except RendezvousNoSpaceError:
                if not through_no_space or deadline is None or time.monotonic() >= deadline:
                    raise
                time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
                continue
            if deadline is not None and time.monotonic() > deadline:
                break
        raise GaveUp(f"could not {what} job '{self.keys.run_id}': it kept changing")
