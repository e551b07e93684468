"""Joining a round: the one loop that does what ``join.join_step`` decides, as torch's op executor does.

Each turn syncs (the read or the watch's events since: a ``Snapshot``), asks the pure rule what to
do next, and applies that step: its op. Announcing a round, taking this node's place in a frozen
one, coordinating (``coordinate.RoundCoordinator``) and following the coordinator by watch are the
ops; the loop ends when an op returns this node's place in a frozen round. Nobody polls: a node
that waits, waits on a watch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rendezvous.errors import (
    LeaseNotFoundError,
    RendezvousClosedError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from rendezvous.etcd.client import EtcdClient
from rendezvous.job.history import RERUN, Event
from rendezvous.job.keys import JobKeys
from rendezvous.job.ranktable import Placement, read_placement
from rendezvous.job.state import JobState, JobStatus
from rendezvous.job.store import JobStateStore
from rendezvous.settings import RendezvousSettings

from .coordinate import RoundCoordinator
from .decide import joined
from .ending import rerun_refused
from .join import (
    Announce,
    Closed,
    Coordinate,
    Follow,
    Frozen,
    ReadAll,
    RendezvousInfo,
    join_step,
    target_round,
    waits_as_spare,
)
from .member import Member
from .snapshot import Handover, RoundFollower, Snapshot, read_nodes, read_round

__all__ = ["JoinLoop", "Joined", "closed_error"]


class _Stale(Exception):
    """The rank table named by the state read is gone: a later round replaced it; read again."""


@dataclass(frozen=True)
class Joined:
    """This node's place in the frozen round, and the watch it joined on (to follow the round with)."""

    info: RendezvousInfo
    handover: Handover | None  # for the round's monitor


def closed_error(
    keys: JobKeys, state: JobState, endpoints: str, *, while_waiting: bool = False, refused: str = ""
) -> RendezvousClosedError:
    """The job is closed. ``while_waiting``: it closed while this node waited in a round of it (a hot
    spare never needed), not before this node came; ``refused``: why this launch runs no new run of
    it. The command it suggests can be pasted as printed."""
    reason = f" ({state.reason})" if state.reason else ""
    why = f", and this launch starts no new run of it: {refused}" if refused else ""
    error = RendezvousClosedError(
        f"rendezvous '{keys.run_id}' is closed{reason}{why}; start the job with a new --rdzv-id, or reuse this one "
        f"after `{keys.ctl('reset', endpoints)}` (its keys also expire by themselves: "
        f"`{keys.ctl('list', endpoints, job=False)}`)"
    )
    error.while_waiting = while_waiting
    return error


class JoinLoop:
    """One call of ``RendezvousHandler.next_rendezvous``: from the state last seen to a place in a round."""

    def __init__(
        self,
        client: EtcdClient,
        settings: RendezvousSettings,
        keys: JobKeys,
        member: Member,
        coordinator: RoundCoordinator,
        clock: Callable[[], float] = time.monotonic,
        on_spare: Callable[[], None] | None = None,
        launched_at: float | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``on_spare()``: called once, when this node first waits while a round runs without it (a spare).
        ``launched_at``: when this node's agent was launched (wall clock), on its first join only: a
        closed job it finds then runs again (``rerun_refused`` says when not)."""
        self._launched_at, self._wall = launched_at, wall_clock
        self._client, self._settings, self._keys = client, settings, keys
        self._on_spare = on_spare
        self._member = member
        self._coordinator = coordinator
        self._clock = clock
        self._store = JobStateStore(client, keys)
        self.target: int | None = None  # the round being joined (for progress lines)
        self._deadline: float | None = None
        self._ops = {
            Closed: self._closed,
            Frozen: self._frozen,
            Announce: self._announce,
            ReadAll: self._read_all,
            Coordinate: self._coordinate,
            Follow: self._follow,
        }

    @property
    def _endpoints(self) -> str:
        return ",".join(str(endpoint) for endpoint in self._client.endpoints)

    @property
    def timeout_in(self) -> float | None:
        """Seconds until this join's join_timeout (None when not joining)."""
        return None if self._deadline is None or self.target is None else max(self._deadline - self._clock(), 0.0)

    def run(self, seen: JobState | None, kept: tuple | None) -> Joined:
        """Join the round after ``seen`` (None: read it), on the watch ``kept`` from the last round if any.

        Raises RendezvousClosedError (job closed), RendezvousTimeoutError (join_timeout passed),
        RendezvousConnectionError (etcd unreachable), RendezvousStateError (corrupt state).
        """
        self._coordinator.start(self._clock())
        self._deadline = self._clock() + self._settings.join_timeout
        if seen is None:
            seen = self._first_look()
        if seen is not None and seen.status is JobStatus.CLOSED:
            raise closed_error(self._keys, seen, self._endpoints)
        self.target = target_round(seen)
        self._current: Snapshot | None = self._member.announce(self.target)
        self._read_all = False
        self._follower = RoundFollower(self._client, self._keys, watch=kept[0] if kept else None)
        try:
            while True:
                snapshot = self._sync()
                self._tell_spare(snapshot.state)
                step = join_step(
                    snapshot.state,
                    self.target,
                    self._member.node_id,
                    coordinator=snapshot.coordinator,
                    all_nodes=snapshot.all_nodes,
                    lease_alive=self._member.alive,
                )
                joined_round = self._ops[type(step)](step, snapshot)
                if joined_round is not None:
                    return joined_round
        finally:
            self.target = None
            self._follower.close()

    def _sync(self) -> Snapshot:
        """What the last op left (a write's read, the watch's events), else a read."""
        snapshot, self._current = self._current, None
        if snapshot is not None:
            return snapshot
        try:
            return read_round(self._client, self._keys, all_nodes=self._read_all, claim=self._member.claim())
        except LeaseNotFoundError:  # this node's lease ended under it: the next step announces on a new one
            self._member.lease_ended()
            return read_round(self._client, self._keys, all_nodes=self._read_all)

    def _tell_spare(self, state: JobState | None) -> None:
        if self._on_spare is not None and waits_as_spare(state, self.target):
            self._on_spare()
            self._on_spare = None  # once a join

    # -- the ops: each returns this node's place once it has one, else None (the loop goes on) --------
    def _first_look(self) -> JobState | None:
        """The state the join starts from: on a first join, a closed job's is cleared for a new run
        of its id (None: no state), once no node of the old run is alive -- waited for until the
        join timeout -- unless ``rerun_refused`` says this launch may not (RendezvousClosedError)."""
        while True:
            snapshot = read_round(self._client, self._keys, all_nodes=False)  # no node keys: O(1) a join
            closed = snapshot.state
            if self._launched_at is None or closed is None or closed.status is not JobStatus.CLOSED:
                return closed
            live = self._client.count_prefix(self._keys.nodes)  # a new run's first node counted: read again
            refused = rerun_refused(closed, self._launched_at, live)
            if refused is None:
                record = Event(self._wall(), closed.round, self._member.node_id, RERUN, {"closed": closed.reason})
                if self._store.rerun(closed, snapshot.token, record):
                    return None
                continue  # another node of this launch cleared it first: read again
            if not refused[1] or (self._deadline is not None and self._clock() >= self._deadline):
                raise closed_error(self._keys, closed, self._endpoints, refused=refused[0])
            time.sleep(0.5)  # an agent of the old run still exits (or its lease runs out)

    def _closed(self, step: Closed, snapshot: Snapshot) -> None:
        raise closed_error(self._keys, snapshot.state, self._endpoints, while_waiting=True)

    def _frozen(self, step: Frozen, snapshot: Snapshot) -> Joined | None:
        """This node's place in the frozen round; the next round when it froze without this node;
        a new read when its table was replaced."""
        try:
            placement = self._place(snapshot)
        except _Stale:
            return None
        if placement is None:
            return self._announce(Announce(snapshot.state.round + 1), snapshot)
        return Joined(self._completed(snapshot.state, placement), self._handover(snapshot))

    def _announce(self, step: Announce, snapshot: Snapshot) -> None:
        self.target = step.round
        self._current = self._member.announce(step.round)

    def _read_all(self, step: ReadAll, snapshot: Snapshot) -> None:
        self._read_all = True

    def _coordinate(self, step: Coordinate, snapshot: Snapshot) -> None:
        self._read_all = True
        wake_at = self._coordinator.step(snapshot, self.target)
        if wake_at is not None:  # None: it wrote the state (or lost the race): read it back
            self._wait(snapshot, "", min(self._deadline, wake_at))

    def _follow(self, step: Follow, snapshot: Snapshot) -> None:
        self._read_all = False
        self._wait(snapshot, step.leader, self._deadline)

    def _wait(self, snapshot: Snapshot, leader: str, until: float) -> None:
        """Wait by watch until something changes or ``until``; past the join timeout, give up."""
        if self._clock() >= self._deadline:
            raise self._timeout()
        self._current = self._follower.next(snapshot, leader, max(until - self._clock(), 0.0))

    # -- taking a place --------------------------------------------------------------------------------
    def _place(self, snapshot: Snapshot) -> Placement | None:
        """This node's row in the frozen round (None: the round froze without it)."""
        state = snapshot.state
        if (
            state.participants and state.size == 1
        ):  # the coordinator read the whole table (a row with peers: its watch list)
            me = state.participant(self._member.node_id)
            if me is None:
                return None
            return Placement(me, sum(p.local_world_size for p in state.participants if p.group_rank < me.group_rank))
        try:
            return read_placement(self._client, self._keys, state, self._member.node_id)
        except RendezvousStateError:
            if self._store.read()[1] == snapshot.token:
                raise  # the state still names it: the table is broken, not replaced
            raise _Stale from None

    def _completed(self, state: JobState, me: Placement) -> RendezvousInfo:
        self._member.placed()
        return RendezvousInfo(
            run_id=self._keys.run_id,
            round=state.round,
            node=self._member.node_id,
            group_rank=me.participant.group_rank,
            group_world_size=state.size,
            master_addr=state.master_addr,
            master_port=state.master_port,
            world_size=state.world,
            base_global_rank=me.base_rank,
            restart_count=state.restarts,
            max_restarts=state.max_restarts,
            watch=me.watch,
            min_nodes=state.min_nodes,
            max_nodes=state.max_nodes,
            streak=state.streak,
        )

    def _handover(self, snapshot: Snapshot) -> Handover | None:
        """The join's watch and what it showed, for the round's monitor to go on with."""
        kept = self._follower.detach()
        return Handover(*kept, snapshot) if kept is not None else None

    def _timeout(self) -> RendezvousTimeoutError:
        nodes, _ = read_nodes(self._client, self._keys)
        count = len(joined(nodes, self.target))
        s = self._settings
        return RendezvousTimeoutError(
            f"rendezvous '{s.run_id}' timed out after {s.join_timeout:g}s waiting for round "
            f"{self.target}: {count} of {s.min_nodes} required nodes joined "
            f"(min {s.min_nodes}, max {s.max_nodes})"
        )
