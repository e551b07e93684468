"""A worker stuck at exit: still alive a bounded time after every other rank of its round exited 0,
and doing nothing at all in that time -- no CPU, no byte read or written, no process started or
ended in its tree (``procstat.quiet``, read about once a second).

That is how PyTorch's own teardown deadlock looks from outside: the main thread frees the DDP
model as ``main()`` returns and joins a gloo thread while holding the GIL; the gloo thread waits
for the GIL to free a Python object; neither ever runs again. The training is complete -- in
synchronous training the stuck rank took part in every collective the others made, and they all
exited 0 -- so the agent names the rank and what it is blocked in (its native stack, where py-spy
or gdb can read it), ends it, and the round counts as succeeded. A rank that uses CPU or does I/O
(rank 0 saving a large file after the others left) is never judged stuck, however long it takes.

The decision is pure (``stuck_ranks``); ``ExitWatch`` reads the processes; ``native_stack`` and
``blocked_in`` say where the process is.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rendezvous.errors import RendezvousError

from .procstat import Idleness, Usage, tree_usage

__all__ = [
    "EXIT_STUCK_TIMEOUT",
    "StuckWorker",
    "stuck_ranks",
    "ExitWatch",
    "others_done",
    "say_quiet",
    "native_stack",
    "blocked_in",
]

EXIT_STUCK_TIMEOUT = 60.0  # --exit-stuck-timeout's default: seconds of doing nothing after the others exited 0
LOOK_EVERY = 1.0  # seconds between reads of a live worker's processes once its peers are exiting
STACK_TIMEOUT = 20.0  # seconds py-spy or gdb may take to read a stack


@dataclass(frozen=True)
class StuckWorker:
    """A worker judged stuck at exit, with what it was blocked in."""

    local_rank: int
    rank: int
    pid: int
    quiet: float  # seconds it did nothing, after every other rank had exited 0
    blocked: str  # one line: its main thread's innermost frames
    stack: str  # every thread's stack as the tool printed it ("" where none could be read)

    def line(self, round_: int) -> str:
        return (
            f"rank {self.rank} is stuck at exit: alive {self.quiet:.0f} s after every other rank of round "
            f"{round_} exited 0, with no CPU and no I/O all that time; blocked in {self.blocked}; ending it "
            "(its training had finished with the others': the round succeeds)"
        )

    def details(self) -> dict:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "quiet": round(self.quiet, 1),
            "blocked": self.blocked,
            "stack": self.stack[-4000:],
        }


def stuck_ranks(quiet_for: Mapping[int, float], exited: Collection[int], local_ranks: Collection[int], bound: float):
    """The live local ranks stuck at exit, as far as this node can tell: every local rank exited 0
    or has done nothing for ``bound`` seconds (``quiet_for``: local rank -> seconds), and at least
    one is live. Empty otherwise -- one live rank still at work means none is judged. (The other
    nodes' ranks are asked about separately.)"""
    live = [r for r in local_ranks if r not in exited]
    if not live or bound <= 0:
        return ()
    if all(quiet_for.get(r, 0.0) >= bound for r in live):
        return tuple(sorted(live))
    return ()


class ExitWatch:
    """Follows this node's live workers once the round is ending (a worker exited 0 here, or a
    peer node finished): how long each has done nothing. ``tick`` returns the local ranks to judge
    stuck; whether every other node is done -- its workers exited 0, or those alive went quiet at
    exit as these did -- is asked of ``others_done`` only then. ``quiet(True)`` tells the other
    nodes that this node's live workers went quiet (once; ``quiet(False)`` if they work again), so
    that ranks stuck on several nodes are judged too."""

    def __init__(
        self,
        local_ranks: Collection[int],
        pid_of: Callable[[int], int | None],
        bound: float,
        others_done: Callable[[], bool],
        *,
        quiet: Callable[[bool], None] = lambda going: None,
        clock: Callable[[], float] = time.monotonic,
        usage: Callable[[int | None], Usage | None] = tree_usage,
    ) -> None:
        self._ranks, self._quiet, self._said = tuple(local_ranks), quiet, False
        self._pid_of, self._bound, self._others_done = pid_of, bound, others_done
        self._clock, self._usage = clock, usage
        self._every = min(LOOK_EVERY, max(bound / 4, 0.05))
        self._idleness = Idleness(pid_of, clock, usage)  # the hang watch's measure of doing nothing
        self._quiet_for: dict[int, float] = {}  # local rank: seconds it has done nothing, as last read
        self._asked = -float("inf")  # when others_done was last asked ...
        self._alone = False  # ... and what it said

    def quiet_for(self, local_rank: int) -> float:
        return self._quiet_for.get(local_rank, 0.0)

    def stuck(self, exited: frozenset[int], ending: bool, base_rank: int) -> list[StuckWorker]:
        """The workers stuck at exit now (``tick``), each with its stack read (``base_rank``: the
        global rank of local rank 0)."""
        found = []
        for local_rank in self.tick(exited, ending):
            pid = self._pid_of(local_rank)
            if pid is not None:
                stack, tool = native_stack(pid)
                rank, quiet = base_rank + local_rank, self.quiet_for(local_rank)
                found.append(StuckWorker(local_rank, rank, pid, quiet, blocked_in(stack, tool), stack))
        return found

    def tick(self, exited: frozenset[int], ending: bool) -> tuple[int, ...]:
        """``exited``: the local ranks that exited 0; ``ending``: a worker of the round exited 0
        somewhere. The local ranks stuck at exit now (usually none)."""
        watching = self._bound > 0 and (ending or bool(exited))
        for local_rank in self._ranks:  # a rank not watched (or gone) forgets its quiet stretch
            silent = math.inf if watching and local_rank not in exited else 0.0
            self._quiet_for[local_rank] = self._idleness.idle_for(local_rank, silent)
        if not watching:
            return ()
        now = self._clock()
        quiet_for = dict(self._quiet_for)
        stuck = stuck_ranks(quiet_for, exited, self._ranks, self._bound)
        if not stuck and self._said:  # they work again: this node is not done
            self._said = False
            self._quiet(False)
        if not stuck or now - self._asked < self._every:
            return ()
        if not self._said:  # said before asking: a node whose ranks are stuck too waits for this one
            self._said = True
            self._quiet(True)
        self._asked, self._alone = now, self._others_done()
        if self._alone:
            self._said = False  # they end now: the round's end says the rest
        return stuck if self._alone else ()

    def covers(self, local_rank: int, exited: frozenset[int]) -> bool:
        """The rank is this watch's to judge, not the hang watch's: every other rank of the round
        exited 0 (the other nodes asked at most once per look interval), so no peer waits on it
        and a restart would redo finished training."""
        others = [r for r in self._ranks if r != local_rank]
        if local_rank in exited or not all(r in exited for r in others):
            return False
        now = self._clock()
        if now - self._asked >= self._every:
            self._asked, self._alone = now, self._others_done()
        return self._alone


def others_done(monitor: Callable[[], Any], node: str) -> Callable[[], bool]:
    """Asks whether every node of the round but ``node`` said its workers all exited 0 (``monitor``:
    the round's ``JobMonitor``, whose ``unfinished`` reads etcd on a node that does not keep it)."""

    def ask() -> bool:
        try:
            round_monitor = monitor()
            unfinished = round_monitor.unfinished() if round_monitor is not None else None
        except RendezvousError:
            return False  # etcd away: nothing is judged until it answers
        return unfinished is not None and set(unfinished) <= {node}

    return ask


def say_quiet(handler: Any) -> Callable[[bool], None]:
    """Tells the round (``handler.finish(quiet=...)``: one write of this node's key) whether its live
    workers went quiet at exit; etcd away: nothing said (the fence deals with that)."""

    def say(going: bool) -> None:
        try:
            handler.finish(quiet=going)
        except RendezvousError:
            pass

    return say


def native_stack(pid: int, timeout: float = STACK_TIMEOUT) -> tuple[str, str]:
    """Every thread's stack of a live process and the tool that read it: py-spy's native and
    Python frames, else gdb's backtraces, else each thread's name and kernel wait channel."""
    spy = shutil.which("py-spy") or _beside_python("py-spy")
    if spy is not None:
        text = _run([spy, "dump", "--native", "--pid", str(pid)], timeout)
        if "Thread" in text:
            return text, "py-spy"
    gdb = shutil.which("gdb")
    if gdb is not None:
        text = _run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 16"], timeout)
        if "#0" in text:
            return text, "gdb"
    return _wait_channels(pid), "proc"


def blocked_in(stack: str, tool: str, frames: int = 4) -> str:
    """One line: the main thread's innermost named frames, innermost first."""
    if tool == "py-spy":
        names = _spy_main_frames(stack)
    elif tool == "gdb":
        names = _gdb_main_frames(stack)
    else:
        return (stack.splitlines() or ["nothing could be read"])[0] + " (no py-spy or gdb here for its frames)"
    return " < ".join(names[:frames]) if names else "frames that could not be read"


def _spy_main_frames(text: str) -> list[str]:
    """py-spy's main thread: its two innermost named native frames (not bare addresses, nor the
    call machinery of ctypes and libffi), then its two innermost Python frames."""
    lines, native, python = text.splitlines(), [], []
    start = next((i for i, line in enumerate(lines) if '"MainThread"' in line), None)
    if start is None:
        return []
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        frame = line.strip()
        if ".py:" in frame or "(<frozen" in frame:
            python.append(frame)
        elif not frame.startswith("0x") and not any(m in frame for m in _MACHINERY) and not python:
            native.append(frame)
    return native[:2] + python[:2]


_MACHINERY = ("libffi", "ffi_call", "callproc.c", "_ctypes.c", "(python3", "ceval.c", "call.c")


_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+)")


def _gdb_main_frames(text: str) -> list[str]:
    """gdb's thread 1 (the main thread): each frame's function name."""
    names, inside = [], False
    for line in text.splitlines():
        if line.startswith("Thread "):
            inside = line.startswith("Thread 1 ")
        elif inside and (match := _GDB_FRAME.match(line)) and match.group(1) != "??":
            names.append(match.group(1))
    return names


def _wait_channels(pid: int) -> str:
    """Each thread's name and what the kernel says it waits in (``/proc/PID/task/TID/wchan``)."""
    rows = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return "its threads could not be read"
    for tid in tids:
        rows.append(f"{_read(f'/proc/{pid}/task/{tid}/comm')} waits in {_read(f'/proc/{pid}/task/{tid}/wchan') or '?'}")
    return "; ".join(rows)


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return ""


def _beside_python(name: str) -> str | None:
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None


def _run(command: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout
