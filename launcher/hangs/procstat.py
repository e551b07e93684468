"""What the kernel says of a watched worker's processes: the seconds it waited for a CPU (the node
starved it: not silence) and whether it did anything at all while silent (a worker that does
nothing, in none of its processes, is hung sooner than a busy one: ``hangrules.IDLE``).

Read from ``/proc`` (``schedstat``) and through psutil (the process tree's CPU time, read and write
calls, states); the decisions on what was read are pure (``quiet``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

__all__ = [
    "run_delay",
    "Starvation",
    "Usage",
    "tree_usage",
    "quiet",
    "is_stopped",
    "Idleness",
    "LATE",
    "LISTEN_AFTER",
    "LISTEN_EVERY",
]

LATE = 0.2  # seconds past its interval after which the agent's loop counts as having woken late
LISTEN_AFTER = 0.25  # seconds of silence after which a worker's processes are read ...
LISTEN_EVERY = 0.2  # ... at most this often
SLACK = 0.02  # seconds of CPU (or of waiting for one) an idle process tree may still show: clock ticks ...
SHARE = 0.02  # ... and this share of the time looked at (a timer thread, a queue's poll)


def run_delay(pid: int | None) -> float | None:
    """Seconds the process has spent runnable but waiting for a CPU (``/proc/PID/schedstat``'s
    second field), None when unknown (no such process, no schedstats)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class Starvation:
    """What the node's starvation cost each watched worker since the last look: its own wait for a
    CPU, and the agent's loop waking later than its interval (both credited, not counted as silence)."""

    def __init__(self, pid_of: Callable[[int], int | None], interval: float, clock: Callable[[], float]) -> None:
        self._pid_of, self._interval, self._clock = pid_of, interval, clock
        self._delays: dict[int, float] = {}
        self._looked: float | None = None

    def since_last_look(self, local_ranks: Sequence[int]) -> dict[int, float]:
        now = self._clock()
        late = 0.0 if self._looked is None else max(0.0, now - self._looked - self._interval - LATE)
        self._looked = now
        credits = {}
        for local_rank in local_ranks:
            delay = run_delay(self._pid_of(local_rank))
            before = self._delays.get(local_rank)
            waited = delay - before if delay is not None and before is not None and delay >= before else 0.0
            if delay is not None:
                self._delays[local_rank] = delay
            credits[local_rank] = max(waited, late)  # the loop's lateness and the wait overlap: the larger
        return credits

    def looked(self) -> None:
        """The look is over (its etcd calls included): the loop's next wait starts now, and only a
        wake-up later than that wait's interval counts as late."""
        self._looked = self._clock()


@dataclass(frozen=True)
class Usage:
    """A worker's process tree (it and its live descendants: a DataLoader's workers) at one look."""

    pids: frozenset[int]
    cpu: float  # seconds on a CPU, reaped children's included
    waited: float  # seconds its processes' main threads were runnable but waiting for a CPU (schedstat)
    chars: int  # bytes through read and write calls, sockets and pipes included
    busy: bool  # a process of the tree is running, or in an uninterruptible (disk) wait


def tree_usage(pid: int | None) -> Usage | None:
    """The tree's usage now; None when its process is gone."""
    if pid is None:
        return None
    try:
        tree = [psutil.Process(p) for p in (pid, *_descendants(pid))]
    except psutil.Error:
        return None
    pids, cpu, waited, chars, busy = set(), 0.0, 0.0, 0, False
    for process in tree:
        try:
            with process.oneshot():
                times, io, status = process.cpu_times(), process.io_counters(), process.status()
        except psutil.Error:  # a descendant that ended between the listing and the read
            continue
        pids.add(process.pid)
        cpu += times.user + times.system + times.children_user + times.children_system
        waited += run_delay(process.pid) or 0.0
        chars += io.read_chars + io.write_chars
        busy = busy or status in (psutil.STATUS_RUNNING, psutil.STATUS_DISK_SLEEP)
    return Usage(frozenset(pids), cpu, waited, chars, busy)


def _descendants(pid: int) -> list[int]:
    """The process's live descendants, from each thread's ``/proc/PID/task/TID/children`` (no scan
    of every process, as psutil's ``children`` does); psutil's way where the kernel lacks that file
    (not where a thread ended between the listing and the read)."""
    found, pending = [], [pid]
    while pending:
        parent = pending.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as listing:
                    kids = [int(k) for k in listing.read().split()]
            except FileNotFoundError:
                if os.path.isdir(f"/proc/{parent}/task/{tid}"):  # the thread is there, the file is not
                    return [c.pid for c in psutil.Process(pid).children(recursive=True)]
                continue  # the thread ended since the listing
            except (OSError, ValueError):
                continue
            found += kids
            pending += kids
    return found


def is_stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, a tracer's stop): nothing runs in it until it is let go."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def quiet(before: Usage, after: Usage, seconds: float) -> bool:
    """Nothing happened in the tree between two looks ``seconds`` apart: the same processes, no
    byte read or written, no more CPU time (or wait for one) than timer ticks, none running."""
    used = (after.cpu - before.cpu) + (after.waited - before.waited)
    return (
        after.pids == before.pids
        and after.chars == before.chars
        and not after.busy
        and 0.0 <= used <= SLACK + SHARE * seconds
    )


class Idleness:
    """How long each silent worker's processes have done nothing at all, up to now. A worker is read
    only once silent for ``LISTEN_AFTER`` seconds, so a healthy job costs no reads."""

    def __init__(
        self,
        pid_of: Callable[[int], int | None],
        clock: Callable[[], float],
        usage: Callable[[int | None], Usage | None] = tree_usage,
    ) -> None:
        self._pid_of, self._clock, self._usage = pid_of, clock, usage
        self._since: dict[int, tuple[float, Usage, float]] = {}  # local rank: (quiet since, usage then, read at)

    def idle_for(self, local_rank: int, silent: float) -> float:
        """Seconds the worker's processes have been quiet, read now (0.0 while it is not silent)."""
        now, known = self._clock(), self._since.get(local_rank)
        if silent < LISTEN_AFTER:
            self._since.pop(local_rank, None)
            return 0.0
        if known is not None and now - known[2] < LISTEN_EVERY:
            return known[2] - known[0]  # as of the last read: idleness is never counted ahead of what was seen
        usage = self._usage(self._pid_of(local_rank))
        if usage is None:
            self._since.pop(local_rank, None)
            return 0.0
        since, before = (known[0], known[1]) if known is not None else (now, usage)
        if not quiet(before, usage, now - since):
            since, before = now, usage
        self._since[local_rank] = (since, before, now)
        return now - since

    def excuse(self, local_ranks: Sequence[int]) -> None:
        """What these workers did since the last look was asked of them (their stacks, written on
        the watch's signal): it does not end their quiet stretch."""
        for local_rank in local_ranks:
            known = self._since.get(local_rank)
            if known is not None:
                usage = self._usage(self._pid_of(local_rank))
                if usage is not None:
                    self._since[local_rank] = (known[0], usage, known[2])
