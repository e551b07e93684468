"""The rendezvous rounds: join, last call, freeze, assign ranks, re-rendezvous.

Each agent writes only its own node key (``nodes/<node>``, on its lease) saying which round it wants.
The coordinator -- the live node key created first -- decides the round with ``decide.decide`` and
writes ``state`` by compare-and-swap; everyone else waits on a watch of ``state`` (and of the
coordinator's node key, in case it dies). Nobody polls.
"""

from __future__ import annotations

import socket
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from .backend import EtcdRendezvousBackend
from .client import EtcdClient
from .txn import op_put
from .decide import Freeze, closed_state, decide, frozen_state, job_budget, joined, restart_count
from .history import HistoryWriter
from .errors import LeaseNotFoundError, RendezvousClosedError, RendezvousError, RendezvousTimeoutError
from .ports import free_port
from .membership import JobKeys, JobMonitor, Snapshot, apply_round_events, read_nodes, read_round
from .session import Session
from .settings import RendezvousSettings
from .state import JobState, JobStatus, NodeInfo, Participant
from .watch import KeyRange, Watch

__all__ = ["RendezvousHandler", "RendezvousInfo", "Progress", "default_node_id"]


@dataclass(frozen=True)
class RendezvousInfo:
    """What a node learns from a completed round."""

    run_id: str
    round: int
    node: str
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    participants: tuple[Participant, ...]
    restart_count: int = 0  # the job's restart count (TORCHELASTIC_RESTART_COUNT of every worker)
    max_restarts: int = 0  # the job's budget (TORCHELASTIC_MAX_RESTARTS)

    @property
    def world_size(self) -> int:
        """Workers in the whole job: the sum of every node's local world size."""
        return sum(p.local_world_size for p in self.participants)

    @property
    def base_global_rank(self) -> int:
        """The global rank of this node's local rank 0."""
        return sum(p.local_world_size for p in self.participants if p.group_rank < self.group_rank)


@dataclass(frozen=True)
class Progress:
    """How a forming round looks from here, for a progress line."""

    round: int
    nodes_joined: int
    min_nodes: int
    max_nodes: int
    last_call_in: float | None  # seconds until the coordinator freezes the round, if known


def default_node_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class RendezvousHandler:
    """One agent's side of a job's rendezvous on etcd v3."""

    def __init__(
        self,
        client: EtcdClient,
        settings: RendezvousSettings,
        *,
        local_addr: str | None = None,
        local_world_size: int = 1,
        node_id: str | None = None,
        max_restarts: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self.settings = settings
        self._keys = JobKeys(settings.key_prefix, settings.run_id)
        self._backend = EtcdRendezvousBackend(client, settings.run_id, settings.key_prefix)
        self.node_id = node_id or default_node_id()
        self.local_addr = local_addr or socket.getfqdn()
        self.local_world_size = local_world_size
        self.max_restarts = max_restarts  # this agent's; the job's is the first agent's, kept in the state
        self._failure: tuple[int, str] | None = None  # (round, what failed): ask the next round for a restart
        self._clock = clock
        self._wall = wall_clock
        self._session: Session | None = None
        self._monitor: JobMonitor | None = None
        self._info: RendezvousInfo | None = None
        self._forming: int | None = None  # the round next_rendezvous is waiting for
        self._last_call_start: float | None = None
        # Called with (lease id, fence deadline) after every acknowledged lease renewal, from the
        # stream loop's thread: the agent hands it to the process that enforces the deadline.
        self.on_renew: Callable[[int, float], None] | None = None
        self.history: HistoryWriter | None = None  # where the coordinator records the rounds it froze
        self._joining_since = clock()

    # -- the torch-shaped surface -----------------------------------------------------------------
    def get_backend(self) -> str:
        return self._backend.name

    @property
    def client(self) -> EtcdClient:
        return self._client

    @property
    def job_root(self) -> str:
        """``<prefix>/<run_id>/``: every key of the job is under it."""
        return self._keys.root

    @property
    def run_id(self) -> str:
        return self.settings.run_id

    @property
    def info(self) -> RendezvousInfo | None:
        """The last round this node took part in."""
        return self._info

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and wait until it freezes; returns this node's place in it.

        Raises RendezvousClosedError (job closed), RendezvousTimeoutError (join_timeout passed),
        RendezvousConnectionError (etcd unreachable), RendezvousStateError (corrupt state).
        """
        self._stop_monitor()
        self._joining_since = self._clock()
        deadline = self._clock() + self.settings.join_timeout
        snapshot = read_round(self._client, self._keys, all_nodes=False)
        self._raise_if_closed(snapshot.state)
        target = self._target_round(snapshot.state)
        current: Snapshot | None = self._announce(target)
        self._last_call_start = None
        watch: Watch | None = None
        watching: str | None = None  # whom the watch follows: "" for the coordinator's own watch
        read_all = False
        try:
            while True:
                self._forming = target
                snapshot = current or read_round(self._client, self._keys, all_nodes=read_all)
                current = None
                state = snapshot.state
                self._raise_if_closed(state)
                if state is not None and state.status is JobStatus.RUNNING and state.round >= target:
                    me = state.participant(self.node_id)
                    if me is not None:
                        return self._completed(state, me)
                    target = state.round + 1  # the round froze without us: wait for the next one
                    current = self._announce(target)
                    continue
                if state is not None and state.status is JobStatus.JOINING and state.round > target:
                    target = state.round
                    current = self._announce(target)
                    continue
                if not self._session_alive():
                    current = self._announce(target)
                    continue
                coordinating = snapshot.coordinator == self.node_id
                read_all = coordinating
                if coordinating and not snapshot.all_nodes:
                    continue  # the coordinator reads every node before deciding
                until = deadline
                if coordinating:
                    wake_at = self._coordinate(snapshot, target)
                    if wake_at is None:
                        continue  # we wrote the state (or lost the race): read it back
                    until = min(until, wake_at)
                now = self._clock()
                if now >= deadline:
                    raise self._timeout(target)
                leader = "" if coordinating else snapshot.coordinator or ""
                if watch is None or watching != leader:
                    if watch is not None:
                        watch.close()
                    watch, watching = self._watch_round(snapshot.revision, leader), leader
                event = watch.get(timeout=max(until - now, 0.0))
                # What the watch carried is enough, unless the coordinator changed or history was lost.
                current = snapshot if event is None else apply_round_events(self._keys, snapshot, [event, *watch.drain()])
        finally:
            self._forming = None
            if watch is not None:
                watch.close()

    def is_closed(self) -> bool:
        state = self._backend_state()
        return state is not None and state.status is JobStatus.CLOSED

    def request_restart(self, failure: str) -> None:
        """This node's workers of the current round failed: the next round it joins restarts the
        group and advances the job's restart count (once, whichever nodes ask)."""
        if self._info is None:
            raise RendezvousError("request_restart() needs a completed round")
        self._failure = (self._info.round, failure)

    def set_closed(self, reason: str = "the job ended", *, failed: bool = False) -> None:
        """Mark the job closed: every agent of it stops, and the run id cannot be joined again.

        ``failed``: a worker failed with no restart left, so every agent exits as failed.
        """
        deadline = self._clock() + self.settings.close_timeout
        while True:
            current = self._backend.get_state()
            token = current[1] if current else None
            state = JobState.decode(current[0]) if current else None
            if state is not None and state.status is JobStatus.CLOSED:
                return
            if state is None:  # closed before any round was written
                state = JobState(run_id=self.run_id, round=0, status=JobStatus.JOINING, min_nodes=self.settings.min_nodes,
                                 max_nodes=self.settings.max_nodes, max_restarts=self.max_restarts)
            closed = closed_state(state, reason, failed=failed, min_nodes=self.settings.min_nodes,
                                  max_nodes=self.settings.max_nodes)
            result = self._backend.set_state(closed.encode(), token)
            if result is not None and result[2]:
                return
            if self._clock() > deadline:
                raise RendezvousTimeoutError(f"could not mark rendezvous '{self.run_id}' closed within the close timeout")

    def num_nodes_waiting(self) -> int:
        """Nodes that want to join and would fit: a reason for the agent to re-rendezvous."""
        return self._watched("waiting", 0)

    def lost_participants(self) -> list[str]:
        """Participants of this node's round whose agent is gone (their lease ended)."""
        return self._watched("lost", [])

    def membership_changed(self, timeout: float = 0.0) -> bool:
        """True as soon as a participant is gone, a node waits to join, or the job moved on.

        Waits up to ``timeout`` seconds for that, by watch; returns at once when it already is.
        """
        monitor = self._ensure_monitor()
        if monitor is None:
            return False
        if not self._session_alive():
            return True
        return monitor.wait(timeout)

    def finish(self) -> None:
        """Tell the others that this node's workers of the current round all succeeded."""
        if self._info is None:
            raise RendezvousError("finish() needs a completed round")
        self._announce(self._info.round, finished=True)

    def all_finished(self, timeout: float = 0.0) -> bool:
        """True once every participant of this node's round has finished (waits up to ``timeout``)."""
        monitor = self._ensure_monitor()
        if monitor is None:
            return False
        deadline = self._clock() + timeout
        while True:
            monitor.poll()
            if monitor.finished:
                return True
            if monitor.moved_on or monitor.lost:
                return False
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            monitor.next_event(remaining)

    def wait_for_etcd(self, timeout: float | None = None, report: Callable[[str], None] | None = None) -> None:
        """Block until etcd serves this job's keys, up to ``connect_timeout`` (RendezvousConnectionError after)."""
        self._client.wait_ready(self._keys.state, self.settings.connect_timeout if timeout is None else timeout, report)

    def fence_due(self) -> bool:
        """This node went without a lease renewal past the renew deadline (now or since ``fence_handled``):
        its workers must stop, since the lease may expire and the others may start a round without it."""
        return self._session is not None and self._session.overdue()

    def fence_handled(self) -> None:
        if self._session is not None:
            self._session.clear_overdue()

    def silent_for(self) -> float:
        """Seconds since the last acknowledged lease renewal was sent."""
        return self._session.silent_for() if self._session is not None else 0.0

    def failures_reported(self) -> list[str]:
        """What the nodes asking to restart this node's round said failed."""
        return self._watched("failures", [])

    def newcomers(self) -> list[str]:
        """Nodes waiting to join that do not take part in this node's round."""
        return self._watched("newcomers", [])

    def job_state(self) -> JobState | None:
        """The job's state as this node's monitor last saw it, else as etcd has it now."""
        if self._monitor is not None:
            self._monitor.poll()
            if self._monitor.state is not None:
                return self._monitor.state
        return self._backend_state()

    def lease_lost(self) -> bool:
        """This agent's own lease ended (etcd unreachable past the TTL): it is no longer a member."""
        return self._session is not None and self._session.lost.is_set()

    def progress(self) -> Progress | None:
        """How the round this node is waiting for is forming (None when not waiting); reads etcd."""
        target = self._forming
        if target is None:
            return None
        state = self._backend_state()
        last_call_in = None
        if state is not None and state.status is JobStatus.JOINING and state.last_call_at is not None:
            last_call_in = max(state.last_call_at - self._wall(), 0.0)
        return Progress(target, self._count_joined(target), self.settings.min_nodes, self.settings.max_nodes, last_call_in)

    def shutdown(self) -> bool:
        """Leave the job: revoke the lease so the others notice at once. Does NOT close the job."""
        self._stop_monitor()
        if self._session is not None:
            self._session.close()
            self._session = None
        return True

    # -- the steps ----------------------------------------------------------------------------------
    def _target_round(self, state: JobState | None) -> int:
        if state is None:
            return 1
        if state.status is JobStatus.JOINING:
            return state.round
        return state.round + 1

    def _session_alive(self) -> bool:
        return self._session is not None and self._session.alive

    def _announce(self, round_: int, *, finished: bool = False) -> Snapshot:
        """Write (or rewrite) this node's key asking for ``round_``, on a live lease.

        Returns what the same transaction read: the state and the coordinator, right after the write.
        """
        if not self._session_alive():
            if self._session is not None:
                self._session.close(timeout=0.5)
            self._session = Session(
                self._client, self.settings.lease_ttl, renew_deadline=self.settings.fence_after,
                interval=self.settings.renew_every, on_renew=self._renewed,
            )
        failed_round, failure = self._failure or (0, "")
        info = NodeInfo(
            node=self.node_id, round=round_, addr=self.local_addr, local_world_size=self.local_world_size,
            master_port=free_port("0.0.0.0"), finished=finished, failed_round=failed_round, failure=failure,
        )
        put = op_put(self._keys.node(self.node_id), info.encode(), lease=self._session.lease_id)
        try:
            return read_round(self._client, self._keys, all_nodes=False, put=put)
        except LeaseNotFoundError:
            self._session.lost.set()
            return self._announce(round_, finished=finished)

    def _record_freeze(self, before: JobState | None, frozen: JobState) -> None:
        """The coordinator's history of a round it froze: who joined, who left, a restart, the round."""
        if self.history is None:
            return
        previous = {p.node for p in before.participants} if before is not None else set()
        now = {p.node for p in frozen.participants}
        for node in sorted(now - previous):
            self.history.record("node_joined", frozen.round, node=node)
        for node in sorted(previous - now):
            self.history.record("node_left", frozen.round, node=node, reason="not in the new round (its lease ended)")
        if before is not None and frozen.restarts > before.restarts:
            self.history.record("group_restarted", frozen.round, restart_count=frozen.restarts,
                                max_restarts=frozen.max_restarts)
        self.history.record("round_frozen", frozen.round, world_size=frozen.world_size,
                            nodes=[p.node for p in frozen.participants],
                            formed_in=round(self._clock() - self._joining_since, 3))

    def _renewed(self, lease_id: int, deadline: float) -> None:
        if self.on_renew is not None:
            self.on_renew(lease_id, deadline)

    def _coordinate(self, snapshot: Snapshot, target: int) -> float | None:
        """Decide the round. Returns None after a write, else when to look again (inf: on a change)."""
        state = snapshot.state
        previous = state if state is not None and state.participants else None
        decision = decide(
            previous, snapshot.nodes, target,
            min_nodes=self.settings.min_nodes, max_nodes=self.settings.max_nodes,
            last_call_timeout=self.settings.last_call_timeout, last_call_start=self._last_call_start,
            now=self._clock(),
        )
        if isinstance(decision, Freeze):
            frozen = frozen_state(
                self.run_id, target, decision.participants, snapshot.nodes, self.settings.min_nodes,
                self.settings.max_nodes, restarts=restart_count(state, snapshot.nodes, target),
                max_restarts=job_budget(state, self.max_restarts),
            )
            if self._backend.set_state(frozen.encode(), snapshot.token)[2]:
                self._record_freeze(state, frozen)
            return None
        self._last_call_start = decision.last_call_start
        last_call_at = None
        if decision.until is not None:
            last_call_at = round(self._wall() + (decision.until - self._clock()), 3)
        announced = state is not None and state.status is JobStatus.JOINING and state.round == target
        if not announced or (last_call_at is None) != (state.last_call_at is None):
            # Tell everyone a round is forming, and when its last call ends (for progress lines).
            forming = JobState(
                run_id=self.run_id, round=target, status=JobStatus.JOINING, min_nodes=self.settings.min_nodes,
                max_nodes=self.settings.max_nodes, participants=state.participants if state else (),
                master_addr=state.master_addr if state else "", master_port=state.master_port if state else 0,
                last_call_at=last_call_at, restarts=state.restarts if state else 0,
                max_restarts=job_budget(state, self.max_restarts),
            )
            self._backend.set_state(forming.encode(), snapshot.token)
            return None
        return float("inf") if decision.until is None else decision.until

    def _watch_round(self, revision: int, leader: str) -> Watch:
        """The coordinator (``leader`` "") hears the state and every node change; a follower the
        state and the deletion of the coordinator's key, which may make it the coordinator.

        A follower watching one key rather than the nodes prefix keeps etcd's work per node change
        constant: with K followers on the prefix, every join would be matched against K watchers.
        """
        if not leader:
            nodes = KeyRange(self._keys.nodes, prefix=True)
        else:
            nodes = KeyRange(self._keys.node(leader), deletes_only=True)
        return Watch(self._client, KeyRange(self._keys.state), nodes, start_revision=revision + 1)

    def _completed(self, state: JobState, me: Participant) -> RendezvousInfo:
        self._info = RendezvousInfo(
            run_id=self.run_id, round=state.round, node=self.node_id, group_rank=me.group_rank,
            group_world_size=len(state.participants), master_addr=state.master_addr,
            master_port=state.master_port, participants=state.participants, restart_count=state.restarts,
            max_restarts=state.max_restarts,
        )
        self._failure = None
        return self._info

    def _count_joined(self, target: int) -> int:
        nodes, _ = read_nodes(self._client, self._keys)
        return len(joined(nodes, target))

    def _timeout(self, target: int) -> RendezvousTimeoutError:
        count = self._count_joined(target)
        return RendezvousTimeoutError(
            f"rendezvous '{self.run_id}' timed out after {self.settings.join_timeout:g}s waiting for round "
            f"{target}: {count} of {self.settings.min_nodes} required nodes joined "
            f"(min {self.settings.min_nodes}, max {self.settings.max_nodes})"
        )

    def _raise_if_closed(self, state: JobState | None) -> None:
        if state is not None and state.status is JobStatus.CLOSED:
            reason = f" ({state.reason})" if state.reason else ""
            raise RendezvousClosedError(
                f"rendezvous '{self.run_id}' is closed{reason}; start the job with a new --rdzv-id, "
                f"or delete the key {self._keys.state} to reuse this one"
            )

    def _backend_state(self) -> JobState | None:
        current = self._backend.get_state()
        return JobState.decode(current[0], f"job state at {self._keys.state}") if current else None

    def _watched(self, name: str, default):
        """What this node's monitor knows now about its round (``default`` before the first round)."""
        monitor = self._ensure_monitor()
        if monitor is None:
            return default
        monitor.poll()
        return getattr(monitor, name)

    def _ensure_monitor(self) -> JobMonitor | None:
        if self._monitor is None and self._info is not None:
            self._monitor = JobMonitor(self._client, self._keys, self._info.round)
        return self._monitor

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None

