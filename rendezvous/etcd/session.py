"""An etcd lease kept alive, and the renew deadline that fences a node which cannot renew it.

- The keep-alive is one LeaseKeepAlive stream, a task on the process's stream loop. It sends a
  request every ``interval`` and waits for the answer only so long (``AnswerWait``: the smoothed
  round trip and four times its variation, at least half a second, doubled after each silence).
  Silence counts as failure, not only errors: then the renewal goes to every endpoint at once,
  again every ``interval`` until one answers (the usual stream's late answer counts too), and the
  stream moves to the member that did. A frozen, partitioned or leaderless member costs one wait;
  a process too busy to read its answers on time is not taken for a silent member.
- ``lost`` is set when etcd answers that the lease is gone (TTL 0); ``done`` when it was closed.
  Closing revokes the lease, so the node key vanishes at once and everyone watching hears it.
- Fencing. etcd keeps the lease at least ``TTL`` seconds after it received the last renewal, and
  so at least ``TTL`` after that renewal was *sent*. ``deadline`` is the send time of the last
  acknowledged renewal plus ``renew_deadline`` (< TTL): past it, this node can no longer be sure
  it is a member, and whoever runs workers for it must stop them before the lease can have expired
  (Kubernetes' leader election counts its renew deadline the same way). ``on_renew(lease, deadline)``
  is called after every acknowledged renewal so that a process other than this one can enforce it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
from etcd3 import etcdrpc

from rendezvous.errors import RendezvousError

from . import streams
from .client import EtcdClient
from .rpcerrors import map_rpc_error

__all__ = ["Session", "AnswerWait", "hear", "default_renew_deadline", "keep_alive_interval", "refresh_lease"]

_MIN_ANSWER_WAIT = 0.5  # seconds: the least time a keep-alive answer is waited for


def default_renew_deadline(ttl: float) -> float:
    """One second short of the TTL: time enough to kill the workers before the lease can expire."""
    return ttl - 1.0


BIG_JOB = 1024  # nodes: a job up to this size renews each lease every second at most


def keep_alive_interval(renew_deadline: float, nodes: int = 1) -> float:
    """Renew often enough that a leader election (1-2 s) and a failover fit well inside the deadline:
    every eighth of it, at most every second. A job of more than ``BIG_JOB`` nodes renews less
    often, in proportion to its size, up to every quarter of the deadline (3.5 s by default): its
    renewals are etcd's main load while it trains (docs/scale.md), and its machines' deaths are
    found by the peer probes, not by their leases. The fence is the same -- a node stops its
    workers ``renew_deadline`` after the last renewal etcd acknowledged -- and an etcd outage of
    three quarters of the deadline (10.5 s by default) still passes unnoticed."""
    every = max(min(renew_deadline / 8, 1.0), 0.05)
    if nodes <= BIG_JOB:
        return every
    return max(every, min(renew_deadline / 4, every * nodes / BIG_JOB))


class AnswerWait:
    """How long a renewal's answer is waited for before every endpoint is asked: RFC 6298's
    retransmission timeout, over the renewals' round trips.

    The smoothed round trip plus four times its variation (at least half a second), so a link that
    is slow, or slow now and then, is not taken for a silent one; doubled for each renewal in a row
    that the usual stream left unanswered so long, so that a loaded etcd (every node's renewal late
    at once) does not get a new stream from every node at every renewal; never more than half the
    renew deadline.
    """

    def __init__(self, renew_deadline: float) -> None:
        self._cap = max(renew_deadline / 2, _MIN_ANSWER_WAIT)
        self._smoothed: float | None = None
        self._variation = 0.0
        self._backoff = 1

    @property
    def seconds(self) -> float:
        base = _MIN_ANSWER_WAIT if self._smoothed is None else self._smoothed + 4 * self._variation
        return min(max(base, _MIN_ANSWER_WAIT) * self._backoff, self._cap)

    def answered(self, round_trip: float, *, in_time: bool) -> None:
        """A renewal was answered ``round_trip`` seconds after it was sent (by the usual stream
        within the wait: ``in_time``)."""
        if self._smoothed is None:
            self._smoothed, self._variation = round_trip, round_trip / 2
        else:
            self._variation = 0.75 * self._variation + 0.25 * abs(self._smoothed - round_trip)
            self._smoothed = 0.875 * self._smoothed + 0.125 * round_trip
        if in_time:
            self._backoff = 1

    def silent(self) -> None:
        """The usual stream left a renewal unanswered for the whole wait."""
        self._backoff = min(self._backoff * 2, 64)


class Session:
    """An etcd lease kept alive by a task on the stream loop, with a renew deadline."""

    def __init__(
        self,
        client: EtcdClient,
        ttl: int,
        *,
        renew_deadline: float | None = None,
        interval: float | None = None,
        on_renew: Callable[[int, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.ttl = int(ttl)
        self.renew_deadline = float(renew_deadline) if renew_deadline is not None else default_renew_deadline(self.ttl)
        if not 0 < self.renew_deadline < self.ttl:
            raise ValueError(f"renew deadline {self.renew_deadline} must be between 0 and the lease TTL {self.ttl}")
        self.interval = float(interval) if interval is not None else keep_alive_interval(self.renew_deadline)
        client.channels.renewing(self.interval)  # the client's watches wait as long before they ask for progress
        self._on_renew = on_renew
        self._clock = clock
        self.done = threading.Event()
        self.lost = threading.Event()
        self._missed = False  # a renewal was acknowledged only after the deadline had passed
        self._handled: float | None = None  # the missed deadline the last fence dealt with
        self._moved = threading.Condition()  # notified when an acknowledged renewal moves the deadline
        sent = clock()
        self.lease_id = client.grant_lease(self.ttl)
        self._wait = AnswerWait(self.renew_deadline)
        self._wait.answered(clock() - sent, in_time=True)  # the grant's round trip: the first estimate
        self.deadline = sent + self.renew_deadline
        self._notify()
        self._task = streams.submit(self._keep_alive())

    @property
    def alive(self) -> bool:
        return not (self.done.is_set() or self.lost.is_set())

    def overdue(self) -> bool:
        """A renew deadline passed without a renewal (now, or since the last ``clear_overdue``)."""
        return self._missed or (self._clock() >= self.deadline and self.deadline != self._handled)

    def clear_overdue(self) -> None:
        """The fence was handled: that missed deadline is forgotten, also when the renewal that
        comes late for it is acknowledged later (a live lease stays usable)."""
        self._missed = False
        self._handled = self.deadline

    def silent_for(self) -> float:
        """Seconds since the last acknowledged renewal was sent."""
        return self._clock() - (self.deadline - self.renew_deadline)

    def wait_ahead(self, seconds: float, timeout: float) -> bool:
        """Whether the renew deadline is at least ``seconds`` ahead, waiting up to ``timeout`` for
        renewals to move it there (False at once when the lease is gone or closed)."""
        with self._moved:
            return (
                self._moved.wait_for(lambda: not self.alive or self.deadline - self._clock() >= seconds, timeout)
                and self.alive
            )

    def lose(self) -> None:
        """The lease is gone (etcd said so, to the keep-alive or to a write on it): no renewal can
        come, and a ``wait_ahead`` hears it at once."""
        self.lost.set()
        with self._moved:
            self._moved.notify_all()

    def _acknowledged(self, sent: float) -> None:
        if self._clock() >= self.deadline and self.deadline != self._handled:
            self._missed = True
        with self._moved:
            self.deadline = max(self.deadline, sent + self.renew_deadline)
            self._moved.notify_all()
        self._notify()

    def _notify(self) -> None:
        if self._on_renew is not None:
            try:
                self._on_renew(self.lease_id, self.deadline)
            except Exception:  # noqa: BLE001 -- a broken observer must not end the keep-alive
                pass

    async def _keep_alive(self) -> None:
        """Renew every ``interval`` (``_renew``) until closed, or until etcd says the lease is gone
        (TTL 0): while etcd is unreachable it keeps trying, since a new leader extends every lease
        it still holds."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=self.lease_id)
        stream: tuple[Any, Any] | None = None  # the usual stream: its call and endpoint
        next_send = self._clock() + self.interval
        try:
            while not self.done.is_set():
                await asyncio.sleep(max(next_send - self._clock(), 0.0))
                if self.done.is_set():
                    return  # closed, or abandoned without a revoke (as a killed agent would)
                (call, endpoint, response), sent, in_time = await self._renew(request, stream)
                stream = (call, endpoint)
                if response.TTL <= 0:
                    self.lose()
                    return
                self._wait.answered(self._clock() - sent, in_time=in_time)
                self._client.channels.answered(endpoint)
                self._acknowledged(sent)
                next_send = sent + self.interval
        finally:
            if stream is not None:
                stream[0].cancel()

    async def _renew(self, request: Any, stream: tuple[Any, Any] | None) -> tuple[tuple[Any, Any, Any], float, bool]:
        """One renewal on the usual stream; when it errs or goes silent, on every endpoint (the usual
        stream's answer still counts). ((call, endpoint, response), when the answered request was
        sent, whether the usual stream answered in time)."""
        sent = self._clock()
        usual: asyncio.Future | None = asyncio.ensure_future(_renew_on(self._client, request, stream=stream))
        try:
            seconds = self._wait.seconds
            last = sent + max(seconds, self.renew_deadline / 2)
            await hear(usual, seconds, sent=sent, late=self._late, last=last, clock=self._clock)
            if _answered(usual):
                return usual.result(), sent, True
            silent = not usual.done()
            if silent:
                self._wait.silent()
            self._client.stream_failed(TimeoutError("no answer") if silent else usual.exception(), stream and stream[1])
            tries, usual = ({usual: sent} if silent else {}), None  # the silent one is handed on
            answer, sent = await self._renew_anywhere(request, tries)
            return answer, sent, False
        finally:
            if usual is not None and not usual.done():
                _discard(usual)

    @property
    def _late(self) -> float:
        """Seconds past its time after which this loop counts as having woken late (a quarter
        interval): too busy to tell a member's silence from its own."""
        return self.interval / 4

    def _starved(self, planned: float) -> bool:
        """This loop woke late for what it planned at ``planned``."""
        return self._clock() - planned > self._late

    async def _renew_anywhere(self, request: Any, tries: dict[asyncio.Future, float]) -> tuple[tuple, float]:
        """Send the renewal on a new stream to every endpoint, again every ``interval``, keeping the
        earlier ``tries`` open; the first answer from any of them is kept, with its send time.

        Trying the members one after another would spend a whole wait on each that is frozen, or
        that still forwards to a frozen leader (such a renewal hangs for etcd's request timeout,
        even after a new leader is elected). A renewal is idempotent, so asking all of them costs
        only the streams: the lease is renewed by the first try sent after any member knows a live
        leader, and a slow answer (a loaded link, or this process too busy to read it) still counts
        when it comes. Tries older than the renew deadline are given up (their answer could no
        longer move it).
        """
        winner, starved = None, False
        try:
            while True:
                now = self._clock()
                for task in [t for t, sent in tries.items() if now - sent >= self.renew_deadline]:
                    _discard(task)
                    del tries[task]
                if not (tries and starved):  # a loop that woke late asks again only when it is on time
                    tries.update(
                        (asyncio.ensure_future(_renew_on(self._client, request, index=i)), now)
                        for i in range(len(self._client.endpoints))
                    )
                winner = await self._first_answer(tries, now + self.interval)
                starved = self._starved(now + self.interval)
                if winner is not None:
                    call, endpoint, response = winner.result()
                    self._client.channels.prefer(endpoint)
                    return (call, endpoint, response), tries[winner]
        finally:
            for task in tries:
                if task is not winner:
                    _discard(task)

    async def _first_answer(self, tries: dict[asyncio.Future, float], until: float) -> asyncio.Future | None:
        """The first of ``tries`` to be answered before ``until``, or None; failed tries are dropped."""
        while (left := until - self._clock()) > 0:
            pending = [task for task in tries if not task.done()]
            answered = [task for task in tries if _answered(task)]
            if answered:
                return answered[0]
            for task in [t for t in tries if t.done()]:
                if not task.cancelled():
                    self._client.stream_failed(task.exception(), None)  # an expired token is fetched again
                del tries[task]
            if not pending:
                await asyncio.sleep(left)  # every endpoint failed at once: the next round is due then
                return None
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return None

    def close(self, timeout: float = 2.0) -> None:
        """Stop the keep-alive and revoke the lease (its keys are deleted at once)."""
        if self.done.is_set():
            return
        self.done.set()
        self._task.cancel()
        try:
            self._client.revoke_lease(self.lease_id, timeout=timeout)
        except RendezvousError:
            pass  # unreachable etcd: the lease expires by itself within its TTL
        concurrent.futures.wait([self._task], timeout=timeout)


async def hear(
    usual: asyncio.Future,
    wait: float,
    *,
    sent: float,
    late: float,
    last: float,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait for ``usual`` until it was silent for ``wait`` seconds after ``sent`` in which this loop
    could hear it.

    A loop that wakes more than ``late`` seconds after it was due (its process starved of CPU, or
    its thread of the GIL) may hold an answer it has not read yet: that silence is this process's,
    and asking every member would only add streams to a loop already behind. Such a wait starts
    again, up to ``last``.
    """
    until = sent + wait
    while not usual.done() and (left := until - clock()) > 0:
        await asyncio.wait([usual], timeout=left)
        if not usual.done() and clock() - until > late and until < last:
            until = min(clock() + wait, last)


async def _open(client: EtcdClient, index: int | None = None) -> tuple[Any, Any]:
    """A new LeaseKeepAlive stream on the client's current endpoint (or on endpoint ``index``)."""
    channel, endpoint, metadata = await client.open_stream(index)
    return etcdrpc.LeaseStub(channel).LeaseKeepAlive(metadata=metadata), endpoint


async def _renew(call: Any, request: Any) -> Any:
    await call.write(request)
    response = await call.read()
    if response is grpc.aio.EOF:
        raise ConnectionResetError("the keep-alive stream ended")
    return response


async def _renew_on(
    client: EtcdClient, request: Any, *, stream: tuple[Any, Any] | None = None, index: int | None = None
) -> tuple[Any, Any, Any]:
    """One renewal, on ``stream`` (a call and its endpoint) or on a new stream to endpoint ``index``
    (None: the client's current one); the stream, its endpoint and the answer. A try that fails
    closes its stream."""
    call, endpoint = stream if stream is not None else await _open(client, index)
    try:
        return call, endpoint, await _renew(call, request)
    except BaseException:
        call.cancel()
        raise


def refresh_lease(client: EtcdClient, lease_id: int, timeout: float = 5.0) -> int:
    """Renew a lease once (its TTL starts again in full): the seconds it now has, 0 when it is gone.

    For a long lease renewed now and then (a job's retention), where a Session's stream would be a
    waste. RendezvousError when no member answers within ``timeout``."""

    async def once() -> int:
        call, _, response = await _renew_on(client, etcdrpc.LeaseKeepAliveRequest(ID=lease_id))
        call.cancel()
        return max(int(response.TTL), 0)

    try:
        return streams.run(once(), timeout)
    except (TimeoutError, concurrent.futures.TimeoutError):
        raise RendezvousError(f"etcd did not renew lease {lease_id:x} within {timeout:g} s") from None
    except grpc.RpcError as exc:
        raise map_rpc_error(exc) from exc


def _answered(task: asyncio.Future) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def _discard(task: asyncio.Future) -> None:
    """Stop a try that lost: cancel it, or close the stream of one answered in the same instant.
    How it ends is no news (a stream that failed meanwhile): its outcome is collected, not logged."""
    task.add_done_callback(_collect)
    if not task.done():
        task.cancel()
    elif _answered(task):
        task.result()[0].cancel()


def _collect(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
