"""Start, monitor and stop one node's worker group. No worker outlives its agent.

Each worker is a process in a new session (its own process group), started from the agent's main
thread by ``subprocess`` (no Python code runs between fork and exec, which matters in a process
with gRPC threads). Two guards end the workers when the agent dies, however it dies:

- a parent-death signal (``setpriv --pdeathsig KILL``) on each worker process itself;
- the reaper process (``launcher/reaper.py``), which SIGKILLs every registered worker process
  group -- grandchildren included -- as soon as its pipe from the agent closes.

Stopping is SIGTERM to each process group, a grace period, then SIGKILL to the group and to any
descendant that left it (found with psutil).
"""

from __future__ import annotations

import enum
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Mapping, Sequence

from rendezvous.lifeline import die_with_parent

from .env import WorkerSpec, worker_env
from .errorfile import ErrorRecord, read_error
from .logs import STDERR, STDOUT, LogPump, Std, plan_stream

__all__ = ["GroupState", "WorkerFailure", "GroupStatus", "Reaper", "WorkerGroup", "attempt_dir", "LogSettings"]

_REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")


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


@dataclass(frozen=True)
class GroupStatus:
    state: GroupState
    failures: tuple[WorkerFailure, ...] = ()

    @property
    def first_failure(self) -> WorkerFailure | None:
        """The failure that happened first: by its error file's time, else when it was seen; then rank."""
        if not self.failures:
            return None
        return min(self.failures, key=lambda f: (f.error.timestamp if f.error and f.error.timestamp else int(f.at), f.at, f.rank))


@dataclass(frozen=True)
class LogSettings:
    root: str  # per-job log directory; attempt_<n>/<local rank>/ under it
    redirects: dict[int, int] | int = Std.NONE
    tee: dict[int, int] | int = Std.NONE
    ranks_filter: frozenset[int] | None = None


def attempt_dir(root: str, attempt: int, local_rank: int) -> str:
    return os.path.join(root, f"attempt_{attempt}", str(local_rank))


class Reaper:
    """The helper process that kills registered process groups when this process exits, or when
    the fence deadline passes without a newer one (``launcher/reaper.py``)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", _REAPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
        )
        os.set_blocking(self._process.stdout.fileno(), False)
        self._lock = threading.Lock()
        self._fired = False

    def _send(self, line: str) -> None:
        stdin = self._process.stdin
        if stdin is None:
            return
        with self._lock:
            try:
                stdin.write(line.encode() + b"\n")
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass

    def register(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def configure(self, client_config: dict, sys_path: Sequence[str], history: dict | None = None) -> None:
        """How to reach etcd to revoke the lease once this process is gone (and where to record that)."""
        self._send("C" + json.dumps({"client": client_config, "sys_path": list(sys_path), "history": history}))

    def note_round(self, round_: int) -> None:
        self._send(f"R{round_}")

    def arm(self, lease_id: int, deadline: float) -> None:
        """The lease to revoke after this process dies, and the time its workers must be gone by."""
        self._send(f"L{lease_id}\nD{deadline!r}")

    def fired(self) -> bool:
        """The deadline passed and the reaper killed the workers (sticky until ``clear``)."""
        if not self._fired and self._process.stdout is not None:
            try:
                data = os.read(self._process.stdout.fileno(), 4096)
            except (BlockingIOError, OSError):
                data = b""
            self._fired = b"F" in data
        return self._fired

    def clear(self) -> None:
        self.fired()
        self._fired = False

    def close(self) -> None:
        """Stop it after a clean exit: the workers are already stopped, and the lease is not its to revoke."""
        self._send("L0\nD")
        if self._process.stdin is not None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
        if self._process.stdout is not None:
            self._process.stdout.close()


class _Worker:
    def __init__(self, spec: WorkerSpec, process: subprocess.Popen) -> None:
        self.spec = spec
        self.process = process
        self.exited_at: float | None = None


class WorkerGroup:
    """One attempt's local workers: one process per local rank, all running ``argv``."""

    def __init__(
        self, argv: Sequence[str], logs: LogSettings, pump: LogPump, reaper: Reaper | None, *,
        console_out: BinaryIO | None = None, console_err: BinaryIO | None = None, lifeline: bool = True,
    ) -> None:
        self.argv = list(argv)
        self.logs = logs
        self._pump = pump
        self._reaper = reaper
        self._out = console_out if console_out is not None else sys.stdout.buffer
        self._err = console_err if console_err is not None else sys.stderr.buffer
        self._lifeline = lifeline
        self._workers: list[_Worker] = []
        self._host = socket.gethostname()

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def start(self, specs: Sequence[WorkerSpec], attempt: int, inherited: Mapping[str, str]) -> None:
        """Start one worker per spec. Must be called from the main thread (parent-death signals)."""
        if self._workers:
            raise RuntimeError("the worker group is already running")
        argv = die_with_parent(self.argv, "KILL") if self._lifeline else self.argv
        for spec in specs:
            directory = attempt_dir(self.logs.root, attempt, spec.local_rank)
            os.makedirs(directory, exist_ok=True)
            if os.path.exists(spec.error_file):
                os.unlink(spec.error_file)
            stdout, out_read, out_file = self._stream(spec, STDOUT, directory)
            stderr, err_read, err_file = self._stream(spec, STDERR, directory)
            try:
                process = subprocess.Popen(
                    argv, env=worker_env(spec, inherited), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                    start_new_session=True, close_fds=True,
                )
            finally:
                for target in (stdout, stderr):
                    if isinstance(target, int) and target >= 0:
                        os.close(target)
                    elif hasattr(target, "close"):
                        target.close()
            if self._reaper is not None:
                self._reaper.register(process.pid)
            self._workers.append(_Worker(spec, process))
            prefix = f"[rank{spec.rank}]:"
            if out_read is not None:
                self._pump.add(out_read, prefix, self._out, out_file)
            if err_read is not None:
                self._pump.add(err_read, prefix, self._err, err_file)

    def _stream(self, spec: WorkerSpec, which: int, directory: str):
        """(what the worker writes to, read end for the pump or None, log file for the pump or None)."""
        plan = plan_stream(spec.local_rank, which, self.logs.redirects, self.logs.tee, self.logs.ranks_filter)
        path = os.path.join(directory, "stdout.log" if which == STDOUT else "stderr.log")
        if plan.console:
            read_end, write_end = os.pipe()
            return write_end, read_end, open(path, "wb") if plan.file else None
        if plan.file:
            return open(path, "wb"), None, None
        return subprocess.DEVNULL, None, None

    def poll(self) -> GroupStatus:
        if not self._workers:
            return GroupStatus(GroupState.SUCCEEDED)
        now = time.time()
        running = False
        failures = []
        for worker in self._workers:
            code = worker.process.poll()
            if code is None:
                running = True
                continue
            if worker.exited_at is None:
                worker.exited_at = now
            if code != 0:
                failures.append(WorkerFailure(
                    worker.spec.local_rank, worker.spec.rank, code, self._host, worker.exited_at,
                    worker.spec.error_file, read_error(worker.spec.error_file),
                ))
        if failures:
            return GroupStatus(GroupState.FAILED, tuple(failures))
        return GroupStatus(GroupState.RUNNING if running else GroupState.SUCCEEDED)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every worker's process group, wait up to ``grace`` s, then SIGKILL what is left."""
        workers, self._workers = self._workers, []
        if not workers:
            return
        import psutil  # only needed here: keep it off the agent's start-up path

        stray: list[psutil.Process] = []
        for worker in workers:
            stray += _descendants(worker.process.pid)
            _signal_group(worker.process.pid, signal.SIGTERM)
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
        self._pump.drain(timeout=1.0)


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
