"""The agent: RENDEZVOUS -> RUNNING -> SUCCEEDED | FAILED | RESTARTING -> RENDEZVOUS.

- A worker failure stops the group and, while restarts remain, joins a new round and starts the
  workers again (TORCHELASTIC_RESTART_COUNT counts these).
- A membership change -- a participant's agent is gone, a node waits to join, or another node
  started a new round -- stops the group and re-rendezvouses without using a restart.
- An etcd outage shorter than the renew deadline does not touch running workers. Past it the
  workers are stopped (fenced: the lease may expire and the others may form a round without this
  node), the agent waits for etcd (up to connect_timeout) and rejoins, without using a restart.
  The reaper enforces the same deadline, so a frozen or hung agent's workers are stopped too.
- When every local worker succeeded the agent says so in its node key and waits (up to the exit
  barrier timeout) for the other nodes; when all have, the job is marked closed.
- A worker that calls elastic.heartbeat() and then stays silent past its timeout is hung; the nodes
  agree through etcd on the rank to blame (launcher/hangwatch.py), its stacks are dumped, and the
  hang is then handled as a failure (one restart of the job's budget).
- the signals of --signals-to-handle (SIGTERM, SIGINT, SIGHUP, SIGQUIT) stop the workers with the same
  signal and leave the job open for the others.
"""

from __future__ import annotations

import enum
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from rendezvous.errors import RendezvousClosedError, RendezvousConnectionError, RendezvousCredentialsError, RendezvousError
from rendezvous.handler import RendezvousHandler
from rendezvous.join import RendezvousInfo
from rendezvous.hangcase import HangChannel
from rendezvous.history import HistoryWriter
from rendezvous.operate import OPERATOR
from rendezvous.state import JobState

from . import beatfile
from .console import report_progress, say
from .env import WorkerSpec
from .errors import AgentStopped, JobClosedError, JobRendezvousError, LauncherError, WorkerFailedError, rendezvous_failure
from .hangs import HangTimeouts, Verdict
from .hangwatch import HangWatch, watch_round
from .output import Layout, LayoutStrategy, LogPump
from .signals import ignore_stop_signals
from .summary import change_line, describe_exit, failure_summary, hang_summary
from .workers import GroupState, GroupStatus, ReaperProcess, WorkerGroup

__all__ = ["AgentConfig", "Agent", "AgentState", "RoundOutcome", "RoundResult"]


class AgentState(str, enum.Enum):
    INIT = "init"
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class AgentConfig:
    argv: tuple[str, ...]  # the worker command line
    nproc_per_node: int
    logs: LayoutStrategy  # the built-in layout or a torch LogsSpecs: the CLI picks
    max_restarts: int = 0
    monitor_interval: float = 0.1
    role: str = "default"
    stop_grace: float = 30.0  # seconds between SIGTERM and SIGKILL when stopping workers (--shutdown-timeout)
    virtual_local_rank: bool = False  # LOCAL_RANK=0 and one CUDA device per worker
    event_log_handler: str = "null"  # torchrun's --event-log-handler: null, or console (a JSON line per event)
    cpu_binding: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # command before a local rank's (--numa-binding)
    exit_barrier_timeout: float = 300.0  # how long a finished node waits for the others
    hang_timeouts: HangTimeouts = field(default_factory=HangTimeouts)  # --heartbeat-timeout, --first-heartbeat-timeout


class RoundOutcome(str, enum.Enum):
    """How one round of this node's workers ended."""

    SUCCEEDED = "succeeded"  # every local worker exited 0
    FAILED = "failed"  # a local worker failed
    MEMBERSHIP_CHANGED = "membership changed"  # a node left or waits, or another node started a new round
    FENCED = "fenced"  # no lease renewal within the renew deadline: the workers had to stop
    HUNG = "hung"  # the job agreed that a rank stopped making progress


@dataclass(frozen=True)
class RoundResult:
    outcome: RoundOutcome
    status: GroupStatus | None = None  # the workers' status when they ended (SUCCEEDED, FAILED)
    verdict: Verdict | None = None  # HUNG: the rank to blame


@dataclass
class _Departure:
    """What this node's history and workers are told when the agent leaves."""

    reason: str = "the agent exited"
    signum: int = signal.SIGTERM  # the workers get the signal the agent got, as under torchrun


class Agent:
    """Runs one node's workers for a job, from rendezvous to exit."""

    def __init__(
        self, config: AgentConfig, handler: RendezvousHandler, *, history: HistoryWriter, reaper: ReaperProcess,
        hangs: HangChannel | None = None, report: Callable[[str], None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """``history`` and ``reaper`` are the handler's too (it records rounds and arms the reaper);
        whoever made them closes them after ``run``. ``hangs``: etcd's side of hang detection
        (None: workers' heartbeats are not watched)."""
        self.config = config
        self.handler = handler
        self.history = history
        self._reaper = reaper
        self.say = report or say
        self.environ = dict(os.environ if environ is None else environ)
        self.state = AgentState.INIT
        self.attempt = 0
        self._told_budget = False
        self.info: RendezvousInfo | None = None
        self._hang_channel = hangs
        self._hangs: HangWatch | None = None
        self._beats_used = False  # this node's workers called elastic.heartbeat() in an earlier round
        self._status = GroupStatus(GroupState.RUNNING)  # the workers' last poll

    def run(self) -> int:
        """Run until the job succeeds (returns 0); raises a LauncherError otherwise."""
        self._open()
        try:
            return self._invoke_run()
        except RendezvousClosedError as exc:
            raise self._closed_error(exc) from exc
        except RendezvousError as exc:  # timed out, unreachable, corrupt
            raise rendezvous_failure(exc) from exc
        except AgentStopped as exc:
            self._departure = _Departure(f"stopped by {signal.Signals(exc.signum).name}", exc.signum)
            raise
        finally:
            self._close_down()

    def _invoke_run(self) -> int:
        """Rendezvous, run the workers, and decide what the round's outcome asks for."""
        while True:
            self.info = self._rendezvous()
            if self._fenced():
                self._after_fence()
                continue  # etcd went away right after the round: rejoin before starting anything
            result = self._run_round()
            if result.outcome is RoundOutcome.SUCCEEDED:
                self._departure = _Departure("finished: its workers succeeded")
                self._exit_barrier()
                return 0
            self.state = AgentState.RESTARTING
            self.attempt += 1
            if result.outcome is RoundOutcome.FENCED:
                self._after_fence()
            elif result.outcome is RoundOutcome.FAILED:
                self._restart_or_fail(result.status)
            elif result.outcome is RoundOutcome.HUNG:
                line = result.verdict.line()
                self._restart_or_close(line, lambda: hang_summary(line, self.handler.run_id, self.info.restart_count,
                                                                   self.info.max_restarts), ())

    # -- the steps ------------------------------------------------------------------------------
    def _open(self) -> None:
        """The agent's own helpers: the log pump and the worker group."""
        self._pump = LogPump()
        self._group = WorkerGroup(self.config.argv, self._pump, self._reaper)
        self._departure = _Departure()
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # memory, never written back to a disk
        self._beats_dir = tempfile.mkdtemp(prefix="elastic-beats-", dir=shm)

    def _close_down(self) -> None:
        """Stop the workers (with the signal that stopped the agent), leave the round, close the pump."""
        ignore_stop_signals()
        self._group.stop(self.config.stop_grace, self._departure.signum)
        try:
            self.handler.shutdown()
        except RendezvousError:
            pass  # etcd is away: our lease expires by itself
        if self.info is not None:
            self.history.record("node_left", self.info.round, reason=self._departure.reason)
        self._pump.close()
        shutil.rmtree(self._beats_dir, ignore_errors=True)

    def _run_round(self) -> RoundResult:
        """Start this round's workers and watch them until they end or the round does; stop them."""
        self.state = AgentState.RUNNING
        self._reaper.clear()
        self._reaper.note_round(self.info.round)
        layout = self.config.logs.layout(
            self.attempt, role=self.config.role, base_rank=self.info.base_global_rank,
            nproc=self.config.nproc_per_node, run_id=self.info.run_id, restart_count=self.info.restart_count,
        )
        specs = self._specs(self.info, layout)
        for spec in specs:
            beatfile.create(spec.heartbeat_file)
        self._group.start(specs, layout, self.environ, self.config.cpu_binding)
        self._hangs = watch_round(self._hang_channel, specs, self.config.hang_timeouts, node=self.handler.node_id,
                                  round_=self.info.round, lease_id=self.handler.lease.lease_id,
                                  nodes=self.info.group_world_size, judge_first=self._beats_used)
        try:
            result = self._monitor(self._group)
            if result.outcome is RoundOutcome.HUNG:
                self._hangs.report_hang(result.verdict, self.say,
                                        lambda kind, **details: self.history.record(kind, self.info.round, **details))
        finally:
            self._beats_used = self._beats_used or (self._hangs is not None and self._hangs.used)
            if self._hangs is not None:
                self._hangs.close()
            self._hangs = None
        # fenced: now, the lease may expire in under a second; else with the grace period
        self._group.stop(0.0 if result.outcome is RoundOutcome.FENCED else self.config.stop_grace)
        if result.outcome is RoundOutcome.SUCCEEDED:
            self.state = AgentState.SUCCEEDED
        return result

    def _restart_or_fail(self, status: GroupStatus) -> None:
        """A local worker failed: ask the job for a restart while its budget lasts, else close it failed."""
        first = status.first_failure
        self._record_failures(status)
        what = f"rank {first.rank} on node {self.handler.node_id} failed ({describe_exit(first)})"
        self._restart_or_close(what, lambda: failure_summary(status, self.handler.run_id, self.info.restart_count,
                                                             self.info.max_restarts), status.failures)

    def _restart_or_close(self, what: str, summary: Callable[[], str], failures: tuple) -> None:
        """Ask the job for a restart while its budget lasts, else print the summary and close it failed."""
        count, budget = self.info.restart_count, self.info.max_restarts
        if count < budget:
            self.say(f"{what}; restarting the workers ({count + 1}/{budget})")
            self.handler.request_restart(what)
            return
        self.state = AgentState.FAILED
        self.say(summary())
        self._close(f"{what} and no restart was left ({count}/{budget})", failed=True)
        raise WorkerFailedError(what, failures)

    def _closed_error(self, exc: RendezvousClosedError) -> LauncherError:
        """The job was closed under this node: by a failure elsewhere, by an operator, or before it joined."""
        state = self._job_state()
        if state is not None and state.failed:  # another node's worker failed with no restart left
            self.state = AgentState.FAILED
            self.say(f"the job failed: {state.reason}")
            return WorkerFailedError(state.reason)
        if state is not None and state.closed_by == OPERATOR:
            self._departure = _Departure(f"the job was closed by an operator ({state.reason})")
            return JobClosedError(f"the job was closed by an operator: {state.reason}")
        return JobRendezvousError(str(exc))

    def _rendezvous(self) -> RendezvousInfo:
        """The next round; etcd out of reach is waited for (connect_timeout), then tried again."""
        self.state = AgentState.RENDEZVOUS
        if self.attempt == 0 and self.info is None:
            self.handler.wait_for_etcd(report=self.say)
        done = threading.Event()
        reporter = threading.Thread(target=report_progress, args=(self.handler.progress, self.say, done), name="progress",
                                    daemon=True)
        reporter.start()
        try:
            while True:
                try:
                    info = self.handler.next_rendezvous()
                    break
                except RendezvousCredentialsError:
                    raise
                except RendezvousConnectionError as exc:
                    self.say(f"lost etcd while joining a round: {exc}")
                    self.handler.wait_for_etcd(report=self.say)
        finally:
            done.set()
            reporter.join(timeout=2)
        self.say(
            f"round {info.round}: group rank {info.group_rank} of {info.group_world_size} nodes, "
            f"global ranks {info.base_global_rank}..{info.base_global_rank + self.config.nproc_per_node - 1} "
            f"of {info.world_size}, master {info.master_addr}:{info.master_port}"
        )
        if info.max_restarts != self.config.max_restarts and not self._told_budget:
            self._told_budget = True
            self.say(
                f"--max-restarts {self.config.max_restarts} differs from the job's {info.max_restarts} "
                "(the first agent's); following the job's"
            )
        return info

    def _specs(self, info: RendezvousInfo, layout: Layout) -> list[WorkerSpec]:
        n = self.config.nproc_per_node
        return [
            WorkerSpec(
                local_rank=i, local_world_size=n, base_global_rank=info.base_global_rank, world_size=info.world_size,
                group_rank=info.group_rank, group_world_size=info.group_world_size, master_addr=info.master_addr,
                master_port=info.master_port, run_id=info.run_id, restart_count=info.restart_count,
                max_restarts=info.max_restarts, role=self.config.role, error_file=layout.ranks[i].error_file,
                virtual_local_rank=self.config.virtual_local_rank,
                heartbeat_file=os.path.join(self._beats_dir, f"{self.attempt}-{i}.beat"),
            )
            for i in range(n)
        ]

    def _monitor(self, group: WorkerGroup) -> RoundResult:
        """Until the workers end or the membership changes.

        Membership changes arrive by watch at once; the workers are looked at every monitor
        interval, and more often during the first second (short jobs end sooner).
        """
        started = time.monotonic()
        while True:
            result = self._outcome(group)
            if result is not None:
                return result
            verdict = self._hangs.tick(self._status.exited, self._peer_finished) if self._hangs is not None else None
            if verdict is not None:
                return RoundResult(RoundOutcome.HUNG, verdict=verdict)
            interval = self.config.monitor_interval
            if time.monotonic() - started < 1.0:
                interval = min(interval, 0.02)
            if self.handler.membership_changed(timeout=interval):
                result = self._outcome(group)
                if result is not None:
                    return result
                self.say(self._why_changed())
                return RoundResult(RoundOutcome.MEMBERSHIP_CHANGED)

    def _outcome(self, group: WorkerGroup) -> RoundResult | None:
        """How the round ended, or None while the workers run. Fencing is checked before and after
        looking at the workers, since workers the reaper killed look like workers that failed."""
        if self._fenced():
            return RoundResult(RoundOutcome.FENCED)
        status = self._status = group.poll()
        if status.state is GroupState.FAILED and self._fenced(settle=0.1):
            return RoundResult(RoundOutcome.FENCED)
        if status.state is GroupState.SUCCEEDED:
            return RoundResult(RoundOutcome.SUCCEEDED, status)
        if status.state is GroupState.FAILED:
            return RoundResult(RoundOutcome.FAILED, status)
        return None

    def _peer_finished(self) -> bool:
        monitor = self.handler.round_monitor()
        return monitor is not None and monitor.some_finished

    def _fenced(self, settle: float = 0.0) -> bool:
        """The renew deadline passed (the reaper killed the workers, or it is due now)."""
        deadline = time.monotonic() + settle
        while True:
            if self._reaper.fired() or self.handler.lease.overdue():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _record_failures(self, status: GroupStatus) -> None:
        for failure in status.failures:
            message = failure.error.message.strip().splitlines()[0] if failure.error and failure.error.message.strip() else None
            self.history.record(
                "worker_failed", self.info.round, rank=failure.rank, host=failure.host,
                exit_code=None if failure.exitcode < 0 else failure.exitcode, signal=failure.signal_name, message=message,
            )

    def _after_fence(self) -> None:
        silent = self.handler.lease.silent_for()
        self.history.record("node_left", self.info.round if self.info else 0,
                            reason=f"fenced: no lease renewal for {silent:.1f} s; it rejoins")
        self.say(
            f"no lease renewal from etcd for {silent:.1f} s (renew deadline {self.handler.settings.fence_after:g} s): "
            "stopped the workers so that no stale rank runs on; rejoining when etcd answers"
        )
        self.handler.lease.handled()
        self._reaper.clear()

    def _why_changed(self) -> str:
        """One line with the facts: why this node's workers stop for a new round."""
        try:
            state = self.handler.job_state()
            monitor = self.handler.round_monitor()
        except RendezvousError:
            return "etcd unreachable: re-rendezvous"
        return change_line(state, monitor, lease_lost=self.handler.lease.lost(), restarts=self.info.restart_count,
                           budget=self.info.max_restarts)

    def _job_state(self) -> JobState | None:
        try:
            return self.handler.job_state()
        except RendezvousError:
            return None

    def _exit_barrier(self) -> None:
        """Say this node finished; when every participant has, close the job."""
        try:
            self.handler.finish()
            if self.handler.all_finished(timeout=self.config.exit_barrier_timeout):
                self._close("the job finished")
        except RendezvousError as exc:
            self.say(f"workers succeeded; could not record it in etcd ({exc})")

    def _close(self, reason: str, *, failed: bool = False) -> None:
        self.history.record("job_closed", self.info.round if self.info else 0, reason=reason, failed=failed, by="agent")
        try:
            self.handler.set_closed(reason, failed=failed)
        except RendezvousError as exc:
            self.say(f"could not mark the job closed: {exc}")
