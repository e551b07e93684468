"""One agent's side of a job's rendezvous: the torch-shaped handler over the round protocol.

Each agent writes only its own node key (``member``), saying which round it wants. The coordinator
-- the holder of the ``coordinator`` key, an election on its lease (``membership.coordinator_election``)
-- decides the round (``decide``) and writes ``state`` by compare-and-swap (``coordinate``);
everyone else waits on a watch of ``state`` and of the coordinator key's deletion (``joining``).
Once a round runs, one monitor a node follows it (``monitor``). Nobody polls.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import replace

from rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
)
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.version import server_version, version_line
from rendezvous.job.history import HistoryWriter
from rendezvous.job.keys import JobKeys
from rendezvous.job.progress import RoundProgress
from rendezvous.job.state import FailureKind, JobState, JobStatus, Keep
from rendezvous.job.store import GaveUp, JobStateStore, StateUnchanged
from rendezvous.settings import RendezvousSettings

from .coordinate import RoundCoordinator, progress_every
from .decide import closed_state, silent_after, silent_nodes
from .ending import Ending, closed_finished, ending_after, newcomer_round, newcomers
from .join import Progress, RendezvousInfo, progress_of
from .joinloop import JoinLoop
from .member import Identity, LeaseStatus, Member, default_node_id
from .monitor import JobMonitor
from .snapshot import Handover, read_round

__all__ = ["RendezvousHandler", "RendezvousInfo", "Progress", "LeaseStatus", "default_node_id"]


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
        master_port: Callable[[], int] | None = None,
        probe: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        launched_at: float | None = None,
        own_etcd: bool = False,
    ) -> None:
        """``history``: where the coordinator records the rounds it froze. ``on_renew(lease id, fence
        deadline)`` is called after every acknowledged lease renewal, from the stream loop's thread
        (the agent hands it to the process that enforces the deadline). ``master_port()``: the port
        this node offers for the round's store each time it joins a round (default: a free one).
        ``probe``: host:port where this node's agent answers its peers' probes ("": it does not).
        ``launched_at``: when this node's agent was launched (wall clock; default: now): a closed job
        its first join finds runs again when the job closed after that (``ending.rerun_refused``).
        ``own_etcd``: the etcd is one this node started for the job, whose version is not said."""
        self._client = client
        self._version_said = own_etcd  # the etcd's version is looked at once, when it first answers
        self.settings = settings
        self._keys = JobKeys(settings.key_prefix, settings.run_id)
        self._store = JobStateStore(client, self._keys)
        identity = Identity(node_id or default_node_id(), local_addr or socket.getfqdn(), local_world_size, probe)
        self._member = Member(client, settings, self._keys, identity, on_renew, master_port)
        self.max_restarts = max_restarts  # this agent's; the job's is the first agent's, kept in the state
        self._clock = clock
        self._wall = wall_clock
        self._launched_at: float | None = launched_at if launched_at is not None else wall_clock()
        self._monitor: JobMonitor | None = None
        self._info: RendezvousInfo | None = None
        self._join: JoinLoop | None = None  # the last (or running) join, for progress lines
        self._joined_at, self._coordinator_read_at = self._clock(), float("-inf")  # when it began; its last look
        self._coordinator_silent: tuple[str, float] | None = None  # (node, its lease runs out at), for progress
        self._coordinator = RoundCoordinator(
            client, settings, self._keys, max_restarts=max_restarts, history=history, clock=clock, wall_clock=wall_clock
        )

    # -- the torch-shaped surface -----------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.settings.run_id

    @property
    def node_id(self) -> str:
        return self._member.node_id

    @property
    def local_addr(self) -> str:
        return self._member.identity.addr

    @property
    def local_world_size(self) -> int:
        return self._member.identity.local_world_size

    def next_rendezvous(self, *, on_spare: Callable[[], None] | None = None) -> RendezvousInfo:
        """Join the next round and wait until it freezes; returns this node's place in it.
        ``on_spare()`` is called once this node waits while a round runs without it (a hot spare).

        Raises RendezvousClosedError (job closed), RendezvousTimeoutError (join_timeout passed),
        RendezvousConnectionError (etcd unreachable), RendezvousStateError (corrupt state).
        """
        # The running round's monitor has just seen the state that ends it: no read needed to start.
        seen = self._monitor.state if self._monitor is not None else None
        kept = self._monitor.detach() if self._monitor is not None else None  # its watch goes on
        self._stop_monitor()
        launched_at, self._launched_at = self._launched_at, None  # the first join only
        self._join = JoinLoop(
            self._client, self.settings, self._keys, self._member, self._coordinator, self._clock, on_spare, launched_at
        )
        self._joined_at, self._coordinator_read_at, self._coordinator_silent = self._clock(), float("-inf"), None
        joined_round = self._join.run(seen, kept)
        self._info = joined_round.info
        self._start_monitor(joined_round.handover)
        return joined_round.info

    def is_closed(self) -> bool:
        state, _ = self._store.read()
        return state is not None and state.status is JobStatus.CLOSED

    def request_restart(
        self, failure: str, kind: FailureKind = FailureKind.WORKER, progress: RoundProgress | None = None
    ) -> None:
        """This node's workers of the current round failed: the next round it joins restarts the
        group and advances the job's restart count (once, whichever nodes ask); ``progress``: how
        far they got, for the crash-loop breaker's count (``rendezvous.job.progress``)."""
        if self._info is None:
            raise RendezvousError("request_restart() needs a completed round")
        self._member.request_restart(self._info.round, failure, kind, progress)

    def set_closed(self, reason: str = "the job ended", *, failed: bool = False, closed_by: str = "") -> None:
        """Mark the job closed: every agent of it stops, and the run id cannot be joined again.

        ``failed``: a worker failed with no restart left, so every agent exits as failed;
        ``closed_by``: who decided, when not the job's own end (``CLOSED_BY_CRASH_LOOP``).
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
                    keep=Keep(retention=self.settings.retention),
                )
            return closed_state(
                state,
                reason,
                when=self._wall(),
                failed=failed,
                closed_by=closed_by,
                min_nodes=self.settings.min_nodes,
                max_nodes=self.settings.max_nodes,
            )

        try:
            _, closed = self._store.update(
                close, tries=None, timeout=self.settings.close_timeout, what="close", through_no_space=True
            )
        except GaveUp:
            raise RendezvousTimeoutError(
                f"could not mark rendezvous '{self.run_id}' closed within the close timeout"
            ) from None
        try:
            self._store.renew(closed)  # the job's keys are kept for its retention from now
        except RendezvousError:
            pass  # then from its last renewal: at most a third of the period sooner

    def num_nodes_waiting(self) -> int:
        """Nodes that want to join and would fit: a reason for the agent to re-rendezvous."""
        monitor = self.round_monitor()
        return monitor.cause.waiting if monitor is not None else 0

    def spares_waiting(self) -> int:
        """Live nodes waiting for a place beyond the running round (hot spares), read from etcd now."""
        snapshot = read_round(self._client, self._keys, all_nodes=True)
        return len(newcomers(snapshot.state, snapshot.nodes))

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
        if monitor.lease_gone:
            self._member.lease_ended()
        if not self._member.alive:
            return True
        return monitor.wait(timeout)

    def finish(self, *, quiet: bool | None = None) -> None:
        """Tell the others that this node's workers of the current round all succeeded; ``quiet``:
        instead, that those still alive have done nothing since the others exited 0 (True), or work
        again (False) -- ``launcher.hangs.exitstuck``."""
        if self._info is None:
            raise RendezvousError("finish() needs a completed round")
        self._member.announce(self._info.round, finished=quiet is None, quiet=bool(quiet))

    def all_finished(self, timeout: float = 0.0) -> bool:
        """True once every participant of this node's round has finished (waits up to ``timeout``),
        also when the job moved on meanwhile to a newcomer's round (``_finished_before_newcomer``)."""
        monitor = self._ensure_monitor()
        if monitor is None:
            return False
        deadline, r = self._clock() + timeout, self._info.round
        while True:
            monitor.poll()
            if monitor.finished:
                return True
            if monitor.moved_on and newcomer_round(monitor.state, r):
                return _finished_before_newcomer(self._client, self._keys, r, deadline, self._clock)
            if monitor.moved_on or monitor.cause.lost:
                return False
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            monitor.next_event(remaining)

    def wait_for_etcd(self, timeout: float | None = None, report: Callable[[str], None] | None = None) -> None:
        """Block until etcd serves this job's keys, up to ``connect_timeout`` (RendezvousConnectionError
        after); the first time, say a line to ``report`` when the etcd's version is worth one."""
        self._client.wait_ready(self._keys.state, self.settings.connect_timeout if timeout is None else timeout, report)
        if report is not None and not self._version_said:  # a known-bad or too old etcd: one line
            self._version_said = True
            line = version_line(server_version(self._client), ",".join(map(str, self._client.endpoints)))
            if line is not None:
                report(line)

    @property
    def lease(self) -> LeaseStatus:
        """This node's lease, as the fence sees it."""
        return self._member.lease

    def job_state(self) -> JobState | None:
        """The job's state as this node's monitor last saw it, else as etcd has it now."""
        if self._monitor is not None:
            self._monitor.poll()
            if self._monitor.state is not None:
                return self._monitor.state
        return self._store.read()[0]

    def progress(self) -> Progress | None:
        """How the round this node is waiting for is forming (None when not waiting); reads etcd."""
        target = self._join.target if self._join is not None else None
        if target is None:
            return None
        state, _ = self._store.read()
        timeout_in = self._join.timeout_in if self._join is not None else None
        s = self.settings
        ran_in = self._info.round if self._info is not None else None
        progress = progress_of(state, target, s.min_nodes, s.max_nodes, self._wall(), timeout_in, ran_in)
        coordinator = self._silent_coordinator(state)
        if progress is None or coordinator is None or coordinator[0] in progress.silent_nodes:
            return progress
        node, runs_out = coordinator
        silent = ((node, max(runs_out - self._wall(), 0.0)), *progress.silent)
        return replace(progress, silent=silent, coordinator=node)

    def _silent_coordinator(self, state: JobState | None) -> tuple[str, float] | None:
        """The coordinator and when its lease runs out, when that lease has missed two renewals: a
        dead machine holding the coordinator key keeps every node waiting until then, and nobody
        else can say so. Read once a renewal interval (more rarely in a big job, as the
        coordinator's counts), and only after a wait long enough to tell."""
        s, now = self.settings, self._clock()
        due = self._coordinator_read_at + max(s.renew_every, progress_every(state.size if state else 1))
        if now - self._joined_at < silent_after(s.renew_every) or now < due:
            return self._coordinator_silent
        self._coordinator_read_at = now
        held = self._client.get(self._keys.coordinator)
        holder = held.value.decode(errors="replace") if held is not None and held.lease else self.node_id
        found: tuple[tuple[str, float], ...] = ()
        if holder != self.node_id:
            time_left = [(holder, self._client.lease_ttl(held.lease))]
            found = silent_nodes(time_left, s.lease_ttl, s.renew_every, self._wall())
        self._coordinator_silent = found[0] if found else None
        return self._coordinator_silent

    def step_out(self, why: str) -> None:
        """Leave the job's rounds for a reason of this node's own (its health check failed): its
        restart request is withdrawn, the failures of its round are a membership change (a ``lost/``
        record on the job's lease, as its peers write for a dead node), and its lease is revoked.
        ``next_rendezvous`` joins again later, as a newcomer."""
        self._member.placed()
        state = self.job_state() if self._info is not None else None
        running = state is not None and state.status is JobStatus.RUNNING and state.round == self._info.round
        if running and state.keep.lease:
            record = json.dumps({"why": why, "by": self.node_id}).encode()
            try:
                self._client.put(self._keys.lost_in(state.round, self.node_id), record, lease=state.keep.lease)
            except RendezvousError:
                pass  # then its peers' workers' failures may use a restart
        self.shutdown()

    def shutdown(self) -> bool:
        """Leave the job: revoke the lease so the others notice at once. Does NOT close the job."""
        self._stop_monitor(join=True)
        self._member.leave()
        return True

    # -- following the round ---------------------------------------------------------------------------
    def _ensure_monitor(self, handover: Handover | None = None) -> JobMonitor | None:
        if self._monitor is None and self._info is not None:
            lease = self._member.lease.lease_id if self._member.alive else 0
            self._monitor = JobMonitor(
                self._client, self._keys, self._info.round, self.node_id, lease, handover=handover
            )
        return self._monitor

    def _start_monitor(self, handover: Handover | None) -> None:
        """Follow the new round at once, on the watch the round was joined with (the coordinator
        keeps the round from now on); etcd out of reach now is no error -- the first look at the
        membership tries again."""
        try:
            self._ensure_monitor(handover)
        except RendezvousConnectionError:
            if handover is not None:
                handover.watch.close(wait=False)

    def _stop_monitor(self, join: bool = False) -> None:
        if self._monitor is not None:
            self._monitor.close(join=join)
            self._monitor = None


NEWCOMER_POLL = (0.1, 2.0)  # seconds between reads while a finished node learns how its round ended: first, most


def _finished_before_newcomer(
    client: EtcdClient, keys: JobKeys, round_: int, deadline: float, clock: Callable[[], float]
) -> bool:
    """A newcomer's round began as this node's workers of ``round_`` succeeded: the round finished
    when every participant's workers did too (``ending_after``); read until each said one or the
    other (a participant stopping its workers for the newcomer takes up to its stop grace: the reads
    grow apart, so a big job's finished nodes do not read every node key ten times a second)."""
    pause, most = NEWCOMER_POLL
    while True:
        snapshot = read_round(client, keys, all_nodes=True)
        if closed_finished(snapshot.state, round_):
            return True  # another participant that finished found it first, and closed the job
        if not newcomer_round(snapshot.state, round_):
            return False  # failed, frozen or reset meanwhile: that answers
        ending = ending_after(snapshot.state.participants, snapshot.nodes, round_)
        if ending is not Ending.UNDECIDED or clock() >= deadline:
            return ending is Ending.FINISHED
        time.sleep(min(pause, max(deadline - clock(), 0.0)))
        pause = min(pause * 2, most)
