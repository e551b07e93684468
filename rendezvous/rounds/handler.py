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
from collections.abc import Callable

from rendezvous.errors import (
    LeaseNotFoundError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.ports import free_port
from rendezvous.etcd.session import Session
from rendezvous.etcd.txn import op_put
from rendezvous.job.history import HistoryWriter
from rendezvous.job.keys import JobKeys
from rendezvous.job.ranktable import Placement, read_placement
from rendezvous.job.state import JobState, JobStatus, NodeInfo
from rendezvous.job.store import GaveUp, JobStateStore, StateUnchanged
from rendezvous.settings import RendezvousSettings

from .coordinate import RoundCoordinator
from .decide import closed_state, joined
from .join import (
    Announce,
    Closed,
    Coordinate,
    Follow,
    Frozen,
    Progress,
    ReadAll,
    RendezvousInfo,
    join_step,
    target_round,
)
from .membership import RoundFollower, Snapshot, read_nodes, read_round
from .monitor import JobMonitor

__all__ = ["RendezvousHandler", "RendezvousInfo", "Progress", "LeaseStatus", "default_node_id"]


class _Stale(Exception):
    """The rank table named by the state read is gone: a later round replaced it; read again."""


def default_node_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class LeaseStatus:
    """This node's lease as the fence sees it (before the first round: no lease, nothing overdue)."""

    def __init__(self, session: Session | None) -> None:
        self._session = session

    def overdue(self) -> bool:
        """No renewal past the renew deadline (now, or since ``handled``): the workers must stop,
        since the lease may expire and the others may start a round without this node."""
        return self._session is not None and self._session.overdue()

    def handled(self) -> None:
        """The fence was carried out: that missed deadline is forgotten."""
        if self._session is not None:
            self._session.clear_overdue()

    def silent_for(self) -> float:
        """Seconds since the last acknowledged renewal was sent."""
        return self._session.silent_for() if self._session is not None else 0.0

    @property
    def lease_id(self) -> int:
        """The lease this node's keys live on (0 before the first round)."""
        return self._session.lease_id if self._session is not None else 0

    def lost(self) -> bool:
        """etcd said the lease is gone (unreachable past the TTL): this node is no longer a member."""
        return self._session is not None and self._session.lost.is_set()


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
        history: HistoryWriter | None = None,
        on_renew: Callable[[int, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``history``: where the coordinator records the rounds it froze. ``on_renew(lease id, fence
        deadline)`` is called after every acknowledged lease renewal, from the stream loop's thread
        (the agent hands it to the process that enforces the deadline)."""
        self._client = client
        self.settings = settings
        self._keys = JobKeys(settings.key_prefix, settings.run_id)
        self._store = JobStateStore(client, self._keys)
        self.node_id = node_id or default_node_id()
        self.local_addr = local_addr or socket.getfqdn()
        self.local_world_size = local_world_size
        self.max_restarts = max_restarts  # this agent's; the job's is the first agent's, kept in the state
        self._history = history
        self._on_renew = on_renew
        self._failure: tuple[int, str] | None = None  # (round, what failed): ask the next round for a restart
        self._clock = clock
        self._wall = wall_clock
        self._session: Session | None = None
        self._monitor: JobMonitor | None = None
        self._info: RendezvousInfo | None = None
        self._forming: int | None = None  # the round next_rendezvous is waiting for
        self._coordinator = RoundCoordinator(
            client, settings, self._keys, max_restarts=max_restarts, history=history, clock=clock, wall_clock=wall_clock
        )

    # -- the torch-shaped surface -----------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.settings.run_id

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and wait until it freezes; returns this node's place in it.

        Each turn reads (or follows by watch) the state and who coordinates, and carries out what
        ``join.join_step`` decides. Raises RendezvousClosedError (job closed), RendezvousTimeoutError
        (join_timeout passed), RendezvousConnectionError (etcd unreachable), RendezvousStateError
        (corrupt state).
        """
        # The running round's monitor has just seen the state that ends it: no read needed to start.
        seen = self._monitor.state if self._monitor is not None else None
        kept = self._monitor.detach() if self._monitor is not None else None  # its watch goes on
        self._stop_monitor()
        self._coordinator.start(self._clock())
        deadline = self._clock() + self.settings.join_timeout
        if seen is None:
            seen = read_round(self._client, self._keys, all_nodes=False).state
        if seen is not None and seen.status is JobStatus.CLOSED:
            raise self._closed(seen)
        target = target_round(seen)
        current: Snapshot | None = self._announce(target)
        follower = RoundFollower(self._client, self._keys, watch=kept[0] if kept else None)
        read_all = False
        try:
            while True:
                self._forming = target
                snapshot = current or read_round(self._client, self._keys, all_nodes=read_all, claim=self._claim())
                current = None
                step = join_step(
                    snapshot.state,
                    target,
                    self.node_id,
                    coordinator=snapshot.coordinator,
                    all_nodes=snapshot.all_nodes,
                    lease_alive=self._session_alive(),
                )
                if isinstance(step, Closed):
                    raise self._closed(snapshot.state)
                if isinstance(step, Frozen):
                    step = self._take_place(snapshot, follower)
                    if isinstance(step, RendezvousInfo):
                        return step
                if isinstance(step, Announce):
                    target, current = step.round, self._announce(step.round)
                if isinstance(step, (Announce, Frozen)):
                    continue
                read_all = isinstance(step, (ReadAll, Coordinate))
                until = deadline
                if isinstance(step, ReadAll):
                    continue
                if isinstance(step, Coordinate):
                    wake_at = self._coordinator.step(snapshot, target)
                    if wake_at is None:
                        continue  # we wrote the state (or lost the race): read it back
                    until = min(until, wake_at)
                if self._clock() >= deadline:
                    raise self._timeout(target)
                leader = step.leader if isinstance(step, Follow) else ""
                current = follower.next(snapshot, leader, max(until - self._clock(), 0.0))
        finally:
            self._forming = None
            follower.close()

    def is_closed(self) -> bool:
        state, _ = self._store.read()
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

        def close(state: JobState | None) -> JobState:
            if state is not None and state.status is JobStatus.CLOSED:
                raise StateUnchanged
            if state is None:  # closed before any round was written
                state = JobState(
                    run_id=self.run_id,
                    round=0,
                    status=JobStatus.JOINING,
                    min_nodes=self.settings.min_nodes,
                    max_nodes=self.settings.max_nodes,
                    max_restarts=self.max_restarts,
                )
            return closed_state(
                state, reason, failed=failed, min_nodes=self.settings.min_nodes, max_nodes=self.settings.max_nodes
            )

        try:
            self._store.update(close, tries=None, timeout=self.settings.close_timeout, what="close")
        except GaveUp:
            raise RendezvousTimeoutError(
                f"could not mark rendezvous '{self.run_id}' closed within the close timeout"
            ) from None

    def num_nodes_waiting(self) -> int:
        """Nodes that want to join and would fit: a reason for the agent to re-rendezvous."""
        monitor = self.round_monitor()
        return monitor.waiting if monitor is not None else 0

    def round_monitor(self) -> JobMonitor | None:
        """What this node follows of its round (brought up to date now); None before the first round."""
        monitor = self._ensure_monitor()
        if monitor is not None:
            monitor.poll()
        return monitor

    def membership_changed(self, timeout: float = 0.0) -> bool:
        """True as soon as a participant is gone, a node waits to join, or the job moved on.

        Waits up to ``timeout`` seconds for that, by watch; returns at once when it already is.
        etcd out of reach when the round's monitor is first set up is not a change: the renew
        deadline decides what an outage means (the fence), and the next look tries again.
        """
        try:
            monitor = self._ensure_monitor()
        except RendezvousConnectionError:
            return False
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

    @property
    def lease(self) -> LeaseStatus:
        """This node's lease, as the fence sees it."""
        return LeaseStatus(self._session)

    def job_state(self) -> JobState | None:
        """The job's state as this node's monitor last saw it, else as etcd has it now."""
        if self._monitor is not None:
            self._monitor.poll()
            if self._monitor.state is not None:
                return self._monitor.state
        return self._store.read()[0]

    def progress(self) -> Progress | None:
        """How the round this node is waiting for is forming (None when not waiting); reads etcd."""
        target = self._forming
        if target is None:
            return None
        state, _ = self._store.read()
        last_call_in, count = None, 0
        if state is not None and state.status is JobStatus.JOINING and state.round == target:
            count = state.joined  # as the coordinator last said: one small read, whatever the job's size
            if state.last_call_at is not None:
                last_call_in = max(state.last_call_at - self._wall(), 0.0)
        return Progress(target, count, self.settings.min_nodes, self.settings.max_nodes, last_call_in)

    def shutdown(self) -> bool:
        """Leave the job: revoke the lease so the others notice at once. Does NOT close the job."""
        self._stop_monitor(join=True)
        if self._session is not None:
            self._session.close()
            self._session = None
        return True

    # -- the steps ----------------------------------------------------------------------------------
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
                self._client,
                self.settings.lease_ttl,
                renew_deadline=self.settings.fence_after,
                interval=self.settings.renew_every,
                on_renew=self._renewed,
            )
        failed_round, failure = self._failure or (0, "")
        info = NodeInfo(
            node=self.node_id,
            round=round_,
            addr=self.local_addr,
            local_world_size=self.local_world_size,
            master_port=free_port("0.0.0.0"),
            finished=finished,
            failed_round=failed_round,
            failure=failure,
        )
        put = op_put(self._keys.node(self.node_id), info.encode(), lease=self._session.lease_id)
        try:
            return read_round(self._client, self._keys, all_nodes=False, put=put, claim=self._claim())
        except LeaseNotFoundError:
            self._session.lost.set()
            return self._announce(round_, finished=finished)

    def _renewed(self, lease_id: int, deadline: float) -> None:
        if self._on_renew is not None:
            self._on_renew(lease_id, deadline)

    def _claim(self) -> tuple[str, int] | None:
        """Who becomes the coordinator if nobody is: this node, on its lease (None: no live lease)."""
        return (self.node_id, self._session.lease_id) if self._session_alive() else None

    def _take_place(self, snapshot: Snapshot, follower: RoundFollower) -> RendezvousInfo | Announce | Frozen:
        """This node's place in the frozen round (following it from now on, on the join's watch);
        Announce when the round froze without it; Frozen again when its table was replaced (read again)."""
        try:
            placement = self._place(snapshot)
        except _Stale:
            return Frozen()
        if placement is None:
            return Announce(snapshot.state.round + 1)
        info = self._completed(snapshot.state, placement)
        self._start_monitor(follower.detach(), snapshot)
        return info

    def _place(self, snapshot: Snapshot) -> Placement | None:
        """This node's row in the frozen round (None: the round froze without it)."""
        state = snapshot.state
        if state.participants:  # the coordinator read the whole table
            me = state.participant(self.node_id)
            base = sum(
                p.local_world_size for p in state.participants if me is not None and p.group_rank < me.group_rank
            )
            return Placement(me, base) if me is not None else None
        try:
            return read_placement(self._client, self._keys, state, self.node_id)
        except RendezvousStateError:
            if self._store.read()[1] == snapshot.token:
                raise  # the state still names it: the table is broken, not replaced
            raise _Stale from None

    def _completed(self, state: JobState, me: Placement) -> RendezvousInfo:
        self._info = RendezvousInfo(
            run_id=self.run_id,
            round=state.round,
            node=self.node_id,
            group_rank=me.participant.group_rank,
            group_world_size=state.size,
            master_addr=state.master_addr,
            master_port=state.master_port,
            world_size=state.world,
            base_global_rank=me.base_rank,
            restart_count=state.restarts,
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

    def _closed(self, state: JobState) -> RendezvousClosedError:
        reason = f" ({state.reason})" if state.reason else ""
        return RendezvousClosedError(
            f"rendezvous '{self.run_id}' is closed{reason}; start the job with a new --rdzv-id, "
            f"or delete the key {self._keys.state} to reuse this one"
        )

    def _ensure_monitor(self, handover: tuple | None = None) -> JobMonitor | None:
        if self._monitor is None and self._info is not None:
            lease = self._session.lease_id if self._session_alive() else 0
            self._monitor = JobMonitor(
                self._client, self._keys, self._info.round, self.node_id, lease, handover=handover
            )
        return self._monitor

    def _start_monitor(self, kept: tuple | None, snapshot: Snapshot) -> None:
        """Follow the new round at once, on the watch the round was joined with (the coordinator
        keeps the round from now on); etcd out of reach now is no error -- the first look at the
        membership tries again."""
        try:
            self._ensure_monitor((*kept, snapshot) if kept is not None else None)
        except RendezvousConnectionError:
            if kept is not None:
                kept[0].close(wait=False)

    def _stop_monitor(self, join: bool = False) -> None:
        if self._monitor is not None:
            self._monitor.close(join=join)
            self._monitor = None
