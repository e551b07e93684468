"""Start, monitor and stop one node's worker group. No worker outlives its agent.

Each worker is a process in a new session (its own process group), started by the group's
``Starter`` (``starters``: plain, or forked warm). Two guards end the workers when the agent dies,
however it dies:

- a parent-death signal on each worker process itself (``setpriv --pdeathsig KILL``, or the warm
  interpreter's ``prctl``);
- the reaper process (``launcher/reaper/reaper.py``), which SIGKILLs every registered worker process
  group -- grandchildren included -- as soon as its pipe from the agent closes.

Stopping is SIGTERM to each process group, a grace period, then SIGKILL to the group and to any
descendant that left it (found with psutil).
"""

from __future__ import annotations

import enum
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

from launcher.inprocess.keeper import Keeper
from launcher.output import Layout, LogPump, StreamPlan
from launcher.reaper.handle import ReaperProcess
from launcher.warmstart.starters import PlainStart, Process, Starter

from .env import WorkerSpec, worker_env
from .errorfile import ErrorRecord, read_error

__all__ = ["GroupState", "WorkerFailure", "GroupStatus", "WorkerGroup"]


class GroupState(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class WorkerFailure:
    local_rank: int
    rank: int
    exitcode: int  # negative: killed by that signal (subprocess's convention)
    host: str
    at: float  # when the agent saw it exit (seconds since the epoch)
    error_file: str
    error: ErrorRecord | None

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        """How it ended, as every summary says it: ``exit code 1`` or ``killed by SIGKILL``."""
        return f"killed by {self.signal_name}" if self.signal_name else f"exit code {self.exitcode}"


@dataclass(frozen=True)
class GroupStatus:
    state: GroupState
    failures: tuple[WorkerFailure, ...] = ()
    exited: frozenset[int] = frozenset()  # local ranks that exited 0 so far

    @property
    def first_failure(self) -> WorkerFailure | None:
        """The failure that happened first: by its error file's time, else when it was seen; then rank."""
        if not self.failures:
            return None
        return min(
            self.failures,
            key=lambda f: (f.error.timestamp if f.error and f.error.timestamp else int(f.at), f.at, f.rank),
        )


class _Worker:
    def __init__(self, spec: WorkerSpec, process: Process) -> None:
        self.spec = spec
        self.process = process
        self.exited_at: float | None = None


class _Stream(NamedTuple):
    """One of a worker's output streams: what it writes to, and (when the pump copies it) the read
    end of its pipe and the log file the pump writes."""

    target: Any  # a descriptor, a file, or subprocess.DEVNULL: as subprocess takes it
    read_end: int | None
    file: BinaryIO | None


class WorkerGroup:
    """One attempt's local workers: one process per local rank, all running ``argv``."""

    def __init__(
        self,
        argv: Sequence[str],
        pump: LogPump,
        reaper: ReaperProcess | None,
        *,
        console_out: BinaryIO | None = None,
        console_err: BinaryIO | None = None,
        starter: Starter | None = None,
        keeper: Keeper | None = None,
    ) -> None:
        self.argv = list(argv)
        self._pump = pump
        self._reaper = reaper
        self._out = console_out if console_out is not None else sys.stdout.buffer
        self._err = console_err if console_err is not None else sys.stderr.buffer
        self._starter = starter if starter is not None else PlainStart()
        self._workers: list[_Worker] = []
        self._keeper = keeper if keeper is not None else Keeper(None)  # elastic.inprocess workers across rounds
        self.in_place = False  # the last round parked under elastic.inprocess: its survivors go on in place
        self._host = socket.gethostname()
        self._duplicates: list[BinaryIO] = []
        self._stuck: set[int] = set()  # local ranks ended stuck at exit this round: they count as exited 0

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in (*self._workers, *self._keeper.kept.values())]

    def pid_of(self, local_rank: int) -> int | None:
        """The running worker process of a local rank (None: none runs)."""
        return next((w.process.pid for w in self._workers if w.spec.local_rank == local_rank), None)

    def under_inprocess(self) -> bool:
        """Whether this round's workers run under ``elastic.inprocess``: the survivors of a failure
        are resumed in place, not restarted."""
        return self._keeper.runs_under(self._workers)

    def park(self, grace: float, spare: Sequence[int] = ()) -> int:
        """Keep the running workers that are under ``elastic.inprocess`` (but the local ranks in
        ``spare``) for the next round: they leave ``train`` within ``grace`` seconds or are not kept.
        The workers not kept are left for ``stop``. Returns how many were kept."""
        self.in_place = self.under_inprocess()
        parked = {id(w) for w in self._keeper.park(self._workers, grace, spare)}
        self._workers = [w for w in self._workers if id(w) not in parked]
        return len(parked)

    def start(
        self,
        specs: Sequence[WorkerSpec],
        layout: Layout,
        inherited: Mapping[str, str],
        wrap: Mapping[int, Sequence[str]] | None = None,
    ) -> None:
        """Start one worker per spec, its output as ``layout`` says; ``wrap`` puts a command in front
        of a local rank's (CPU binding). Must be called from the main thread (parent-death signals)."""
        if self._workers:
            raise RuntimeError("the worker group is already running")
        self._stuck = set()
        self._close_duplicates()
        duplicates = {
            which: open(path, "ab")
            for which, path in (("out", layout.filtered_stdout), ("err", layout.filtered_stderr))
            if path
        }
        self._duplicates = list(duplicates.values())
        for spec in specs:
            resumed = self._keeper.resume(spec.local_rank, spec.error_file, worker_env(spec, inherited))
            if resumed is None:
                self._start_one(spec, layout, inherited, (wrap or {}).get(spec.local_rank, ()), duplicates)
            else:
                resumed.spec, resumed.exited_at = spec, None
                self._workers.append(resumed)
        self._end(self._keeper.release(), 0.0, signal.SIGKILL)  # kept, and then not resumed: a worker with no round

    def _start_one(
        self, spec: WorkerSpec, layout: Layout, inherited: Mapping[str, str], wrap: Sequence[str], duplicates: dict
    ) -> None:
        """One worker: its process (in a session of its own, dying with the agent) and its pipes to the pump."""
        logs = layout.ranks[spec.local_rank]
        if os.path.isfile(spec.error_file):
            os.unlink(spec.error_file)
        out = self._stream(logs.stdout, self._out)
        err = self._stream(logs.stderr, self._err)
        env = worker_env(spec, inherited)
        try:
            process = self._starter.start([*wrap, *self.argv], env, out.target, err.target)
        finally:
            for target in (out.target, err.target):
                if isinstance(target, int) and target >= 0:
                    os.close(target)
                elif hasattr(target, "close"):
                    target.close()
        if self._reaper is not None:
            self._reaper.register(process.pid)
        self._workers.append(_Worker(spec, process))
        for (_, read_end, file), plan, console, which, needles in (  # each _Stream
            (out, logs.stdout, self._out, "out", layout.stdout_filters),
            (err, logs.stderr, self._err, "err", layout.stderr_filters),
        ):
            if read_end is None:
                continue
            duplicate = (duplicates[which], needles) if which in duplicates and plan.prefixed and plan.console else None
            self._pump.add(
                read_end, logs.prefix if plan.prefixed else "", console if plan.console else None, file, duplicate
            )

    def _stream(self, plan: StreamPlan, console: BinaryIO) -> _Stream:
        if plan.console and plan.file is None and not plan.prefixed:
            try:  # verbatim to the console: the worker writes to it directly, as under torchrun
                return _Stream(os.dup(console.fileno()), None, None)
            except (AttributeError, OSError, ValueError):
                pass  # not a real file (a test's buffer): copied by the pump, unchanged
        if plan.console:
            read_end, write_end = os.pipe()
            return _Stream(write_end, read_end, open(plan.file, "wb") if plan.file else None)
        if plan.file:
            return _Stream(open(plan.file, "wb"), None, None)
        return _Stream(subprocess.DEVNULL, None, None)

    def _close_duplicates(self) -> None:
        for handle in self._duplicates:
            handle.close()
        self._duplicates = []

    def poll(self) -> GroupStatus:
        if not self._workers:
            return GroupStatus(GroupState.SUCCEEDED)
        now = time.time()
        running = False
        failures = []
        exited = set()
        for worker in self._workers:
            code = worker.process.poll()
            if code is None:
                running = True
                continue
            if worker.exited_at is None:
                worker.exited_at = now
            if code == 0 or worker.spec.local_rank in self._stuck:
                exited.add(worker.spec.local_rank)
            else:
                failures.append(
                    WorkerFailure(
                        worker.spec.local_rank,
                        worker.spec.rank,
                        code,
                        self._host,
                        worker.exited_at,
                        worker.spec.error_file,
                        read_error(worker.spec.error_file),
                    )
                )
        if failures:
            return GroupStatus(GroupState.FAILED, tuple(failures), frozenset(exited))
        return GroupStatus(GroupState.RUNNING if running else GroupState.SUCCEEDED, exited=frozenset(exited))

    def end_stuck(self, local_rank: int) -> None:
        """End a worker stuck at exit (``launcher.hangs.exitstuck``): SIGKILL to its process group at
        once (a deadlocked interpreter runs no handler); from now on it counts as exited 0."""
        worker = next((w for w in self._workers if w.spec.local_rank == local_rank), None)
        if worker is not None:
            self._stuck.add(local_rank)
            self._end([worker], 0.0, signal.SIGKILL)

    def stop(self, grace: float = 30.0, signum: int = signal.SIGTERM, *, kept: bool = True) -> None:
        """``signum`` (SIGTERM) and SIGCONT to every worker's process group, wait up to ``grace`` s,
        then SIGKILL what is left. ``kept``: the parked workers too (False: they wait for the next round)."""
        workers, self._workers = [*self._workers, *(self._keeper.release() if kept else ())], []
        if not workers:
            return
        self._end(workers, grace, signum)
        self._pump.drain(timeout=1.0)
        self._close_duplicates()

    def _end(self, workers: Sequence[_Worker], grace: float, signum: int) -> None:
        """``signum`` and SIGCONT to each worker's group, ``grace`` seconds, then SIGKILL to the
        groups and to descendants that left them; each one reaped is unregistered from the reaper."""
        if not workers:
            return
        import psutil  # only needed here: keep it off the agent's start-up path

        stray: list[psutil.Process] = []
        for worker in workers:
            stray += _descendants(worker.process.pid)
            _signal_group(worker.process.pid, signum)
            # a stopped worker (SIGSTOP, a frozen cgroup) takes the signal only once it runs again:
            # without this it would sit out the whole grace, and the job with it
            _signal_group(worker.process.pid, signal.SIGCONT)
        deadline = time.monotonic() + grace
        for worker in workers:
            try:
                worker.process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                pass
        for worker in workers:
            _signal_group(worker.process.pid, signal.SIGKILL)  # also sweeps grandchildren left behind
        for process in stray:
            try:
                process.kill()
            except psutil.Error:
                pass
        for worker in workers:
            try:
                worker.process.wait(timeout=5)  # SIGKILLed: only an unkillable (D state) process lingers
            except subprocess.TimeoutExpired:
                continue  # still there: leave it registered with the reaper
            if self._reaper is not None:
                self._reaper.unregister(worker.process.pid)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
