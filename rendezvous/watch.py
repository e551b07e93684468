"""A watch on a key or a key prefix that survives dropped streams.

etcd delivers every change after a start revision, in order. ``Watch`` keeps one gRPC watch
stream open in a background thread and hands the events over through a queue; when the stream
drops (etcd restarted, endpoint died) it opens a new one from the last revision it delivered + 1,
on the next endpoint if need be, so no event is lost. If etcd compacted the history past that
revision, a ``RESYNC`` event tells the consumer to read the current state again.
"""

from __future__ import annotations

import enum
import queue
import threading
from dataclasses import dataclass
from typing import Any

import grpc
from etcd3 import etcdrpc

from .client import EtcdClient, prefix_range_end

__all__ = ["Watch", "WatchEvent", "EventType"]

_BACKOFF_START = 0.05
_BACKOFF_MAX = 1.0


class EventType(str, enum.Enum):
    PUT = "put"
    DELETE = "delete"
    RESYNC = "resync"  # history was lost (compaction): read the current state again


@dataclass(frozen=True)
class WatchEvent:
    type: EventType
    key: bytes = b""
    value: bytes = b""
    revision: int = 0  # the mod_revision of the change (for RESYNC: the revision watched from now)
    create_revision: int = 0


class Watch:
    """Events on ``key`` (or every key under it when ``prefix``) from ``start_revision`` on."""

    def __init__(self, client: EtcdClient, key: str | bytes, *, start_revision: int, prefix: bool = False) -> None:
        self._client = client
        self._key = key.encode() if isinstance(key, str) else key
        self._range_end = prefix_range_end(self._key) if prefix else b""
        self._next_revision = max(int(start_revision), 1)
        self._events: queue.Queue[WatchEvent] = queue.Queue()
        self._stop = threading.Event()
        self._call: Any = None
        self._call_lock = threading.Lock()
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"watch:{self._key.decode(errors='replace')}", daemon=True)
        self._thread.start()

    # -- consumer side ---------------------------------------------------------------------------
    def get(self, timeout: float | None) -> WatchEvent | None:
        """The next event, or None when none came within ``timeout`` seconds (or the watch is closed)."""
        if self._stop.is_set() and self._events.empty():
            return None
        try:
            return self._events.get(timeout=None if timeout is None else max(timeout, 0.0))
        except queue.Empty:
            return None

    def drain(self) -> list[WatchEvent]:
        """Every event already delivered, without waiting."""
        events = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        self._stop.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=5)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the stream ------------------------------------------------------------------------------
    def _requests(self, revision: int):
        create = etcdrpc.WatchCreateRequest(key=self._key, start_revision=revision)
        if self._range_end:
            create.range_end = self._range_end
        yield etcdrpc.WatchRequest(create_request=create)
        # Keep the request side open until the watch is closed: a half-closed stream ends the watch.
        self._stop.wait()

    def _run(self) -> None:
        backoff = _BACKOFF_START
        while not self._stop.is_set():
            endpoint = None
            try:
                channel, endpoint, metadata = self._client.watch_channel()
                call = etcdrpc.WatchStub(channel).Watch(self._requests(self._next_revision), metadata=metadata)
                with self._call_lock:
                    if self._stop.is_set():
                        call.cancel()
                        return
                    self._call = call
                for response in call:
                    backoff = _BACKOFF_START
                    if response.compact_revision:
                        # The revisions we still needed are gone: start over from the oldest kept one.
                        self._next_revision = response.compact_revision
                        self._events.put(WatchEvent(EventType.RESYNC, revision=response.compact_revision))
                        break
                    for event in response.events:
                        kind = EventType.DELETE if event.type == event.DELETE else EventType.PUT
                        kv = event.kv
                        self._events.put(WatchEvent(kind, kv.key, kv.value, kv.mod_revision, kv.create_revision))
                        self._next_revision = kv.mod_revision + 1
                    if response.canceled:
                        break
            except grpc.RpcError:
                if endpoint is not None:
                    self._client.rotate(endpoint)
            except Exception:  # a closed client, or anything else: retry until closed
                pass
            finally:
                with self._call_lock:
                    if self._call is not None:
                        self._call.cancel()
                    self._call = None
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, _BACKOFF_MAX)
            self.reconnects += 1
