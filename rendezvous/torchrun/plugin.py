"""torch interop: a ``torch.distributed.Store`` on etcd v3, and the ``etcd-v3`` torchrun handler.

This module imports torch; nothing else in the package imports it. torchrun finds the handler
through the entry point ``etcd-v3`` in group ``torchrun.handlers`` (``entry``, which imports this
module only when torchrun asks for the backend):

    torchrun --rdzv-backend etcd-v3 --rdzv-endpoint HOST:PORT --rdzv-id ID ...

That uses torch's own DynamicRendezvousHandler over ``EtcdRendezvousBackend`` and the store below,
their keys on a lease that ends two hours after the last write, and a finished job's id run again
by a new launch (``lifetime``). ``JobHandler`` adds one answer torch's handler lacks where the store
outlives every agent: a node whose round was closed or abandoned ends its waits (``roundfate``).
Note that torch's handler pickles its own state into the backend (and unpickles it on read): that
is torch's handler, not etcd-elastic's rounds, which keep JSON only.

Errors cross into torch as torch's own classes. torch's handler catches only its own
``RendezvousError`` family (its keep-alive thread, ``shutdown()``), and c10d callers catch
``DistError``s, so what this module hands to torch -- the backend and the store -- translates the
project's errors at this boundary (``TorchBackend``, ``EtcdStore``), keeping their messages. The
project's error tree does not subclass torch's: ``rendezvous`` never imports torch, and an
agent must not pay for importing it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from rendezvous import errors
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.version import server_version, version_line
from rendezvous.job.backend import EtcdRendezvousBackend
from rendezvous.job.keys import JobKeys
from rendezvous.settings import CONF_KEYS, RendezvousSettings

from .kvstore import EtcdKVStore
from .lifetime import JobLease, RerunBackend
from .roundfate import Fate, fate, lost_nodes
from .torchstate import TorchState, is_torch_state, read_torch_state

__all__ = ["EtcdStore", "JobHandler", "TorchBackend", "torch_error", "create_handler"]

log = logging.getLogger(__name__)

# The project's error -> the name of torch's, most specific first. torch's rendezvous package is
# imported only when needed: importing it loads torchrun's handler entry points, this module's
# among them, so importing it here at module level would be circular.
_RENDEZVOUS_ERRORS = (
    (errors.RendezvousConnectionError, "RendezvousConnectionError"),
    (errors.RendezvousStateError, "RendezvousStateError"),
    (errors.RendezvousClosedError, "RendezvousClosedError"),
    (errors.RendezvousTimeoutError, "RendezvousTimeoutError"),
    (errors.RendezvousError, "RendezvousError"),
)


def torch_error(exc: errors.RendezvousError) -> Exception:
    """torch's rendezvous error for one of the project's, with the same message."""
    from torch.distributed.elastic.rendezvous import api

    for ours, theirs in _RENDEZVOUS_ERRORS:
        if isinstance(exc, ours):
            return getattr(api, theirs)(str(exc))
    return api.RendezvousError(str(exc))


@contextmanager
def _as_torch() -> Iterator[None]:
    try:
        yield
    except errors.RendezvousError as exc:
        raise torch_error(exc) from exc


@contextmanager
def _as_c10d() -> Iterator[None]:
    """Store errors as c10d's: unreachable etcd is DistNetworkError, a timeout or anything else DistStoreError."""
    try:
        yield
    except errors.RendezvousConnectionError as exc:
        raise dist.DistNetworkError(str(exc)) from None
    except errors.RendezvousError as exc:
        raise dist.DistStoreError(str(exc)) from None


class TorchBackend:
    """``EtcdRendezvousBackend`` (or ``lifetime.RerunBackend`` over one) as torch's
    RendezvousBackend: same contract, torch's error classes (registered as a virtual subclass of
    torch's ABC by ``create_handler``)."""

    def __init__(self, backend: EtcdRendezvousBackend | RerunBackend) -> None:
        self._backend = backend

    @property
    def name(self) -> str:
        return self._backend.name

    def get_state(self) -> Any:
        with _as_torch():
            return self._backend.get_state()

    def set_state(self, state: bytes, token: Any = None) -> Any:
        with _as_torch():
            return self._backend.set_state(state, token)


class EtcdStore(dist.Store):
    """c10d's Store API over ``EtcdKVStore``: usable with ``init_process_group(store=...)``."""

    def __init__(
        self,
        client: EtcdClient,
        run_id: str,
        *,
        key_prefix: str = "/elastic",
        timeout: timedelta = timedelta(seconds=300),
        lease: Callable[[], int] = lambda: 0,
    ) -> None:
        """``lease()``: the lease each write puts its key on (0: none; the handler's: ``JobLease``)."""
        super().__init__()
        self._kv = EtcdKVStore(client, run_id, key_prefix=key_prefix, lease=lease)
        self._where = (client, run_id, key_prefix, lease)
        self._clones: list[EtcdStore] = []
        self.set_timeout(timeout)

    def clone(self) -> "EtcdStore":
        """A store on the same keys, for another thread (torch calls this in ``split_group``,
        ``shrink_group`` and its Python-store path). torch holds the clone as a C++ reference that
        does not keep the Python object alive, so this store does."""
        client, run_id, key_prefix, lease = self._where
        twin = EtcdStore(client, run_id, key_prefix=key_prefix, timeout=self.timeout, lease=lease)
        self._clones.append(twin)
        return twin

    def _seconds(self, override: timedelta | None = None) -> float:
        return (override if override is not None else self.timeout).total_seconds()

    def set(self, key: str, value: bytes | str) -> None:
        with _as_c10d():
            self._kv.set(key, value)

    def get(self, key: str) -> bytes:
        with _as_c10d():
            return self._kv.get(key, self._seconds())

    def add(self, key: str, value: int) -> int:
        with _as_c10d():
            return self._kv.add(key, value)

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        with _as_c10d():
            return self._kv.compare_set(key, expected_value, desired_value)

    def append(self, key: str, value: bytes | str) -> None:
        with _as_c10d():
            self._kv.append(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with _as_c10d():
            return self._kv.multi_get(keys, self._seconds())

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        with _as_c10d():
            self._kv.multi_set(keys, values)

    def has_extended_api(self) -> bool:
        return True

    def wait(self, keys: list[str], override_timeout: timedelta | None = None) -> None:
        with _as_c10d():
            self._kv.wait(keys, self._seconds(override_timeout))

    def check(self, keys: list[str]) -> bool:
        with _as_c10d():
            return self._kv.check(keys)

    def delete_key(self, key: str) -> bool:
        with _as_c10d():
            return self._kv.delete_key(key)

    def num_keys(self) -> int:
        with _as_c10d():
            return self._kv.num_keys()

    def list_keys(self) -> list[str]:
        with _as_c10d():
            return self._kv.list_keys()

    # Queues, as torch's TCPStore and HashStore have them. torch's C++ PrefixStore does not forward
    # these to a Python store, so they work on this store itself, not through a PrefixStore over it.
    def queue_push(self, key: str, value: bytes | str) -> None:
        with _as_c10d():
            self._kv.queue_push(key, value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        with _as_c10d():
            value = self._kv.queue_pop(key, block, self._seconds())
        if value is None:
            raise dist.QueueEmptyError(f"store queue {key!r} is empty")
        return value

    def queue_len(self, key: str) -> int:
        with _as_c10d():
            return self._kv.queue_len(key)


class JobHandler:
    """torch's DynamicRendezvousHandler, and an answer from ``num_nodes_waiting`` -- the one call
    torch's agent makes while its workers are healthy -- when the round was closed (torch's
    ``RendezvousClosedError``: this node ends) or abandoned (a new round is asked for), as
    ``roundfate`` decides from the state torch's handler has just read. Everything else is torch's
    handler's (registered as a virtual subclass of torch's RendezvousHandler by ``create_handler``)."""

    def __init__(self, handler: Any, backend: RerunBackend) -> None:
        self._handler, self._backend = handler, backend
        self._formed: TorchState | None = None  # the state as this node's round formed
        self._said: int | None = None  # the round whose loss was said
        self._decoded: tuple[bytes | None, TorchState | None] = (None, None)  # the last state read, decoded

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)

    @property
    def use_agent_store(self) -> bool:
        """False: each round's workers bootstrap on a store of their own (see ``_store_per_round``)."""
        return False

    def next_rendezvous(self) -> Any:
        with _store_per_round():
            info = self._handler.next_rendezvous()
        self._formed = self._seen()
        return info

    def num_nodes_waiting(self) -> int:
        waiting = self._handler.num_nodes_waiting()  # syncs the state: backend.seen is the newest
        now = self._seen()
        verdict = fate(self._formed, now)
        if verdict is Fate.CLOSED:
            raise torch_error(
                errors.RendezvousClosedError(
                    f"rendezvous '{self._handler.get_run_id()}' was closed while this node's workers ran: another "
                    "node's agent ended it (it gave up after its restarts, failed, or was stopped), so no round of "
                    "this run can form again; ending this node's workers"
                )
            )
        if verdict is Fate.ABANDONED and self._formed is not None and now is not None:
            self._say_lost(self._formed, now)
            return max(waiting, 1)
        return waiting

    def _seen(self) -> TorchState | None:
        """The state torch's handler read last, decoded once for as long as it stays the same (torch's
        agent asks ``num_nodes_waiting`` every monitor interval; the state changes far less often)."""
        seen = self._backend.seen
        if seen != self._decoded[0]:
            self._decoded = (seen, _readable(seen))
        return self._decoded[1]

    def _say_lost(self, formed: TorchState, now: TorchState) -> None:
        if self._said == formed.round:
            return
        self._said = formed.round
        lost = ", ".join(f"{node.addr} (pid {node.pid}, rank {node.rank})" for node in lost_nodes(formed, now))
        log.warning(
            "rendezvous '%s' round %d lost %s: torch's handler dropped it for its missed heartbeats; this node's "
            "workers restart for a new round",
            self._handler.get_run_id(),
            formed.round,
            lost,
        )


class _StorePerRound:
    """torch's handler forming a round with its agent store off, as ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    has it (torch reads the switch as a round forms): rank 0's worker serves a new store on a free port
    each round. torch's shared agent store lives as long as its agents, and its workers' keys are
    prefixed by each agent's own restart count, which differ once one node's worker failed and the
    other's agent restarted for the new round (not counted as a restart): the new workers met under
    different prefixes, or met the last round's addresses, and never resumed (gloo's
    ``connectFullMesh`` refused, then quiet -- torch's c10d handler does the same). The switch is set
    while any handler of this process forms a round, and put back as it was after the last."""

    NAME = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forming, self._before = 0, None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._forming == 0:
                self._before = os.environ.get(self.NAME)
            self._forming += 1
            os.environ[self.NAME] = "1"
        try:
            yield
        finally:
            with self._lock:
                self._forming -= 1
                if self._forming == 0 and self._before is None:
                    os.environ.pop(self.NAME, None)
                elif self._forming == 0:
                    os.environ[self.NAME] = self._before


_store_per_round = _StorePerRound()


def _readable(state: bytes | None) -> TorchState | None:
    if state is None or not is_torch_state(state):
        return None
    try:
        return read_torch_state(state)
    except errors.RendezvousStateError:
        return None


def create_handler(params: Any) -> Any:
    """torchrun's handler creator: torch's DynamicRendezvousHandler over our backend and store.

    ``--rdzv-conf`` keys of etcd-elastic (read_timeout, key_prefix, protocol, cacert, cert, key,
    user, password) configure the etcd connection; torch's own keys (join_timeout,
    last_call_timeout, close_timeout, heartbeat, keep_alive_*) go to torch's handler.
    """
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler as torch_create_handler

    RendezvousBackend.register(TorchBackend)
    RendezvousHandler.register(JobHandler)

    ours = {k: str(v) for k, v in params.config.items() if k in CONF_KEYS and k not in _TORCHS}
    endpoint = (params.endpoint or "").strip() or DEFAULT_ENDPOINT  # as torch's etcd backends read ""
    try:
        settings = RendezvousSettings.from_conf(params.run_id, params.min_nodes, params.max_nodes, ours)
        target = settings.target(endpoint)
    except errors.RendezvousSettingsError as exc:  # torch's handlers say a bad setting with ValueError
        raise ValueError(str(exc)) from None
    client = EtcdClient(target)
    _say_version(client, endpoint)
    keys, lease = JobKeys(settings.key_prefix, params.run_id), JobLease(client)  # keys that expire, an id run again
    rerun = RerunBackend(EtcdRendezvousBackend(client, params.run_id, settings.key_prefix), keys, lease)
    store = EtcdStore(client, params.run_id, key_prefix=settings.key_prefix, lease=lease)
    return JobHandler(torch_create_handler(store, TorchBackend(rerun), params), rerun)


def _say_version(client: EtcdClient, endpoint: str) -> None:
    """One warning when the etcd's version is worth one (``rendezvous.etcd.version``), looked at in a
    thread of its own: torch's handler does not wait on it, nor on an etcd that is not up yet."""

    def look() -> None:
        line = version_line(server_version(client), endpoint)
        if line is not None:
            log.warning(line)

    threading.Thread(target=look, name="etcd-version", daemon=True).start()


DEFAULT_ENDPOINT = "localhost:2379"  # an empty --rdzv-endpoint: etcd's own client port here, as torch's etcd backends

# Keys whose meaning on this path is torch's handler's (keep_alive_interval is its heartbeat period).
_TORCHS = ("join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval")
