"""A watch on a key or a key prefix that survives dropped streams.

etcd delivers every change after a start revision, in order. ``Watch`` keeps one gRPC watch
stream open on the process's stream loop and hands the events over through a queue; when the stream
drops (etcd restarted, endpoint died) or goes silent (a frozen member, a cut link: a quiet stream is
asked for progress, which a healthy member answers at once) it opens a new one from the last
revision it delivered + 1, on the next endpoint if need be, so no event is lost. If etcd compacted the history past that
revision, a ``RESYNC`` event tells the consumer to read the current state again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import queue
import time
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from etcd3 import etcdrpc

from rendezvous.errors import RendezvousError

from . import streams
from .client import EtcdClient
from .retry import BACKOFF_MAX, BACKOFF_START
from .txn import prefix_range_end

__all__ = ["Watch", "WatchEvent", "EventType", "KeyRange"]

_PROGRESS = etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest())


_CLOSED = object()  # put on the queue by close(): get() returns None at once


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
    lease: int = 0  # the lease the key is attached to (0: none)

    @classmethod
    def from_proto(cls, event: Any) -> "WatchEvent":
        """One event of a WatchResponse (``mvccpb.Event``)."""
        kind, kv = EventType.DELETE if event.type == event.DELETE else EventType.PUT, event.kv
        return cls(kind, kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease)


@dataclass(frozen=True)
class KeyRange:
    """A key, or every key under it (``prefix``); ``deletes_only`` drops the put events."""

    key: str | bytes
    prefix: bool = False
    deletes_only: bool = False

    def request(self, revision: int) -> Any:
        key = self.key.encode() if isinstance(self.key, str) else self.key
        create = etcdrpc.WatchCreateRequest(key=key, start_revision=revision)
        if self.prefix:
            create.range_end = prefix_range_end(key)
        if self.deletes_only:
            create.filters.append(etcdrpc.WatchCreateRequest.NOPUT)
        return etcdrpc.WatchRequest(create_request=create)


class Watch:
    """Events on one or more key ranges from ``start_revision`` on, over one gRPC stream.

    The stream is a task on the process's stream loop (``rendezvous.etcd.streams``); the consumer reads
    the events from a queue in its own thread. A stream quiet for ``PROBE_EVERY`` seconds is asked
    for progress; one that stays silent for ``SILENCE`` seconds is reopened on the next endpoint.
    """

    PROBE_EVERY = 1.0
    SILENCE = 3.0

    def __init__(
        self,
        client: EtcdClient,
        key: str | bytes | KeyRange,
        *more: KeyRange,
        start_revision: int,
        prefix: bool = False,
    ) -> None:
        self._client = client
        first = key if isinstance(key, KeyRange) else KeyRange(key, prefix)
        self._ranges = (first, *more)
        # Each range resumes from its own revision: etcd orders events within a watch, not across.
        self._next_revision = [max(int(start_revision), 1)] * len(self._ranges)
        self._events: queue.Queue[WatchEvent | object] = queue.Queue()
        self._closed = False
        self.reconnects = 0
        try:
            client.ensure_token()  # a blocking call: here rather than on the loop
        except RendezvousError:
            pass  # etcd is away: the stream gets its token when it comes back
        self._task = streams.submit(self._run())

    # -- consumer side ---------------------------------------------------------------------------
    def get(self, timeout: float | None) -> WatchEvent | None:
        """The next event, or None when none came within ``timeout`` seconds or the watch is closed
        (``close`` wakes a consumer waiting here at once)."""
        if self._closed and self._events.empty():
            return None
        try:
            event = self._events.get(timeout=None if timeout is None else max(timeout, 0.0))
        except queue.Empty:
            return None
        return None if event is _CLOSED else event

    def drain(self) -> list[WatchEvent]:
        """Every event already delivered, without waiting."""
        events = []
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return events
            if event is not _CLOSED:
                events.append(event)

    def close(self, wait: bool = True) -> None:
        """Stop the stream (waiting, unless ``wait`` is False, until it is gone; at most 5 s)."""
        self._closed = True
        self._events.put(_CLOSED)  # wakes a consumer blocked in get()
        self._task.cancel()
        if wait:
            concurrent.futures.wait([self._task], timeout=5)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the stream (on the stream loop) ---------------------------------------------------------
    async def _run(self) -> None:
        backoff = BACKOFF_START
        while not self._closed:
            endpoint = call = prober = None
            silent = False
            answered = [False]  # the stream said something: the next reconnect starts with a short backoff
            try:
                channel, endpoint, metadata = await self._client.open_stream()
                call = etcdrpc.WatchStub(channel).Watch(metadata=metadata)
                for key_range, revision in zip(self._ranges, self._next_revision):
                    await call.write(key_range.request(revision))
                # The request side stays open: a half-closed stream ends the watch.
                heard = [time.monotonic()]
                prober = asyncio.ensure_future(self._probe(call, heard, endpoint))
                await self._deliver(call, heard, answered)
            except asyncio.CancelledError:
                if self._closed or prober is None or not prober.done() or not prober.result():
                    raise  # the watch was closed (also when the prober gave up at the same time)
                silent = True  # the prober gave up on a silent stream
            except grpc.RpcError as exc:
                self._client.stream_failed(exc, endpoint)
            except Exception:  # a closed client, no token to be had now, ...: retry until closed
                pass
            finally:
                if prober is not None:
                    prober.cancel()
                if call is not None:
                    call.cancel()
            if answered[0]:
                backoff = BACKOFF_START
            if silent:
                self._client.stream_failed(TimeoutError("the watch stream went silent"), endpoint)
                backoff = BACKOFF_START
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            self.reconnects += 1

    async def _deliver(self, call: Any, heard: list[float], answered: list[bool]) -> None:
        """Queue the events of one stream until it ends. ``heard`` holds when the stream last said
        anything (for the prober); ``answered`` whether it said anything at all."""
        index_of: dict[int, int] = {}  # etcd answers the create requests of a stream in the order they were sent
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                return
            heard[0] = time.monotonic()
            answered[0] = True
            if response.created:
                index_of[response.watch_id] = len(index_of)
            if response.compact_revision:
                # The revisions we still needed are gone: start over from the oldest kept one.
                self._next_revision = [response.compact_revision] * len(self._ranges)
                self._events.put(WatchEvent(EventType.RESYNC, revision=response.compact_revision))
                return
            if response.canceled:
                return
            index = index_of.get(response.watch_id)
            if index is None:
                continue  # a progress answer (watch id -1): the stream is alive, nothing changed
            for event in response.events:
                self._events.put(WatchEvent.from_proto(event))
                self._next_revision[index] = event.kv.mod_revision + 1

    @classmethod
    def waits(cls, renew_every: float) -> tuple[float, float]:
        """(quiet seconds before a progress request, silent seconds before the stream is reopened) on a
        client whose leases are renewed every ``renew_every`` s: ``PROBE_EVERY`` and ``SILENCE``, or
        for renewals further apart (a big job's) a quarter longer than their interval, and the
        silence as much longer -- their answers keep the watch from asking, as every second's do."""
        if renew_every <= cls.PROBE_EVERY:
            return cls.PROBE_EVERY, cls.SILENCE
        probe_every = 1.25 * renew_every
        return probe_every, cls.SILENCE + probe_every - cls.PROBE_EVERY

    async def _probe(self, call: Any, heard: list[float], endpoint: Any) -> bool:
        """Ask a quiet stream for progress; cancel it (True) when it stays silent past ``SILENCE``.

        etcd answers a progress request at once on a healthy member, even when nothing changed;
        a frozen member, a dead link or a member cut off from its leader does not. A lease renewal
        that the same member answered (this client's keep-alive, on the same connection) says as
        much: while those come, nothing is asked -- an agent's watches then cost etcd no traffic
        of their own while they are quiet, where K agents would otherwise probe K times a second.
        """
        probe_every, silence = self.waits(self._client.channels.renew_every)
        while True:
            await asyncio.sleep(probe_every / 2)
            quiet = time.monotonic() - max(heard[0], self._client.channels.last_answer(endpoint))
            if quiet >= silence:
                call.cancel()
                return True
            if quiet >= probe_every:
                try:
                    await call.write(_PROGRESS)
                except Exception:  # noqa: BLE001 -- the stream is ending; the reader sees why
                    return False
