"""How long a torchrun job's keys live, and the same job id run again once it finished -- for the
``etcd-v3`` handler, under torch's own ``DynamicRendezvousHandler``.

- Every key the handler writes (torch's state, the c10d store's keys) is put on a lease of ``TTL``
  seconds (two hours, as torch's etcd backend keeps its state), granted anew once a quarter of it
  has passed and never kept alive: a key lives 1.5 to 2 hours after the last write to it, and a job
  nobody runs any more vanishes by itself. One lease grant per node every 30 minutes.
- A new launch of a finished job's id runs a new job, as torch's c10d backend allows: a handler
  whose first read of the state finds it closed (torch's ``closed``, read without unpickling:
  ``torchstate``) sees no state at all, and its first write replaces the closed state -- by
  compare-and-swap on the closed state's revision, with the old run's store keys deleted in the
  same transaction, so that no key of the old run is read by the new one. The same transaction
  counts the job's runs (``<root>run``). Whoever first read the state while it was open belongs to
  the run that closed it: while that run's state stands, torch's handler raises its
  ``RendezvousClosedError`` to it; once a new run replaced it, this backend does (the run count
  moved on). It never joins a new run by mistake.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rendezvous.errors import LeaseNotFoundError, RendezvousClosedError, RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.txn import KeyValue, op_delete, op_get, op_put
from rendezvous.job.backend import EtcdRendezvousBackend, Token
from rendezvous.job.keys import JobKeys

from .torchstate import is_torch_state, read_torch_state

__all__ = ["TTL", "JobLease", "RerunBackend", "closed"]

TTL = 7200  # seconds a torchrun job's keys outlive its last write (torch's etcd backend: 2 hours)


class JobLease:
    """The lease a node's writes put the job's keys on (see the module's note); call it for the id."""

    def __init__(self, client: EtcdClient, ttl: int = TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self._client, self._ttl, self._clock = client, ttl, clock
        self._id, self._granted = 0, 0.0

    def __call__(self) -> int:
        if self._id == 0 or self._clock() - self._granted >= self._ttl / 4:
            self._id, self._granted = self._client.grant_lease(self._ttl), self._clock()
        return self._id

    def lost(self) -> None:
        """etcd says the lease is gone (the node slept past it): the next write gets a new one."""
        self._id = 0


def closed(state: bytes) -> bool:
    """torch's state says the rendezvous is closed (a state that cannot be read: not closed)."""
    if not is_torch_state(state):
        return False
    try:
        return read_torch_state(state).closed
    except RendezvousStateError:
        return False


class RerunBackend:
    """The backend torch's handler is given (the RendezvousBackend contract, bytes and tokens): the
    job's keys on ``lease``, and a finished job's id run again by a new launch (the module's note)."""

    def __init__(self, backend: EtcdRendezvousBackend, keys: JobKeys, lease: JobLease) -> None:
        self._backend, self._keys, self._lease = backend, keys, lease
        self._run: int | None = None  # the job's run this launch belongs to (None: not read yet)
        self._finished: Token | None = None  # the closed state this launch found at its first read
        self.seen: bytes | None = None  # torch's state as last read or written by this node (None: none yet)

    @property
    def name(self) -> str:
        return self._backend.name

    @property
    def _runs_key(self) -> str:
        return self._keys.root + "run"

    def get_state(self) -> tuple[bytes, Token] | None:
        current, run = self._read()
        if self._run is None:
            self._run = run
            if current is not None and closed(current[0]):
                self._finished, self._run = current[1], run + 1  # it starts the next run
        elif run > self._run:
            raise RendezvousClosedError(
                f"rendezvous '{self._keys.run_id}' was closed, and a new launch of it runs now: this node "
                "belongs to the run that finished"
            )
        if current is not None and current[1] == self._finished:
            return None  # the finished run's state: this launch starts a new one over it
        self.seen = current[0] if current is not None else None
        return current

    def _read(self) -> tuple[tuple[bytes, Token] | None, int]:
        """The state and the job's run count, at one revision."""
        reads = self._backend.client.txn([], [op_get(self._backend.key), op_get(self._runs_key)]).responses
        state_kvs, run_kvs = (r.response_range.kvs for r in reads)
        state = self._backend.decode(KeyValue.from_proto(state_kvs[0])) if state_kvs else None
        try:
            run = int(run_kvs[0].value) if run_kvs else 0
        except ValueError:
            raise RendezvousStateError(f"{self._runs_key} is not a run count: {run_kvs[0].value[:40]!r}") from None
        return state, run

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, Token, bool] | None:
        also: list[Any] = []
        if token is None and self._finished is not None:  # the new run's first write replaces the old
            token = self._finished
            also = [op_delete(self._keys.store, prefix=True), op_delete(self._keys.queues, prefix=True)]
            also.append(op_put(self._runs_key, str(self._run).encode(), self._lease()))
        try:
            result = self._write(state, token, also)
        except LeaseNotFoundError:
            self._lease.lost()
            result = self._write(state, token, also)
        if result is not None and result[2]:
            self._finished = None
        if result is not None and result[1] == self._finished:
            return None
        if result is not None:
            self.seen = result[0]
        return result

    def _write(self, state: bytes, token: Any, also: list[Any]) -> tuple[bytes, Token, bool] | None:
        return self._backend.set_state(state, token, lease=self._lease(), also=also)
