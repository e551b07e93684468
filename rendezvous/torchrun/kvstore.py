"""A key/value store with c10d's semantics on etcd v3, under ``<prefix>/<run_id>/store/``.

Values are raw bytes (nothing is ever unpickled). Waits are etcd watches, bounded by a timeout;
counters (``add``) are decimal strings, as torch's TCPStore keeps them, updated by compare-and-swap.
``rendezvous.torchrun.plugin.EtcdStore`` wraps this as a ``torch.distributed.Store``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rendezvous.errors import RendezvousStateError, RendezvousTimeoutError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.recipes import swap
from rendezvous.etcd.txn import (
    compare_created,
    compare_mod_revision,
    compare_value,
    op_count,
    op_delete,
    op_get,
    op_put,
)
from rendezvous.etcd.watch import EventType, KeyRange, Watch
from rendezvous.job.keys import JobKeys

__all__ = ["EtcdKVStore"]


def _bytes(value: bytes | str | Iterable[int]) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class EtcdKVStore:
    """set / get / add / compare_set / wait / check / delete_key / num_keys / list_keys and FIFO queues,
    shared by every process that opens the same (prefix, run id)."""

    def __init__(
        self,
        client: EtcdClient,
        run_id: str,
        *,
        key_prefix: str = "/elastic",
        timeout: float = 300.0,
        lease: Callable[[], int] = lambda: 0,
    ) -> None:
        """``lease()``: the lease each write puts its key on (0: none, the key stays until deleted)."""
        self.client = client
        self.lease = lease
        keys = JobKeys(key_prefix, run_id)
        self.root = keys.store
        self.queues = keys.queues  # apart: queues are not keys (num_keys, list_keys)
        self.timeout = float(timeout)

    def key(self, name: str | bytes) -> str:
        return self.root + (name.decode() if isinstance(name, bytes) else name)

    # -- writes ------------------------------------------------------------------------------------
    def set(self, name: str, value: bytes | str) -> None:
        self.client.put(self.key(name), _bytes(value), lease=self.lease())

    def multi_set(self, names: Sequence[str], values: Sequence[bytes | str]) -> None:
        if len(names) != len(values):
            raise ValueError(f"multi_set got {len(names)} keys and {len(values)} values")
        if names:
            lease = self.lease()
            self.client.txn([], [op_put(self.key(n), _bytes(v), lease) for n, v in zip(names, values)])

    def _update(
        self, key: str, change: Callable[[bytes | None], bytes], also: Callable[[bytes], list[Any]] = lambda value: []
    ) -> bytes:
        """Replace the value at ``key`` (None when absent) by ``change(value)``, by compare-and-swap,
        with the operations ``also(new value)`` in the same transaction."""
        current, lease = self.client.get(key), self.lease()
        while True:
            value = change(None if current is None else current.value)
            token = None if current is None else current.mod_revision
            swapped = swap(self.client, key, value, token, lease=lease, also=also(value))
            if swapped.written:
                return value
            current = swapped.current  # the race was lost: the value that won is read in the same trip

    def add(self, name: str, amount: int) -> int:
        """Add ``amount`` to the counter at ``name`` (0 when absent) atomically; returns the new value."""

        def added(current: bytes | None) -> bytes:
            try:
                base = 0 if current is None else int(current.decode())
            except (UnicodeDecodeError, ValueError):
                raise RendezvousStateError(f"store key {name!r} does not hold a number: {current[:40]!r}") from None
            return str(base + int(amount)).encode()

        return int(self._update(self.key(name), added))

    def append(self, name: str, value: bytes | str) -> None:
        self._update(self.key(name), lambda current: (current or b"") + _bytes(value))

    def compare_set(self, name: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Set ``desired`` if the value is ``expected`` (or the key is absent and ``expected`` is empty).

        Returns the value the key holds afterwards; for an absent key with a non-empty ``expected``,
        returns ``expected`` (TCPStore's answer).
        """
        key, expected, desired = self.key(name), _bytes(expected), _bytes(desired)
        guard = compare_created(key, 0) if not expected else compare_value(key, expected)
        response = self.client.txn([guard], [op_put(key, desired, self.lease())], [op_get(key)])
        if response.succeeded:
            return desired
        kvs = response.responses[0].response_range.kvs
        return kvs[0].value if kvs else expected

    def delete_key(self, name: str) -> bool:
        return self.client.delete(self.key(name)) > 0

    # -- reads ---------------------------------------------------------------------------------------
    def check(self, names: Sequence[str]) -> bool:
        """Every name is a key, or a queue that holds items (as torch's stores answer)."""
        return not self._missing(names)[0]

    def _missing(self, names: Sequence[str]) -> tuple[list[str], int]:
        """The names that are neither a key nor a queue holding items, and the revision of the read."""
        ops = [op for n in names for op in (op_get(self.key(n)), op_count(self._items(n)))]
        response = self.client.txn([], ops)
        counts = [r.response_range.count for r in response.responses]
        missing = [n for i, n in enumerate(names) if counts[2 * i] == 0 and counts[2 * i + 1] == 0]
        return missing, response.header.revision

    def num_keys(self) -> int:
        return self.client.count_prefix(self.root)

    def get(self, name: str, timeout: float | None = None) -> bytes:
        """The value at ``name``, waiting (by watch) until it is set, at most ``timeout`` seconds."""
        return self.multi_get([name], timeout)[0]

    def multi_get(self, names: Sequence[str], timeout: float | None = None) -> list[bytes]:
        return self._wait_values(names, self.timeout if timeout is None else timeout)

    def wait(self, names: Sequence[str], timeout: float | None = None) -> None:
        """Return once every name is a key or a queue holding items; RendezvousTimeoutError after
        ``timeout`` seconds."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        missing, revision = self._missing(names)
        if not missing:
            return
        ranges = (KeyRange(self.root, prefix=True), KeyRange(self.queues, prefix=True))
        with Watch(self.client, *ranges, start_revision=revision + 1) as watch:
            while missing:
                event = _next_event(watch, deadline, _keys_timeout(timeout, missing))
                if event.type in (EventType.PUT, EventType.RESYNC):
                    missing, _ = self._missing(names)

    def list_keys(self) -> list[str]:
        kvs, _ = self.client.get_prefix(self.root, keys_only=True)
        return [kv.key.decode(errors="replace")[len(self.root) :] for kv in kvs]

    # -- queues: FIFO by a per-queue sequence number (keys sort by it) -------------------------------
    def _items(self, name: str) -> str:
        return f"{self.queues}{name}/items/"

    def queue_push(self, name: str, value: bytes | str) -> None:
        """The item goes in under the queue's next sequence number, in the transaction that takes it."""

        def next_seq(current: bytes | None) -> bytes:
            try:
                return str(1 if current is None else int(current) + 1).encode()
            except ValueError:
                raise RendezvousStateError(f"store queue {name!r} has a corrupt counter: {current[:40]!r}") from None

        item = _bytes(value)
        self._update(
            f"{self.queues}{name}/seq",
            next_seq,
            also=lambda seq: [op_put(f"{self._items(name)}{int(seq):020d}", item, self.lease())],
        )

    def queue_len(self, name: str) -> int:
        return self.client.count_prefix(self._items(name))

    def queue_pop(self, name: str, block: bool = True, timeout: float | None = None) -> bytes | None:
        """The oldest item of queue ``name``, removed. Empty: None when not ``block``, else wait for
        one (RendezvousTimeoutError after ``timeout`` seconds)."""
        prefix = self._items(name)
        waited = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + waited
        timed_out = f"timeout after {waited:g}s waiting for an item in store queue {name!r}"
        while True:
            kvs, revision = self.client.get_prefix(prefix, limit=1)
            if kvs:
                head = kvs[0]
                if self.client.txn(
                    [compare_mod_revision(head.key, head.mod_revision)], [op_delete(head.key)]
                ).succeeded:
                    return head.value
                continue  # another consumer took it
            if not block:
                return None
            with Watch(self.client, KeyRange(prefix, prefix=True), start_revision=revision + 1) as watch:
                while _next_event(watch, deadline, timed_out).type not in (EventType.PUT, EventType.RESYNC):
                    pass

    def _wait_values(self, names: Sequence[str], timeout: float) -> list[bytes]:
        keys = [self.key(n) for n in names]
        deadline = time.monotonic() + timeout
        response = self.client.txn([], [op_get(k) for k in keys])
        found = {k: r.response_range.kvs[0].value for k, r in zip(keys, response.responses) if r.response_range.kvs}
        if len(found) == len(set(keys)):
            return [found[k] for k in keys]
        with Watch(self.client, KeyRange(self.root, prefix=True), start_revision=response.header.revision + 1) as watch:
            while len(found) < len(set(keys)):
                missing = [n for n, k in zip(names, keys) if k not in found]
                event = _next_event(watch, deadline, _keys_timeout(timeout, missing))
                if event.type is EventType.RESYNC:
                    return self._wait_values(names, max(deadline - time.monotonic(), 0.0))
                key = event.key.decode(errors="replace")
                if key in keys:
                    if event.type is EventType.PUT:
                        found[key] = event.value
                    else:
                        found.pop(key, None)
        return [found[k] for k in keys]


def _next_event(watch: Watch, deadline: float, timed_out: str):
    """The watch's next event before ``deadline`` (monotonic); RendezvousTimeoutError(``timed_out``) after."""
    remaining = deadline - time.monotonic()
    event = watch.get(timeout=remaining) if remaining > 0 else None
    if event is None:
        raise RendezvousTimeoutError(timed_out)
    return event


def _keys_timeout(timeout: float, missing: Sequence[str]) -> str:
    return (
        f"timeout after {timeout:g}s waiting for store key{'s' if len(missing) > 1 else ''} "
        f"{', '.join(map(repr, missing))}"
    )
