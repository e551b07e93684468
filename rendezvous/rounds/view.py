"""A read-only view of a job's rendezvous state, for library users (``elastic.get_state``) and elastic-ctl."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from rendezvous.errors import RendezvousNoSpaceError
from rendezvous.etcd import credentials
from rendezvous.etcd.client import EtcdClient
from rendezvous.job.hangboard import ask_heartbeats
from rendezvous.job.history import gray_failures, read_history, unhealthy_nodes
from rendezvous.job.keys import DEFAULT_KEY_PREFIX, JobKeys
from rendezvous.job.state import JobOutcome, JobStatus
from rendezvous.job.stopped import Stopped, stopped_from

from .snapshot import Snapshot, read_round

__all__ = ["JobView", "NodeView", "get_state", "view_of", "stopped_of"]


@dataclass(frozen=True)
class NodeView:
    node: str
    group_rank: int | None  # None: the node waits for a later round
    addr: str
    local_world_size: int
    alive: bool  # its agent holds its lease
    finished: bool = False  # its workers of this round all succeeded
    heartbeat_age: float | None = None  # seconds since the oldest last elastic.heartbeat() of its workers
    heartbeat_rank: int | None = None  # the rank that beat it


@dataclass(frozen=True)
class JobView:
    run_id: str
    status: str  # "joining", "running" or "closed"
    round: int
    world_size: int
    master_addr: str
    master_port: int
    min_nodes: int
    max_nodes: int
    nodes: tuple[NodeView, ...]
    reason: str = ""
    restarts: int = 0  # the job's restart count (TORCHELASTIC_RESTART_COUNT of its workers)
    max_restarts: int = 0  # the job's --max-restarts budget
    outcome: str = ""  # succeeded, failed, closed by an operator; running, joining, or stopped (no live agent)
    stopped_since: float | None = None  # stopped: no live agent since then (a lower bound when stopped_silent)
    stopped_silent: int = 0  # stopped: nodes of the last round that left no word (their leases ran out)
    stalled_restarts: int = 0  # restarts in a row with no progress (the crash-loop breaker's count)
    unhealthy: tuple[tuple[str, str], ...] = ()  # (node, why) for nodes out of the rounds by their health gate
    gray: tuple[str, ...] = ()  # stragglers named and not recovered, the last pre-flight check's findings

    @property
    def stopped(self) -> str:
        """``no live agent since 12:03:04 UTC`` when the job is stopped, else ``""``."""
        if self.outcome != JobOutcome.STOPPED.value:
            return ""
        return Stopped(self.stopped_since, self.stopped_silent).describe(time.time())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["nodes"] = [asdict(n) for n in self.nodes]
        data["stopped"] = self.stopped
        return data


def get_state(
    endpoint: str | EtcdClient,
    run_id: str,
    *,
    key_prefix: str = DEFAULT_KEY_PREFIX,
    timeout: float = 5.0,
    heartbeats: bool = False,
    **client_options: Any,
) -> JobView | None:
    """The job's state as etcd holds it now, or None when there is no such job.

    ``endpoint`` is ``host:port[,...]`` (or an EtcdClient); ``client_options`` go to EtcdClient
    (ca_cert, cert_key, cert_cert, user, password), and those not given come from the
    ``ELASTIC_ETCD_*`` environment variables (``rendezvous.etcd.credentials``). Only reads etcd,
    unless ``heartbeats``: then the running round's agents are asked for their workers' heartbeat
    ages (keys on a lease of the asker's, gone when it has read the answers; about a second).
    """
    own = not isinstance(endpoint, EtcdClient)
    if own:
        client_options = {**credentials.from_environ(os.environ), **client_options}
    client = EtcdClient(endpoint, timeout=timeout, **client_options) if own else endpoint
    keys = JobKeys(key_prefix, run_id)
    try:
        snapshot = read_round(client, keys, all_nodes=True)
        beats = _ask(client, keys, snapshot) if heartbeats else None
        stopped = stopped_of(client, keys, snapshot)
        events = read_history(client, keys.root)[0] if snapshot.state is not None else []
    finally:
        if own:
            client.close()
    view = view_of(snapshot, beats, stopped=stopped, unhealthy=unhealthy_nodes(events))
    return replace(view, gray=gray_failures(events)) if view is not None else None


def stopped_of(client: EtcdClient, keys: JobKeys, snapshot: Snapshot) -> Stopped | None:
    """For a job with no live agent that nobody closed: since when, from its history (one range read)."""
    state = snapshot.state
    if state is None or state.outcome(len(snapshot.nodes)) is not JobOutcome.STOPPED:
        return None
    events, _ = read_history(client, keys.root)
    return stopped_from(state, events)


def _ask(client: EtcdClient, keys: JobKeys, snapshot: Snapshot) -> dict[str, dict] | None:
    """The live participants' heartbeat answers (None: nothing to ask, or etcd is out of space)."""
    state = snapshot.state
    if state is None or state.status is not JobStatus.RUNNING:
        return None
    live = {n.info.node for n in snapshot.nodes}
    count = sum(1 for p in state.participants if p.node in live)
    try:
        return ask_heartbeats(client, keys, state.round, count) if count else None
    except RendezvousNoSpaceError:
        return None  # an ask is a write: the view goes without the ages


def view_of(
    snapshot: Snapshot,
    beats: dict[str, dict] | None = None,
    now: float | None = None,
    stopped: Stopped | None = None,
    unhealthy: tuple[tuple[str, str], ...] = (),
) -> JobView | None:
    """The view of one read of the job's keys (``read_round(..., all_nodes=True)``), with the nodes'
    answers about their heartbeats (``hangboard.ask_heartbeats``), for a stopped job since when
    (``stopped_of``), and the nodes out by their health gate (``history.unhealthy_nodes``), when given."""
    state = snapshot.state
    if state is None:
        return None
    live = {n.info.node: n.info for n in snapshot.nodes}
    succeeded = (
        state.outcome(len(live)) is JobOutcome.SUCCEEDED
    )  # every participant's workers finished, keys gone or not
    done = {
        p.node for p in state.participants if succeeded or (p.node in live and live[p.node].finished_round(state.round))
    }
    views = [
        NodeView(p.node, p.group_rank, p.addr, p.local_world_size, p.node in live, p.node in done)
        for p in state.participants
    ]
    views = [_with_beats(v, (beats or {}).get(v.node), time.time() if now is None else now) for v in views]
    members = {p.node for p in state.participants}
    views += [
        NodeView(info.node, None, info.addr, info.local_world_size, True)
        for node, info in sorted(live.items())
        if node not in members
    ]
    return JobView(
        run_id=state.run_id,
        status=state.status.value,
        round=state.round,
        world_size=state.world,
        master_addr=state.master_addr,
        master_port=state.master_port,
        min_nodes=state.min_nodes,
        max_nodes=state.max_nodes,
        nodes=tuple(views),
        reason=state.reason,
        restarts=state.restarts,
        max_restarts=state.max_restarts,
        outcome=state.outcome(len(live)).value,
        stopped_since=stopped.since if stopped is not None else None,
        stopped_silent=stopped.silent if stopped is not None else 0,
        stalled_restarts=state.streak.stalled,
        unhealthy=unhealthy,
    )


def _with_beats(view: NodeView, summary: dict | None, now: float) -> NodeView:
    if summary is None or not view.alive or not isinstance(summary.get("oldest"), (int, float)):
        return view
    rank = summary.get("rank")
    return replace(
        view,
        heartbeat_age=round(max(now - float(summary["oldest"]), 0.0), 1),
        heartbeat_rank=rank if isinstance(rank, int) else None,
    )
