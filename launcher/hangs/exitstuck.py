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
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rendezvous.errors import RendezvousError

from .native import blocked_in, left_script, native_stack
from .procstat import Idleness, Usage, tree_usage

__all__ = [
    "EXIT_STUCK_TIMEOUT",
    "StuckWorker",
    "stuck_ranks",
    "ExitWatch",
    "others_done",
    "say_quiet",
]

EXIT_STUCK_TIMEOUT = 60.0  # --exit-stuck-timeout's default: seconds of doing nothing after the others exited 0
LOOK_EVERY = 1.0  # seconds between reads of a live worker's processes once its peers are exiting


@dataclass(frozen=True)
class StuckWorker:
    """A worker judged stuck at exit, with what it was blocked in."""

    local_rank: int
    rank: int
    pid: int
    quiet: float  # seconds it did nothing, after every other rank had exited 0
    blocked: str  # one line: its main thread's innermost frames
    stack: str  # every thread's stack as the tool printed it ("" where none could be read)
    past_script: bool = False  # its stack shows it past its script's code (``left_script``)

    def line(self, round_: int) -> str:
        if self.past_script:
            when = (
                f"alive {self.quiet:.0f} s with no CPU and no I/O after its script's code returned (its stack: "
                f"freeing what the script left), every other rank of round {round_} having exited 0 or stopped "
                "the same way"
            )
        else:
            when = (
                f"alive {self.quiet:.0f} s after every other rank of round {round_} exited 0, with no CPU and "
                "no I/O all that time"
            )
        return (
            f"rank {self.rank} is stuck at exit: {when}; blocked in {self.blocked}; ending it "
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
            "past_script": self.past_script,
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
    that ranks stuck on several nodes are judged too.

    Before any rank of the round exited 0, the workers are read slowly (every quarter of the bound):
    once every local rank has done nothing for the bound, each one's stack is read, once a quiet
    stretch; when all of them are past their script's code (``left_script``), the round is ending
    here as if they had exited 0 -- a round every rank of which is stuck at exit ends too, and a
    round hung in a collective (its stacks inside the script) is never judged."""

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
        read_stack: Callable[[int], tuple[str, str]] = native_stack,
    ) -> None:
        self._ranks, self._quiet, self._said = tuple(local_ranks), quiet, False
        self._pid_of, self._bound, self._others_done = pid_of, bound, others_done
        self._clock, self._read_stack = clock, read_stack
        self._every = min(LOOK_EVERY, max(bound / 4, 0.05))
        self._slow = max(LOOK_EVERY, bound / 4)  # between reads before any rank exited 0
        self._idleness = Idleness(pid_of, clock, usage)  # the hang watch's measure of doing nothing
        self._quiet_for: dict[int, float] = {}  # local rank: seconds it has done nothing, as last read
        self._stacks: dict[int, tuple[str, str]] = {}  # local rank: its stack, read in this quiet stretch
        self._asked = self._looked = -float("inf")  # when others_done was last asked (and the slow read) ...
        self._alone = False  # ... and what it said
        self._ending = False  # a rank of the round exited 0 (here or on a node that said so)
        self._past = False  # no rank exited 0, and every one here is past its script's code (its stack)

    def quiet_for(self, local_rank: int) -> float:
        return self._quiet_for.get(local_rank, 0.0)

    def stuck(self, exited: frozenset[int], ending: bool, base_rank: int) -> list[StuckWorker]:
        """The workers stuck at exit now (``tick``), each with its stack read (``base_rank``: the
        global rank of local rank 0)."""
        found = []
        for local_rank in self.tick(exited, ending):
            pid = self._pid_of(local_rank)
            if pid is not None:
                stack, tool = self._stack(local_rank, pid)
                rank, quiet = base_rank + local_rank, self.quiet_for(local_rank)
                past = left_script(stack, tool)
                found.append(StuckWorker(local_rank, rank, pid, quiet, blocked_in(stack, tool), stack, past))
        return found

    def tick(self, exited: frozenset[int], ending: bool) -> tuple[int, ...]:
        """``exited``: the local ranks that exited 0; ``ending``: a worker of the round exited 0
        somewhere. The local ranks stuck at exit now (usually none)."""
        if self._bound <= 0:
            return ()
        if not self._watching(ending or bool(exited)):
            return ()
        self._look(exited)
        now = self._clock()
        stuck = stuck_ranks(self._quiet_for, exited, self._ranks, self._bound)
        if not stuck:
            self._past = False  # they work again: not past their script, and this node is not done
            if self._said:
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

    def _watching(self, ending: bool) -> bool:
        """Whether the round is ending here: a rank exited 0 (quiet counted from then on), or every
        live rank here is past its script's code (read slowly until then)."""
        if ending and not self._ending and not self._past:
            self._quiet_for.clear()
            for local_rank in self._ranks:  # the quiet stretch starts when the round began ending
                self._idleness.idle_for(local_rank, 0.0)
        self._ending = ending
        if ending or self._past:
            return True
        self._past = self._past_script()
        return self._past

    def _past_script(self) -> bool:
        now = self._clock()
        if now - self._looked < self._slow:
            return False
        self._looked = now
        self._look(frozenset())
        if stuck_ranks(self._quiet_for, (), self._ranks, self._bound) != self._ranks:
            return False
        return all(left_script(*self._stack(r, self._pid_of(r))) for r in self._ranks)

    def _look(self, exited: frozenset[int]) -> None:
        """How long each live worker has done nothing, read now; a stack read in a quiet stretch
        that ended is forgotten."""
        for local_rank in self._ranks:  # a rank gone forgets its quiet stretch
            silent = 0.0 if local_rank in exited else math.inf
            self._quiet_for[local_rank] = self._idleness.idle_for(local_rank, silent)
        self._stacks = {r: s for r, s in self._stacks.items() if self.quiet_for(r) >= self._bound}

    def _stack(self, local_rank: int, pid: int | None) -> tuple[str, str]:
        if local_rank not in self._stacks:
            self._stacks[local_rank] = self._read_stack(pid) if pid is not None else ("", "proc")
        return self._stacks[local_rank]

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
