"""Thin participants for ``bench/scale.py --thin``: thousands of nodes in one process, so that 8k-16k
nodes fit on the one core etcd does not use.

A real participant (``scale_load.participants``) is a ``RendezvousHandler`` in a thread of its own:
its unary calls block that thread, and its waits are a thread each. Here each node is a coroutine of
one asyncio loop and its I/O is ``grpc.aio`` on the process's one channel. What etcd sees is what a
real handler sends, request for request:

- its lease: ``LeaseGrant`` at its first announcement, then one ``LeaseKeepAlive`` stream of its
  own, renewed every ``settings.renew_every`` (the project's rule for the job's size);
- a first join: the state and the coordinator's key read together (two ``Range`` at one
  revision), its node key written in the coordinator's campaign (one ``Txn``, built by the project's
  own ``Election.campaign``), a ``Watch`` stream of the state and the coordinator key's deletion from
  the revision after, and once the round freezes, its row of the rank table (one ``Range``);
- a running round: that watch, kept (no read); a round that moves on: the next announcement on it;
- what only a read can tell (the coordinator gone, history lost): the campaign's read again.

The decisions are the project's pure functions, unchanged: ``join_step``, ``target_round``,
``apply_round_events``, ``decode_state``, ``NodeInfo.encode``, ``bucket_of``/``decode_bucket``. A thin
node never coordinates: the job's coordinator is a real handler that ``scale.py`` starts first
(a thin node told to coordinate stops the run). ``--thin-check`` runs both kinds of participant at
the same K and prints etcd's requests by method, per node, side by side.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import grpc
from etcd3 import etcdrpc

from bench.scale_load import TIMEOUT
from rendezvous.etcd.recipes import Election
from rendezvous.etcd.retry import answer, backoff
from rendezvous.etcd.txn import op_get, op_put
from rendezvous.etcd.watch import EventType, KeyRange, WatchEvent
from rendezvous.job.keys import JobKeys
from rendezvous.job.ranktable import bucket_of, decode_bucket
from rendezvous.job.state import JobState, JobStatus, NodeInfo
from rendezvous.job.store import decode_state
from rendezvous.rounds import snapshot as snapshots
from rendezvous.rounds.join import Announce, Closed, Follow, Frozen, join_step, target_round
from rendezvous.rounds.snapshot import Snapshot, apply_round_events, coordinator_election
from rendezvous.settings import RendezvousSettings

__all__ = ["thin_participants"]


class ThinCoordinating(RuntimeError):
    """A thin node was told to coordinate: the run's real coordinator is gone."""


class _Built(Exception):
    """Carries the transaction the project's own code built (``_Capture``)."""

    def __init__(self, request) -> None:
        super().__init__()
        self.request = request


class _Capture:
    """A client whose ``txn`` hands back the request instead of sending it: the campaign's
    transaction comes from ``Election.campaign`` itself, not a copy of it."""

    def txn(self, compare, success=(), failure=(), timeout=None):
        raise _Built(etcdrpc.TxnRequest(compare=list(compare), success=list(success), failure=list(failure)))


class Etcd:
    """One process's channel, and the unary calls of its nodes: an answer that ``EtcdClient`` tries
    again (``rendezvous.etcd.retry``: etcd's "too many requests" among them) is tried again here too,
    after the same backoff."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.aio.insecure_channel(endpoint)
        self.kv, self.leases = etcdrpc.KVStub(self.channel), etcdrpc.LeaseStub(self.channel)
        self.watches = etcdrpc.WatchStub(self.channel)
        self.retried: dict[str, int] = {}  # why calls were tried again: how many times

    async def _call(self, method, request):
        attempt, until = 0, time.monotonic() + TIMEOUT
        while True:
            try:
                return await method(request, timeout=120)
            except grpc.aio.AioRpcError as exc:
                found = answer(exc.code().name, exc.details() or "")
                if not found.retry or time.monotonic() > until:
                    raise
                reason = found.reason or exc.code().name
                self.retried[reason] = self.retried.get(reason, 0) + 1
                attempt += 1
                await asyncio.sleep(backoff(attempt, 1))

    async def range(self, request):
        return await self._call(self.kv.Range, request)

    async def txn(self, request):
        return await self._call(self.kv.Txn, request)

    async def grant(self, ttl: int) -> int:
        return int((await self._call(self.leases.LeaseGrant, etcdrpc.LeaseGrantRequest(TTL=int(ttl)))).ID)


class Lease:
    """A node's lease, renewed on a keep-alive stream of its own every ``interval`` (as ``Session``)."""

    def __init__(self, etcd: Etcd, lease_id: int, interval: float) -> None:
        self.id = lease_id
        self._task = asyncio.ensure_future(self._keep_alive(etcd, interval))

    async def _keep_alive(self, etcd: Etcd, interval: float) -> None:
        request, call = etcdrpc.LeaseKeepAliveRequest(ID=self.id), None
        try:
            while True:
                await asyncio.sleep(interval)
                call = call or etcd.leases.LeaseKeepAlive()
                await call.write(request)
                if await call.read() is grpc.aio.EOF:
                    call = None
        finally:
            if call is not None:
                call.cancel()

    def stop(self) -> None:
        self._task.cancel()


class RoundWatch:
    """A follower's watch of a round: the state and the coordinator key's deletion, one stream."""

    def __init__(self, etcd: Etcd, keys: JobKeys, start_revision: int) -> None:
        self._ranges = (KeyRange(keys.state), coordinator_election(keys).vacated())
        self._events: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self._call = etcd.watches.Watch()
        self._task = asyncio.ensure_future(self._run(start_revision))

    async def _run(self, revision: int) -> None:
        for key_range in self._ranges:
            await self._call.write(key_range.request(revision))
        while (response := await self._call.read()) is not grpc.aio.EOF:
            if response.compact_revision:
                self._events.put_nowait(WatchEvent(EventType.RESYNC, revision=response.compact_revision))
            for event in response.events:
                self._events.put_nowait(WatchEvent.from_proto(event))

    async def next(self) -> list[WatchEvent]:
        """The next event and every one already delivered."""
        events = [await self._events.get()]
        while not self._events.empty():
            events.append(self._events.get_nowait())
        return events

    def close(self) -> None:
        self._task.cancel()
        self._call.cancel()


class ThinNode:
    """One node's joins and its following of the rounds it is placed in."""

    def __init__(self, etcd: Etcd, settings: RendezvousSettings, node: str, port: int) -> None:
        self._etcd, self._settings, self.node, self._port = etcd, settings, node, port
        self._keys = JobKeys(settings.key_prefix, settings.run_id)
        self.lease: Lease | None = None
        self._watch: RoundWatch | None = None

    async def _read_together(self) -> Snapshot:
        """The coordinator's key, then the state at the same revision (``Election.observe``)."""
        held = await self._etcd.range(etcdrpc.RangeRequest(key=self._keys.coordinator.encode()))
        revision = held.header.revision
        state = await self._etcd.range(etcdrpc.RangeRequest(key=self._keys.state_bytes, revision=revision))
        holder = held.kvs[0].value.decode(errors="replace") if held.kvs else None
        return self._snapshot(state.kvs, revision, holder)

    def _snapshot(self, kvs, revision: int, holder: str | None) -> Snapshot:
        if not kvs:
            return Snapshot(None, None, (), revision, holder)
        return Snapshot(snapshots.decode_state(self._keys, kvs[0].value), kvs[0].mod_revision, (), revision, holder)

    async def _campaign(self, put=None) -> Snapshot:
        """``read_round(all_nodes=False, put=..., claim=(node, lease))``: one transaction."""
        try:
            before = [put] if put is not None else []
            reads = [op_get(self._keys.state)]
            coordinator_election(self._keys).campaign(_Capture(), self.node, self.lease.id, before=before, reads=reads)
        except _Built as built:
            response = await self._etcd.txn(built.request)
        held = Election._answer(response, 1)
        return self._snapshot(held.reads[0].kvs, held.revision, held.holder)

    async def _announce(self, round_: int) -> Snapshot:
        if self.lease is None:
            lease_id = await self._etcd.grant(self._settings.lease_ttl)
            self.lease = Lease(self._etcd, lease_id, self._settings.renew_every)
        info = NodeInfo(
            node=self.node,
            round=round_,
            addr="127.0.0.1",
            local_world_size=1,
            master_port=self._port,
            probe=f"127.0.0.1:{self._port}",  # as scale_load's handlers name theirs
        )
        put = op_put(self._keys.node(self.node), info.encode(), lease=self.lease.id)
        try:
            return await self._campaign(put)
        except grpc.aio.AioRpcError as exc:
            if "lease not found" not in (exc.details() or ""):
                raise
            self.lease.stop()  # it expired under this node (``Member.announce``): a new one, and announce again
            self.lease = None
            return await self._announce(round_)

    async def join(self, seen: JobState | None) -> tuple[JobState, int, Snapshot]:
        """``JoinLoop.run`` for a node that follows: (the frozen state, this node's group rank, the view)."""
        if seen is None:
            seen = (await self._read_together()).state
        target = target_round(seen)
        view = await self._announce(target)
        while True:
            step = join_step(
                view.state, target, self.node, coordinator=view.coordinator, all_nodes=False, lease_alive=True
            )
            if isinstance(step, Frozen):
                rank = await self._place(view.state)
                if rank is not None:
                    return view.state, rank, view
                target = view.state.round + 1
                view = await self._announce(target)
            elif isinstance(step, Announce):
                target = step.round
                view = await self._announce(target)
            elif isinstance(step, Follow):
                view = await self._follow(view)
            elif isinstance(step, Closed):
                raise RuntimeError(f"{self.node}: the job closed")
            else:
                raise ThinCoordinating(f"{self.node} was told to coordinate ({type(step).__name__})")

    async def _follow(self, view: Snapshot) -> Snapshot:
        """The view after the watch's next events; a new read (and watch) when only a read can tell."""
        if self._watch is None:
            self._watch = RoundWatch(self._etcd, self._keys, view.revision + 1)
        after = apply_round_events(self._keys, view, await self._watch.next())
        if after is not None:
            return after
        self._watch.close()
        view = await self._campaign()
        self._watch = RoundWatch(self._etcd, self._keys, view.revision + 1)
        return view

    async def _place(self, state: JobState) -> int | None:
        key = self._keys.rank_bucket(state.table, bucket_of(self.node, state.buckets))
        answer = await self._etcd.range(etcdrpc.RangeRequest(key=key.encode()))
        if not answer.kvs:
            raise RuntimeError(f"rank table bucket {key} is missing")
        rows = decode_bucket(answer.kvs[0].value, key)
        return next((p.participant.group_rank for p in rows if p.participant.node == self.node), None)

    async def run(self, out) -> None:
        """Join, follow the round until the job moves on (``JobMonitor.changed`` for a follower), join again."""
        seen: JobState | None = None
        while True:
            state, rank, view = await self.join(seen)
            out.put(("placed", self.node, state.round, rank, time.time()))
            while _runs(view.state, state.round):
                view = await self._follow(view)
            seen = view.state

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        if self.lease is not None:
            self.lease.stop()


def _runs(state: JobState | None, round_: int) -> bool:
    return state is not None and state.round == round_ and state.status is JobStatus.RUNNING


def _decoded_once(decode):
    """``decode_state`` that decodes a state value once a process: every node of the process receives
    the same state, as every agent does, and each agent decodes it once on its own machine (etcd is
    asked for the same either way). An error is raised again each time, never kept."""
    cache: dict[bytes, JobState] = {}

    def decode_once(keys: JobKeys, value: bytes) -> JobState:
        state = cache.get(value)
        if state is None:
            if len(cache) > 64:
                cache.clear()
            state = cache[value] = decode(keys, value)
        return state

    return decode_once


def thin_participants(endpoints: str, settings: RendezvousSettings, nodes: list[str], cpus: set[int], events) -> None:
    """A process of thin nodes (``scale_load.Job``'s target): ``events`` = (go, out, stopped)."""
    os.sched_setaffinity(0, cpus)
    snapshots.decode_state = _decoded_once(decode_state)  # this process's nodes share one decoded state
    asyncio.run(_serve(endpoints.split(",")[0], settings, nodes, events))


async def _serve(endpoint: str, settings: RendezvousSettings, nodes: list[str], events) -> None:
    go, out, stopped = events
    etcd = Etcd(endpoint)
    thin = [ThinNode(etcd, settings, node, 20000 + i % 40000) for i, node in enumerate(nodes)]
    tasks: list[asyncio.Future] = []
    out.put(("ready", nodes[0], len(nodes), 0, time.time()))
    going = asyncio.get_running_loop().run_in_executor(None, go.wait, TIMEOUT)
    try:
        while not stopped.value:
            if not tasks and going.done():
                tasks = [asyncio.ensure_future(node.run(out)) for node in thin]
            failed = next((t for t in tasks if t.done() and t.exception() is not None), None)
            if failed is not None:
                out.put(("error", nodes[0], 0, 0, f"{type(failed.exception()).__name__}: {failed.exception()}"))
                break
            await asyncio.sleep(0.2)
    finally:
        for task in tasks:
            task.cancel()
        for node in thin:
            node.close()
        await etcd.channel.close()
        if etcd.retried:
            print(f"thin nodes {nodes[0]}..: calls tried again: {etcd.retried}", file=sys.stderr, flush=True)
