"""One round of a node's workers: start them (each with its heartbeat record), watch them, the
membership, the fence and hangs until the round ends, and stop them. The agent (``agent.py``)
decides what the round's outcome asks for."""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from launcher.c10dstore import StoreHost
from launcher.goodput.live import publish_account
from launcher.goodput.marks import WRITERS, RoundMarks, round_details
from launcher.hangs.exitstuck import ExitWatch, others_done, say_quiet
from launcher.hangs.hangwatch import HangWatch, RoundWork, watch_round
from launcher.hangs.verdict import Verdict
from launcher.pace import Change, PacedWorker, PaceWatch
from launcher.pace.spares import SpareLook, wait_replaced
from launcher.peers.probes import PeerProbes
from launcher.preflight import Preflight
from launcher.preflight.gate import check_round
from launcher.reaper.handle import ReaperProcess
from launcher.telemetry.metrics import RestartCause, Telemetry
from launcher.workers.checkpoints import newest_save
from launcher.workers.env import round_specs
from launcher.workers.group import GroupState, GroupStatus, WorkerGroup
from rendezvous.errors import RendezvousError
from rendezvous.job.hangboard import HangChannel
from rendezvous.job.history import HistoryWriter, Kind
from rendezvous.job.paceboard import PaceBoard
from rendezvous.job.state import Cause, FailureKind
from rendezvous.rounds.handler import RendezvousHandler
from rendezvous.rounds.join import RendezvousInfo

from .config import JobTerms, RoundSettings
from .hangs import beatfile as beats
from .output import Layout
from .restart import change_line, failure_records
from .signals import stop_deferred

__all__ = ["RoundOutcome", "RoundResult", "RoundRunner", "CAUSES"]


class RoundOutcome(str, enum.Enum):
    """How one round of this node's workers ended."""

    SUCCEEDED = "succeeded"  # every local worker exited 0
    FAILED = "failed"  # a local worker failed
    MEMBERSHIP_CHANGED = "membership changed"  # a node left or waits, or another node started a new round
    FENCED = "fenced"  # no lease renewal within the renew deadline: the workers had to stop
    HUNG = "hung"  # the job agreed that a rank stopped making progress
    REPLACED = "replaced"  # a straggler here: this node steps out for a waiting spare (--replace-stragglers)
    EXCLUDED = "excluded"  # the pre-flight check named this node: it stepped out and leaves the job (--preflight)


PARK_GRACE = 10.0  # seconds a worker under elastic.inprocess has to leave train before it is stopped

CAUSES = {
    RoundOutcome.FAILED: RestartCause.WORKER_FAILURE,
    RoundOutcome.HUNG: RestartCause.HANG,
    RoundOutcome.MEMBERSHIP_CHANGED: RestartCause.MEMBERSHIP_CHANGE,
    RoundOutcome.FENCED: RestartCause.FENCE,
    RoundOutcome.REPLACED: RestartCause.MEMBERSHIP_CHANGE,
    RoundOutcome.EXCLUDED: RestartCause.MEMBERSHIP_CHANGE,
}  # metrics' restart causes


@dataclass(frozen=True)
class RoundResult:
    outcome: RoundOutcome
    status: GroupStatus | None = None  # the workers' status when they ended (SUCCEEDED, FAILED)
    verdict: Verdict | None = None  # HUNG: the rank to blame
    failure: str = ""  # MEMBERSHIP_CHANGED by another node's failed or hung worker: what it said
    failure_kind: FailureKind | None = None  # and what that was
    lost: tuple[str, ...] = ()  # FAILED with the loss of these peers: a membership change, not a failure
    beats: int = 0  # the most heartbeats one local worker beat this round (crash-loop breaker)
    ran: float = 0.0  # seconds from the workers' first heartbeat (else their start) to the round's end here

    @property
    def cause(self) -> RestartCause:
        """The metrics' restart cause: the job's -- a worker that failed or hung on another node is
        that cause here too, not a membership change."""
        if self.lost:
            return CAUSES[RoundOutcome.MEMBERSHIP_CHANGED]
        if self.outcome is RoundOutcome.MEMBERSHIP_CHANGED and self.failure_kind is not None:
            return RestartCause(self.failure_kind.value)
        return CAUSES[self.outcome]


class RoundRunner:
    def __init__(
        self,
        settings: RoundSettings,
        beats_dir: str,
        handler: RendezvousHandler,
        terms: JobTerms,
        group: WorkerGroup,
        reaper: ReaperProcess,
        *,
        history: HistoryWriter,
        say: Callable[[str], None],
        telemetry: Telemetry,
        hangs: HangChannel | None,
        environ: Mapping[str, str],
        stores: StoreHost | None = None,
        peers: PeerProbes | None = None,
        paces: PaceBoard | None = None,
        preflight: Preflight | None = None,
        memory: str | None = None,
    ) -> None:
        """``beats_dir``: where the workers' heartbeat records go (one per worker and attempt).
        ``stores``: the sockets this node announced for the round's c10d store, which it serves
        when it is group rank 0 (None: rank 0's worker hosts the store). ``peers``: this node's
        probes (None: a peer's death is known by its lease only). ``paces``: the nodes' own-work
        paces in etcd (None: the ranks are scored against this node's only). ``preflight``: the
        check before a round with a new node starts its workers (None: no check). ``memory``: the
        directory of the workers' ``elastic.checkpoint`` saves (its newest goes in the round's record)."""
        self.settings = settings
        self._beats_dir = beats_dir
        self.handler, self._lease, self._join_timeout = handler, terms.lease, terms.join_timeout
        self._group, self._reaper, self._history, self._say, self._memory = group, reaper, history, say, memory
        self._telemetry = telemetry
        self._channel = hangs
        self._environ = environ
        self._stores = stores
        self._peers = peers
        self._hangs: HangWatch | None = None
        self._board = paces
        self._preflight = preflight
        self._pace: PaceWatch | None = None
        self._exits: ExitWatch | None = None
        self._spares = SpareLook(handler)
        self._beats_used = False  # this node's workers called elastic.heartbeat() in an earlier round
        self._status = GroupStatus(GroupState.RUNNING)  # the workers' last poll
        self._first_exit: float | None = None  # when a worker of the round first exited 0 here
        self.turned = time.monotonic()  # the watch loop's last turn (liveness)
        self.info: RendezvousInfo | None = None

    def run(
        self,
        info: RendezvousInfo,
        attempt: int,
        layout: Layout,
        ending: Callable[[RoundOutcome], None] = lambda outcome: None,
    ) -> RoundResult:
        """Start this round's workers and watch them until they end or the round does; ``ending``
        hears how it ended before the workers are stopped."""
        checked = self._open(info)
        if checked is not None:  # the pre-flight check excluded nodes: no worker starts in this round
            ending(checked.outcome)
            return checked
        self._start(info, attempt, layout)
        started = time.monotonic()  # a round's length: from its first heartbeat where there is one
        try:
            result, ended = self._watch(), time.monotonic()
            work = self._hangs.work() if self._hangs is not None else RoundWork()
            if result.outcome in (RoundOutcome.FAILED, RoundOutcome.HUNG):  # how far they got (crash loops)
                result = replace(result, beats=work.beats, ran=ended - (work.first or started))
            if result.outcome is RoundOutcome.FAILED:
                result = self._blame(result)
            if result.outcome is RoundOutcome.HUNG:
                self._hangs.report_hang(
                    result.verdict, self._say, lambda kind, **details: self._history.record(kind, info.round, **details)
                )
        finally:
            self._beats_used = self._beats_used or (self._hangs is not None and self._hangs.used)
            if self._hangs is not None:
                self._hangs.close()
            self._hangs = None
            self._end_pace()
        ending(result.outcome)
        kept = self._group.under_inprocess()  # the survivors keep their processes, and their steps
        if result.outcome is RoundOutcome.REPLACED:  # first: the peers' workers fail when these stop
            self.handler.step_out(f"replaced by a spare: {result.failure}")
        if result.outcome not in (RoundOutcome.FENCED, RoundOutcome.SUCCEEDED, RoundOutcome.REPLACED):
            self._group.park(min(self.settings.stop_grace, PARK_GRACE), spare=self._hung_here(result))
        # fenced: now, the lease may expire in under a second; else with the grace period
        self._group.stop(0.0 if result.outcome is RoundOutcome.FENCED else self.settings.stop_grace, kept=False)
        if self._stores is not None:
            self._stores.stop()  # the round's workers are gone, and its store with them
        if self._peers is not None:
            self._peers.end_round()  # after the workers: the peers' deadline guards them until then
        self._telemetry.workers(0)
        marks = RoundMarks(started, ended, time.monotonic(), **work.marks(), kept=kept, exited=self._first_exit)
        self._record_round(info, result, marks)
        if result.outcome is RoundOutcome.REPLACED:  # it rejoins once the spare's round runs, as a spare
            wait_replaced(self.handler, info.round, min(self._join_timeout, 30.0))
        return result

    def _start(self, info: RendezvousInfo, attempt: int, layout: Layout) -> None:
        """The round's workers started, with its store, its probes and its hang watch."""
        self._reaper.clear()
        self._reaper.note_round(info.round)
        beats_at = lambda local_rank: os.path.join(self._beats_dir, f"{attempt}-{local_rank}.beat")  # noqa: E731
        errors_at = lambda local_rank: layout.ranks[local_rank].error_file  # noqa: E731
        specs = round_specs(info, self.settings, errors_at, beats_at, agent_store=self._stores is not None)
        for spec in specs:
            beats.create(spec.heartbeat_file)
        if self._peers is not None:
            self._peers.start_round(info, lambda: self._lease.lease_id)
        with stop_deferred():  # every worker started is one the group knows when a stop comes
            self._group.start(specs, layout, self._environ, self.settings.cpu_binding)
        self._telemetry.workers(len(specs))
        if info.group_rank == 0 and self._telemetry.registry is not None:  # the job's goodput so far, as metrics
            publish_account(self._history.read, self._telemetry.account)
        self._hangs = watch_round(
            self._channel,
            specs,
            self.settings.hang_timeouts,
            node=self.handler.node_id,
            round_=info.round,
            lease_id=self._lease.lease_id,
            nodes=info.group_world_size,
            judge_first=self._beats_used,
            pid_of=self._group.pid_of,
            interval=self.settings.monitor_interval,
        )
        bound, ranks = self.settings.exit_stuck_timeout, [s.local_rank for s in specs]
        done, quiet = others_done(self.handler.round_monitor, self.handler.node_id), say_quiet(self.handler)
        self._exits = ExitWatch(ranks, self._group.pid_of, bound, done, quiet=quiet)
        paced = [PacedWorker(s.local_rank, s.rank, s.heartbeat_file) for s in specs]
        node, lease = self.handler.node_id, lambda: self._lease.lease_id
        gauge = self._telemetry.straggler_score
        self._pace = PaceWatch(paced, self._board, node=node, round_=info.round, lease=lease, gauge=gauge)

    def _record_round(self, info: RendezvousInfo, result: RoundResult, marks: RoundMarks) -> None:
        """Its failed workers' ``worker_failed`` records, then the ``round_ended`` record of group
        ranks 0 and 1 (``launcher.goodput.marks``)."""
        if result.outcome is RoundOutcome.FAILED:
            for record in failure_records(result.status):
                self._history.record(Kind.WORKER_FAILED, info.round, **record)
        if info.group_rank < WRITERS:  # with this node's newest elastic.checkpoint save: (step, when)
            marks = replace(marks, save=newest_save(self._memory))
            now_wall, now = time.time(), time.monotonic()
            details = round_details(
                marks, outcome=result.outcome.value, group_rank=info.group_rank, now_wall=now_wall, now=now
            )
            self._history.record(Kind.ROUND_ENDED, info.round, **details)

    def _open(self, info: RendezvousInfo) -> RoundResult | None:
        """The round's store served (group rank 0), then the pre-flight check when it is due: a
        result when no worker is to start in this round."""
        self.info, self._first_exit = info, None
        if self._stores is not None:
            self._stores.serve(info.master_port if info.group_rank == 0 else None)
        checked = self._check_round(info)
        if checked is not None and self._stores is not None:
            self._stores.stop()
        return checked

    def _check_round(self, info: RendezvousInfo) -> RoundResult | None:
        """The pre-flight check when it is due (``launcher.preflight.gate.check_round``)."""
        if self._preflight is None or self._stores is None:
            return None  # no check asked, or no store before the workers to meet through
        out = check_round(self._preflight, self.handler, info, self._environ, self._history)
        if out is None:
            return None
        if out:  # this node was named: it stepped out, and leaves the job
            return RoundResult(RoundOutcome.EXCLUDED, failure=f"the pre-flight check found {out}")
        return RoundResult(RoundOutcome.MEMBERSHIP_CHANGED)  # others were: the round forms again without them

    def _stragglers(self) -> RoundResult | None:
        """Say and record each straggler verdict that changed; with --replace-stragglers, a straggler
        here while a spare waits ends the round: this node steps out for the spare."""
        for change in self._pace.tick():
            self._say(change.line())
            kind = Kind.STRAGGLER if change.change == Change.STRAGGLING else Kind.STRAGGLER_RECOVERED
            self._history.record(kind, self.info.round, **change.details())
        straggler = self._pace.straggler()
        if straggler is None or not self.settings.replace_stragglers or not self._spares.waiting():
            return None
        self._say(f"rank {straggler.rank} straggles and a spare waits: this node steps out for it (no restart used)")
        return RoundResult(RoundOutcome.REPLACED, failure=straggler.line())

    def _end_pace(self) -> None:
        if self._pace is not None:
            self._pace.close()
            for local_rank in range(self.settings.nproc_per_node):
                self._telemetry.straggler_score(local_rank, None)
        self._pace = None

    def _hung_here(self, result: RoundResult) -> tuple[int, ...]:
        """The local rank a hang verdict blames (stopped, never kept; the ranks that stopped with it
        are most often blocked on it in a collective, and are kept)."""
        if result.verdict is None:
            return ()
        local = result.verdict.culprit.rank - self.info.base_global_rank
        return (local,) if 0 <= local < self.settings.nproc_per_node else ()

    def _blame(self, result: RoundResult) -> RoundResult:
        """A worker failure that comes with a peer's loss is that loss, a membership change (a
        broken collective is what a dead machine looks like from its peers' workers)."""
        if self._peers is None or self.info.group_world_size == 1:
            return result
        lost = self._peers.lost_with_failure(spent=self.info.restart_count >= self.info.max_restarts)
        return replace(result, lost=lost) if lost else result

    def _watch(self) -> RoundResult:
        """Until the workers end, the membership changes, the lease lapses or a hang is agreed on.

        Membership changes arrive by watch at once; the workers are looked at every monitor
        interval, and more often during the first second (short jobs end sooner).
        """
        started = time.monotonic()
        while True:
            self.turned = time.monotonic()
            result = self._outcome()
            if result is not None:
                return result
            verdict = self._hangs.tick(self._status.exited, self._peer_finished) if self._hangs is not None else None
            if verdict is not None and not self._past_hangs(verdict):
                return RoundResult(RoundOutcome.HUNG, verdict=verdict)
            self._end_stuck()
            replaced = self._stragglers()
            if replaced is not None:
                return replaced
            interval = self.settings.monitor_interval
            if time.monotonic() - started < 1.0:
                interval = min(interval, 0.02)
            if self.handler.membership_changed(timeout=interval):
                result = self._outcome()
                if result is not None:
                    return result
                verdict = self._hangs.settled() if self._hangs is not None else None
                if verdict is not None:  # another node acted on the job's hang verdict first
                    return RoundResult(RoundOutcome.HUNG, verdict=verdict)
                line, cause = self._why_changed()
                self._say(line)
                failure = cause.failures[0] if cause.failures else ""
                return RoundResult(RoundOutcome.MEMBERSHIP_CHANGED, failure=failure, failure_kind=cause.kind)

    def _outcome(self) -> RoundResult | None:
        """How the round ended, or None while the workers run. Fencing is checked before and after
        looking at the workers, since workers the reaper killed look like workers that failed."""
        if self.fenced():
            return RoundResult(RoundOutcome.FENCED)
        status = self._status = self._group.poll()
        if status.exited and self._first_exit is None:
            self._first_exit = time.monotonic()
        if status.state is GroupState.FAILED and self.fenced(settle=0.1):
            return RoundResult(RoundOutcome.FENCED)
        if status.state is GroupState.SUCCEEDED:
            return RoundResult(RoundOutcome.SUCCEEDED, status)
        if status.state is GroupState.FAILED:
            return RoundResult(RoundOutcome.FAILED, status)
        return None

    def _past_hangs(self, verdict: Verdict) -> bool:
        """The verdict names a local rank whose peers all exited 0: past the job's last collective,
        it is the exit watch's to judge (stuck at exit), never a restart."""
        local = verdict.culprit.rank - self.info.base_global_rank
        mine = verdict.culprit.node == self.handler.node_id
        return mine and self._exits is not None and self._exits.covers(local, self._status.exited)

    def _end_stuck(self) -> None:
        """Workers stuck at exit (``launcher.hangs.exitstuck``): each said with what it is blocked in,
        recorded, and ended -- it then counts as exited 0, and the round succeeds."""
        ending = bool(self._status.exited) or self._peer_finished()
        round_, node = self.info.round, self.handler.node_id
        for stuck in self._exits.stuck(self._status.exited, ending, self.info.base_global_rank):
            self._say(stuck.line(round_))
            self._history.record(Kind.WORKER_STUCK_AT_EXIT, round_, node=node, **stuck.details())
            self._group.end_stuck(stuck.local_rank)

    def _peer_finished(self) -> bool:
        try:
            monitor = self.handler.round_monitor()
        except RendezvousError:
            return False  # etcd out of reach: the fence decides
        return monitor is not None and monitor.some_finished

    def fenced(self, settle: float = 0.0) -> bool:
        """The renew deadline passed (the reaper killed the workers, or it is due now)."""
        deadline = time.monotonic() + settle
        while True:
            if self._reaper.fired() or self._lease.overdue():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _why_changed(self) -> tuple[str, Cause]:
        """One line with the facts: why this node's workers stop for a new round; and the round's
        cause (another node's failed or hung worker, when one ended it)."""
        try:
            state = self.handler.job_state()
            monitor = self.handler.round_monitor()
        except RendezvousError:
            return "etcd unreachable: re-rendezvous", Cause()
        line = change_line(
            state,
            monitor,
            lease_lost=self._lease.lost(),
            restarts=self.info.restart_count,
            budget=self.info.max_restarts,
            in_place=self._group.under_inprocess(),
        )
        return line, monitor.cause if monitor is not None else Cause()
