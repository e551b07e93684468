"""The agent: RENDEZVOUS -> RUNNING -> SUCCEEDED | FAILED | RESTARTING -> RENDEZVOUS.

- A worker failure (or an agreed hang, ``launcher/hangs/``) stops the group and, while restarts
  remain, joins a new round and starts the workers again (TORCHELASTIC_RESTART_COUNT counts these).
- A membership change -- a participant's agent or machine is gone (``launcher.peers``), a node waits
  to join, another node started a new round -- re-rendezvouses without using a restart.
- etcd out of reach past the renew deadline (or the peers') fences the workers: stopped, then the
  agent rejoins without using a restart. The reaper enforces the same deadlines.
- When every local worker succeeded the agent says so in its node key and waits (the exit barrier,
  bounded) for the other nodes; when all have, the job is marked closed.
- the signals of --signals-to-handle stop the workers with the same signal; the job stays open.
"""

from __future__ import annotations

import enum
import signal
import time
from collections.abc import Callable

from launcher.output.console import progress_lines, round_line
from launcher.telemetry.liveness import AgentSnapshot
from rendezvous.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousCredentialsError,
    RendezvousError,
)
from rendezvous.job.history import Kind
from rendezvous.job.progress import tripped
from rendezvous.job.state import CLOSED_BY_CRASH_LOOP, CLOSED_BY_OPERATOR, JobState, JobStatus
from rendezvous.rounds.handler import RendezvousHandler
from rendezvous.rounds.join import RendezvousInfo

from . import restart
from .compose import NodeParts, Shared
from .config import AgentConfig, JobTerms, differences
from .errors import (
    AgentStopped,
    CrashLoopError,
    InfrastructureError,
    JobClosedError,
    JobRendezvousError,
    LauncherError,
    WorkerFailedError,
    rendezvous_failure,
)
from .runner import RoundOutcome, RoundResult
from .signals import ignore_stop_signals

__all__ = ["AgentConfig", "Agent", "AgentState", "RoundOutcome", "RoundResult"]


class AgentState(str, enum.Enum):
    """The agent's states (torch's WorkerState names where they match)."""

    INIT = "init"
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # told to stop by a signal: its workers are being stopped, the job stays open


class Agent:
    """Runs one node's workers for a job, from rendezvous to exit."""

    def __init__(
        self,
        config: AgentConfig,
        handler: RendezvousHandler,
        terms: JobTerms,
        parts: NodeParts,
        shared: Shared,
        *,
        farewell: Callable[[], None] = lambda: None,
    ) -> None:
        """``parts``: the worker group, health gate, checkpoint keeper and round runner it uses, and
        ``shared``: what the handler's side uses too -- built and closed by the root (``launch``,
        ``compose``), which closes them after ``run``; ``farewell``: called once its workers are
        stopped at the end, before its last words to etcd (``launch`` bounds them all together)."""
        self.config, self.handler, self.history, self._reaper = config, handler, shared.history, shared.reaper
        self._farewell, self._terms, self._parts = farewell, terms, parts
        self.say, self.telemetry = shared.say, shared.telemetry
        self.telemetry.lease_age(terms.lease.silent_for)
        self._group, self._gate, self._rounds = parts.group, parts.gate, parts.rounds
        self._warm, self._peers = shared.warm, shared.peers
        self.state, self.attempt = AgentState.INIT, 0
        self._told: set[str] = set()  # the lines about options that differ from the job's, said once
        self._departure = restart.Departure()
        self.info: RendezvousInfo | None = None

    @property
    def state(self) -> AgentState:
        return self._state

    @state.setter
    def state(self, value: AgentState) -> None:
        self._state = value
        self.telemetry.state(value.value)

    def snapshot(self) -> AgentSnapshot:
        """What the probes judge (read from another thread)."""
        info, lease = self.info, self._terms.lease
        stalled = time.monotonic() - self._rounds.turned if self.state is AgentState.RUNNING else 0.0
        known = (info.round, info.world_size, info.group_rank) if info else (None, None, None)
        fence_after, workers = self._terms.fence_after, len(self.worker_pids())
        return AgentSnapshot(
            self.state.value, stalled, *known, lease.lease_id != 0, lease.silent_for(), fence_after, workers
        )

    def run(self) -> int:
        """Run until the job succeeds (returns 0); raises a LauncherError otherwise."""
        try:
            return self._invoke_run()
        except RendezvousClosedError as exc:
            if self._finished_without_this_node(exc):
                return 0
            raise self._closed_error(exc) from exc
        except RendezvousError as exc:  # timed out, unreachable, corrupt
            raise rendezvous_failure(exc) from exc
        except AgentStopped as exc:
            self._departure = restart.Departure(f"stopped by {signal.Signals(exc.signum).name}", exc.signum)
            self.state = AgentState.STOPPED  # metrics and probes say so while its workers are stopped
            raise
        finally:
            self._close_down()

    def _invoke_run(self) -> int:
        """Rendezvous, run the workers, and decide what the round's outcome asks for."""
        while True:
            self._gate.before_round(self.info.round if self.info else 0)
            self.info = self._rendezvous()
            if self._rounds.fenced() or not self._lease_ahead():
                self._after_fence()
                continue  # etcd went away right after the round, or renews no more: rejoin before starting anything
            result = self._run_round()
            self.attempt += 1  # the next round's workers, if any, are another attempt
            if result.outcome is RoundOutcome.SUCCEEDED:
                if self._finished():
                    return 0
                continue  # another node's failure restarted the job: its workers run again
            self._after_round(result)

    def _finished(self) -> bool:
        """This node's workers succeeded: whether the job did too (else it rejoins, ``_exit_barrier``)."""
        self._departure = restart.Departure("finished: its workers succeeded")
        return self._exit_barrier()

    def _after_round(self, result: RoundResult) -> None:
        """What a round that did not succeed asks for: leave (excluded), wait as a spare (replaced),
        rejoin (fenced, a membership change), or restart or close the job (a failure, a hang)."""
        if result.outcome is RoundOutcome.EXCLUDED:  # it stepped out: a machine to replace (exit 200)
            raise InfrastructureError(f"this node leaves the job: {result.failure}")
        if result.outcome is RoundOutcome.REPLACED:  # it stepped out for a spare, and waits as one
            return
        self.telemetry.restarted(result.cause)
        if result.verdict is not None:
            self.telemetry.hung(result.verdict.culprit_label)
        if result.outcome is RoundOutcome.FENCED:
            self._after_fence()
        elif result.outcome is RoundOutcome.FAILED and result.lost:  # with a peer's loss: a membership change
            self.say(restart.loss_line(result.lost, self.info.restart_count, self.info.max_restarts))
        elif result.outcome is RoundOutcome.FAILED:  # its worker_failed records are the runner's
            failure = restart.failure_of(result.status, self.handler.node_id, self.info)
            if not self._gate.after_failure(failure.what):
                self._restart_or_close(failure, result)
        elif result.outcome is RoundOutcome.HUNG:
            failure = restart.hang_of(result.verdict, self.info, self.config.history_command)
            mine = result.verdict.culprit.node == self.handler.node_id  # this node's worker hung
            if not (mine and self._gate.after_failure(failure.what)):
                self._restart_or_close(failure, result)

    def worker_pids(self) -> list[int]:
        """This node's worker processes now (none between rounds)."""
        return self._group.pids

    # -- the steps ------------------------------------------------------------------------------
    def _close_down(self) -> None:
        """Stop the workers (with the signal that stopped the agent) and leave the round; its parts are
        the root's to close."""
        ignore_stop_signals()
        self._group.stop(self.config.stop_grace, self._departure.signum)
        self._farewell()
        state = self._job_state() if self.info is not None else None
        try:
            self.handler.shutdown()
        except RendezvousError:
            pass  # etcd is away: our lease expires by itself
        if self.info is not None:
            # Leaving a closed job is no news (its job_closed record says why): said, not stored,
            # so a job's history does not grow by one record a node at its end.
            ended = state is not None and state.status is JobStatus.CLOSED
            self.history.record(Kind.NODE_LEFT, self.info.round, store=not ended, reason=self._departure.reason)

    def _run_round(self) -> RoundResult:
        self.state = AgentState.RUNNING
        layout = self.config.logs.layout(
            self.attempt,
            role=self.config.role,
            base_rank=self.info.base_global_rank,
            nproc=self.config.nproc_per_node,
            run_id=self.info.run_id,
            restart_count=self.info.restart_count,
        )

        def ending(outcome: RoundOutcome) -> None:
            self.state = AgentState.SUCCEEDED if outcome is RoundOutcome.SUCCEEDED else AgentState.RESTARTING
            if outcome in (RoundOutcome.FAILED, RoundOutcome.HUNG):  # the GPU check runs while the workers stop
                self._gate.round_failing()

        return self._rounds.run(self.info, self.attempt, layout, ending)

    def _restart_or_close(self, failure: restart.Failure, result: RoundResult) -> None:
        """Ask the job for a restart while its budget lasts and it is not a crash loop (``result``:
        how far the workers got), else print the summary and close it failed."""
        long = result.ran >= self.config.crash_loop.window
        progress = failure.progress(result.beats, self._parts.checkpoints.newest_step(), long, result.ran)
        count, budget = self.info.restart_count, self.info.max_restarts
        limit = self.config.crash_loop.restarts
        if count < budget and tripped(self.info.streak, progress, limit):
            self.state = AgentState.FAILED
            reason = restart.crash_loop_reason(failure.what, self.info.streak, limit)
            self._close(reason, failed=True, closed_by=CLOSED_BY_CRASH_LOOP)
            self.say(restart.crash_loop_summary(failure.what, self.info.streak, limit, self.config.crash_loop.window))
            raise CrashLoopError(reason, failure.failures)
        if count < budget:
            self.say(restart.restart_line(failure.what, count, budget, self._group.in_place))
            self.handler.request_restart(failure.what, failure.kind, progress)
            return
        self.state = AgentState.FAILED
        self._close(restart.spent_reason(failure.what, count, budget), failed=True)  # recorded before it is said
        self.say(failure.summary())
        raise WorkerFailedError(failure.what, failure.failures)

    def _finished_without_this_node(self, exc: RendezvousClosedError) -> bool:
        """The job succeeded while this node waited for a place in it (a hot spare never needed), or
        while it was out of it (fenced, coming back): its part is done too (``restart.finished_without``)."""
        away = self.info is not None  # it had ranks, lost them (fenced), and was coming back
        line = restart.finished_without(self._job_state() if exc.while_waiting or away else None, away)
        if line is not None:
            self.state, self._departure = AgentState.SUCCEEDED, restart.Departure(line)
            self.say(f"{line}: nothing left to run")
        return line is not None

    def _closed_error(self, exc: RendezvousClosedError) -> LauncherError:
        """The job was closed under this node: by a failure elsewhere, by an operator, or before it joined."""
        state = self._job_state()
        if state is not None and state.failed:  # another node's worker failed with no restart left
            self.state = AgentState.FAILED
            self.say(f"the job failed: {state.reason}")
            looped = state.closed_by == CLOSED_BY_CRASH_LOOP
            return CrashLoopError(state.reason) if looped else WorkerFailedError(state.reason)
        if state is not None and state.closed_by == CLOSED_BY_OPERATOR:
            self._departure = restart.Departure(f"the job was closed by an operator ({state.reason})")
            new = self.info is None  # a new launch of it: its line names the reset that lets it run again
            return JobClosedError(str(exc) if new else f"the job was closed by an operator: {state.reason}")
        return JobRendezvousError(str(exc))

    def _rendezvous(self) -> RendezvousInfo:
        """The next round; etcd out of reach is waited for (connect_timeout), then tried again."""
        self.state = AgentState.RENDEZVOUS
        if self.attempt == 0 and self.info is None:
            self.handler.wait_for_etcd(report=self.say)
        joining = time.monotonic()
        with progress_lines(self.handler.progress, self.say):
            while True:
                try:
                    info = self.handler.next_rendezvous(on_spare=self._warm.background if self._warm else None)
                    break
                except RendezvousCredentialsError:
                    raise
                except RendezvousConnectionError as exc:
                    self.say(f"lost etcd while joining a round: {exc}")
                    self.handler.wait_for_etcd(report=self.say)
        self.telemetry.round_formed(info, time.monotonic() - joining)
        self.say(round_line(info, self.config.nproc_per_node))
        for line in differences(self.config, self._terms.nodes, info):
            if line not in self._told:
                self._told.add(line)
                self.say(line)
        return info

    def _lease_ahead(self) -> bool:
        """Workers start under a renew deadline ahead of them (``LeaseStatus.wait_ahead``): a quarter
        of it, less than a healthy keep-alive ever leaves; waited for up to the whole deadline."""
        limit = self._terms.fence_after
        waiting = lambda silent: self.say(restart.renewal_line(self.info.round, silent, limit))  # noqa: E731
        return self._terms.lease.wait_ahead(limit / 4, limit, waiting)

    def _after_fence(self) -> None:
        peers = self._peers.last_miss() if self._peers is not None else (None, 0.0)
        what, limit = restart.fence_reason(*peers, self._terms.lease.silent_for(), self._terms.fence_after)
        self.history.record(Kind.NODE_LEFT, self.info.round if self.info else 0, reason=f"fenced: {what}; it rejoins")
        self.say(f"{what} ({limit}): stopped the workers so that no stale rank runs on; rejoining when etcd answers")
        self._terms.lease.handled()
        self._reaper.clear()

    def _job_state(self) -> JobState | None:
        try:
            return self.handler.job_state()
        except RendezvousError:
            return None

    def _exit_barrier(self) -> bool:
        """Say this node finished; when every participant has, close the job. False when, meanwhile,
        the job restarts or goes on with a newcomer (``restart.rejoin_after_finish``): it rejoins.
        Past ``exit_barrier_timeout`` it says which nodes still run and leaves (as torch's agent)."""
        try:
            self.handler.finish()
            if self.handler.all_finished(timeout=self.config.exit_barrier_timeout):
                self._close("the job finished")
                return True
            state, monitor = self.handler.job_state(), self.handler.round_monitor()
            line = restart.rejoin_after_finish(state)
            if line is None and monitor is not None and not monitor.moved_on:  # the barrier timed out
                line = restart.barrier_line(monitor.unfinished(quiet=False) or (), self.config.exit_barrier_timeout)
                self.say(line)
                return True
        except RendezvousError as exc:
            self.say(f"workers succeeded; could not record it in etcd ({exc})")
            return True
        if line is not None:
            self.say(line)
        return line is None

    def _close(self, reason: str, *, failed: bool = False, closed_by: str = "") -> None:
        by = closed_by or "agent"
        self.history.record(Kind.JOB_CLOSED, self.info.round if self.info else 0, reason=reason, failed=failed, by=by)
        try:
            self.handler.set_closed(reason, failed=failed, closed_by=closed_by)
        except RendezvousError as exc:
            self.say(f"could not mark the job closed: {exc}")
