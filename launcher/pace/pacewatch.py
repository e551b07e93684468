"""The agent's straggler watch over one round: each monitor tick it reads its workers' own-work
timings from their heartbeat records (``scores.RankPace``), publishes this node's pace when it moved
(``rendezvous.job.paceboard``), scores each local rank against the job's fastest, and returns the
verdicts that changed.

Each node judges only its own ranks, from the workers' own clocks less their waits for a CPU (the
workers take them off, ``elastic.pace``): a late agent loop or a loaded node changes no figure, and
no node judges another. A rank is scored once the job has a pace from another rank to compare
with; a script whose steps are uneven alike on every rank scores alike everywhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.hangs.beatfile import BeatReader
from rendezvous.errors import RendezvousError
from rendezvous.job.paceboard import NodePace, PaceBoard

from .scores import SAMPLE, Change, RankPace, StragglerRule, score, worth_writing

__all__ = ["PacedWorker", "Straggler", "PaceWatch"]


@dataclass(frozen=True)
class PacedWorker:
    local_rank: int
    rank: int
    record: str  # its heartbeat record


@dataclass(frozen=True)
class Straggler:
    """A change of one local rank's verdict."""

    change: str  # Change.STRAGGLING or Change.RECOVERED
    node: str
    rank: int
    local_rank: int
    score: float
    pace: float  # seconds of own work a step (its median)
    fastest: float  # the job's fastest rank's
    slow_for: float = 0.0  # seconds it had been slow when named (``RankPace.slow_for``)

    def line(self) -> str:
        if self.change == Change.RECOVERED:
            return (
                f"rank {self.rank} (local rank {self.local_rank}) no longer straggles: its own work takes "
                f"{_ms(self.pace)} a step against the fastest rank's {_ms(self.fastest)} (score {self.shown(2)})"
            )
        return (
            f"rank {self.rank} (local rank {self.local_rank}) is a straggler: its own work takes {_ms(self.pace)} "
            f"a step, {self.pace / self.fastest:.1f}x the fastest rank's {_ms(self.fastest)} (score {self.shown(2)})"
        )

    def shown(self, digits: int) -> str:
        """The score cut, not rounded, to ``digits``: a straggler's never reads as the threshold it is
        below (0.7499 is 0.74, not 0.75); a recovered rank's never reads above what it reached."""
        return f"{math.floor(self.score * 10**digits + 1e-9) / 10**digits:.{digits}f}"

    def details(self) -> dict:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "score": float(self.shown(3)),
            "pace": round(self.pace, 6),
            "fastest": round(self.fastest, 6),
            "slow_for": round(self.slow_for, 1),
        }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


class PaceWatch:
    """One round's straggler watch on one node; ``tick()`` from the agent's monitor loop."""

    def __init__(
        self,
        workers: Sequence[PacedWorker],
        board: PaceBoard | None,
        *,
        node: str,
        round_: int,
        lease: Callable[[], int],
        gauge: Callable[[int, float], None] = lambda local_rank, value: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workers = list(workers)
        self._readers = [BeatReader(w.record) for w in self._workers]
        self._paces = [RankPace() for _ in self._workers]
        self._rules = [StragglerRule() for _ in self._workers]
        self._board, self._node, self._round, self._lease = board, node, round_, lease
        self._gauge, self._clock = gauge, clock
        self._written: NodePace | None = None
        self._judged = 0.0
        self._verdicts: dict[int, Straggler] = {}  # the local ranks named stragglers now

    def tick(self) -> list[Straggler]:
        """Read the records; at most once a sample, score the local ranks: the verdicts that changed."""
        now = self._clock()
        for reader, pace in zip(self._readers, self._paces):
            pace.feed(now, *reader.work())
        if now - self._judged < SAMPLE:
            return []
        self._judged = now
        paces = [(w, p.pace()) for w, p in zip(self._workers, self._paces)]
        timed = [(w, p) for w, p in paces if p is not None]
        if not timed:
            return []
        try:
            self._publish(timed)
            others = self._board.others(self._round) if self._board is not None else []
        except RendezvousError:
            return []  # etcd away: judged again at the next sample
        fastest = min([p for _, p in timed] + [o.fastest for o in others])
        if len(timed) + len(others) < 2:
            return []  # nobody to compare with
        return [change for change in (self._judge(w, p, fastest, now) for w, p in timed) if change is not None]

    def _judge(self, worker: PacedWorker, pace: float, fastest: float, now: float) -> Straggler | None:
        value = score(fastest, pace)
        self._gauge(worker.local_rank, value)
        change = self._rules[self._workers.index(worker)].judge(value)
        if change is None:
            return None
        slow_for = self._paces[self._workers.index(worker)].slow_for(fastest, now)
        verdict = Straggler(change, self._node, worker.rank, worker.local_rank, value, pace, fastest, slow_for)
        if change == Change.STRAGGLING:
            self._verdicts[worker.local_rank] = verdict
        else:
            self._verdicts.pop(worker.local_rank, None)
        return verdict

    def straggler(self) -> Straggler | None:
        """A local rank named a straggler and not recovered since (the slowest), or None."""
        return min(self._verdicts.values(), key=lambda s: s.score, default=None)

    def _publish(self, timed: list[tuple[PacedWorker, float]]) -> None:
        """This node's fastest and slowest pace, when either moved enough since it last wrote them."""
        if self._board is None:
            return
        fastest = min(p for _, p in timed)
        slow_worker, slowest = max(timed, key=lambda item: item[1])
        written = self._written
        moved = written is None or worth_writing(written.fastest, fastest) or worth_writing(written.slowest, slowest)
        if not moved:
            return
        pace = NodePace(self._node, self._round, fastest, slowest, slow_worker.rank)
        self._board.publish(pace, self._lease())
        self._written = pace

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
