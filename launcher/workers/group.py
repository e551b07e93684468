"""Start, monitor and stop one node's worker group. No worker outlives its agent.

Each worker is a process in a new session (its own process group), started from the agent's main
thread by ``subprocess`` (no Python code runs between fork and exec, which matters in a process
with gRPC threads). Two guards end the workers when the agent dies, however it dies:

- a parent-death signal (``setpriv --pdeathsig KILL``) on each worker process itself;
- the reaper process (``launcher/workers/reaper.py``), which SIGKILLs every registered worker process
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from launcher.output import Layout, LogPump, StreamPlan
from rendezvous.etcd.lifeline import die_with_parent

from .env import WorkerSpec, worker_env
from .errorfile import ErrorRecord, read_error
from .fence import FenceGuard

__all__ = ["GroupState", "WorkerFailure", "GroupStatus", "ReaperProcess", "reaper_sys_path", "WorkerGroup"]

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


def reaper_sys_path() -> list[str]:
    """Where the reaper imports the etcd client from if it has to revoke the lease: the directory of
    the ``rendezvous`` package, then this process's own path (the reaper starts with ``python -I -S``,
    without site-packages or PYTHONPATH, so that starting it costs the agent nothing more)."""
    import rendezvous

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(rendezvous.__file__))), *sys.path]
    return list(dict.fromkeys(p for p in paths if p))


class ReaperProcess:
    """The helper process that kills registered process groups when this process exits, or when
    the fence deadline passes without a newer one (``launcher/workers/reaper.py``); and the same
    deadline enforced inside this process too (``FenceGuard``), for an agent that wakes past it."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", _REAPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        os.set_blocking(self._process.stdout.fileno(), False)
        self._lock = threading.Lock()
        self._fired = False
        self._armed: float | None = None  # the last deadline sent
        self._handled: float | None = None  # the last deadline a ``clear`` dealt with
        self._guard = FenceGuard()

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
        self._guard.register(pgid)
        self._send(f"+{pgid}")

    def unregister(self, pgid: int) -> None:
        self._guard.unregister(pgid)
        self._send(f"-{pgid}")

    def configure(self, client_config: dict, sys_path: Sequence[str], history: dict | None = None) -> None:
        """How to reach etcd to revoke the lease once this process is gone (and where to record that)."""
        self._send("C" + json.dumps({"client": client_config, "sys_path": list(sys_path), "history": history}))

    def remove_at_exit(self, path: str) -> None:
        """A temporary ``elastic-*`` directory the reaper removes if this process dies (not on ``close``)."""
        self._send(f"T{path}")

    def note_round(self, round_: int) -> None:
        self._send(f"R{round_}")

    def arm(self, lease_id: int, deadline: float) -> None:
        """The lease to revoke after this process dies, and the time its workers must be gone by."""
        self._armed = deadline
        self._guard.arm(deadline)
        self._send(f"L{lease_id}\nD{deadline!r}")

    def fired(self) -> bool:
        """The deadline passed and the reaper (or this process's guard) killed the workers (sticky until ``clear``)."""
        if not self._fired and self._guard.fired():
            self._fired = True
        if not self._fired and self._process.stdout is not None:
            try:
                data = os.read(self._process.stdout.fileno(), 4096)
            except (BlockingIOError, OSError):
                data = b""
            self._fired = any(self._news(line) for line in data.split(b"\n") if line.startswith(b"F"))
        return self._fired

    def _news(self, line: bytes) -> bool:
        """An ``F<deadline>`` line from the reaper is news unless a ``clear`` already dealt with that
        deadline (the guard in this process may have killed the workers first)."""
        try:
            deadline = float(line[1:])
        except ValueError:
            return True
        return self._handled is None or deadline > self._handled

    def clear(self) -> None:
        """The fence was dealt with: forget it, and a late word from the reaper about the same deadline."""
        self.fired()
        if self._armed is not None and self._armed <= time.monotonic():
            self._handled = self._armed
        self._guard.clear()
        self._fired = False

    def close(self) -> None:
        """Stop it after a clean exit: the workers are already stopped, and the lease is not its to revoke."""
        self._guard.arm(None)
        self._guard.close()
        self._send("L0\nD\nT")
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
        self,
        argv: Sequence[str],
        pump: LogPump,
        reaper: ReaperProcess | None,
        *,
        console_out: BinaryIO | None = None,
        console_err: BinaryIO | None = None,
        lifeline: bool = True,
    ) -> None:
        self.argv = list(argv)
        self._pump = pump
        self._reaper = reaper
        self._out = console_out if console_out is not None else sys.stdout.buffer
        self._err = console_err if console_err is not None else sys.stderr.buffer
        self._lifeline = lifeline
        self._workers: list[_Worker] = []
        self._host = socket.gethostname()
        self._duplicates: list[BinaryIO] = []

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

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
        self._close_duplicates()
        duplicates = {
            which: open(path, "ab")
            for which, path in (("out", layout.filtered_stdout), ("err", layout.filtered_stderr))
            if path
        }
        self._duplicates = list(duplicates.values())
        for spec in specs:
            self._start_one(spec, layout, inherited, (wrap or {}).get(spec.local_rank, ()), duplicates)

    def _start_one(
        self, spec: WorkerSpec, layout: Layout, inherited: Mapping[str, str], wrap: Sequence[str], duplicates: dict
    ) -> None:
        """One worker: its process (in a session of its own, dying with the agent) and its pipes to the pump."""
        logs = layout.ranks[spec.local_rank]
        if os.path.isfile(spec.error_file):
            os.unlink(spec.error_file)
        out = self._stream(logs.stdout, self._out)
        err = self._stream(logs.stderr, self._err)
        argv = [*wrap, *self.argv]
        if self._lifeline:
            argv = die_with_parent(argv, "KILL")
        try:
            process = subprocess.Popen(
                argv,
                env=worker_env(spec, inherited),
                stdin=subprocess.DEVNULL,
                stdout=out[0],
                stderr=err[0],
                start_new_session=True,
                close_fds=True,
            )
        finally:
            for target in (out[0], err[0]):
                if isinstance(target, int) and target >= 0:
                    os.close(target)
                elif hasattr(target, "close"):
                    target.close()
        if self._reaper is not None:
            self._reaper.register(process.pid)
        self._workers.append(_Worker(spec, process))
        for (_, read_end, file), plan, console, which, needles in (
            (out, logs.stdout, self._out, "out", layout.stdout_filters),
            (err, logs.stderr, self._err, "err", layout.stderr_filters),
        ):
            if read_end is None:
                continue
            duplicate = (duplicates[which], needles) if which in duplicates and plan.prefixed and plan.console else None
            self._pump.add(
                read_end, logs.prefix if plan.prefixed else "", console if plan.console else None, file, duplicate
            )

    def _stream(self, plan: StreamPlan, console: BinaryIO):
        """(what the worker writes to, read end for the pump or None, log file for the pump or None)."""
        if plan.console and plan.file is None and not plan.prefixed:
            try:  # verbatim to the console: the worker writes to it directly, as under torchrun
                return os.dup(console.fileno()), None, None
            except (AttributeError, OSError, ValueError):
                pass  # not a real file (a test's buffer): copied by the pump, unchanged
        if plan.console:
            read_end, write_end = os.pipe()
            return write_end, read_end, open(plan.file, "wb") if plan.file else None
        if plan.file:
            return open(plan.file, "wb"), None, None
        return subprocess.DEVNULL, None, None

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
            if code == 0:
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

    def stop(self, grace: float = 30.0, signum: int = signal.SIGTERM) -> None:
        """``signum`` (SIGTERM) to every worker's process group, wait up to ``grace`` s, then SIGKILL
        what is left."""
        workers, self._workers = self._workers, []
        if not workers:
            return
        import psutil  # only needed here: keep it off the agent's start-up path

        stray: list[psutil.Process] = []
        for worker in workers:
            stray += _descendants(worker.process.pid)
            _signal_group(worker.process.pid, signum)
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
        self._close_duplicates()


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
