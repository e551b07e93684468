"""The crash-loop breaker's record (pure): how far a failed round got, and how many restarts in a
row got no further.

A job that fails at the same point every time (a bad batch, an OOM at step 5) would restart until
``--max-restarts`` is spent, and on a cluster every cycle holds every node. So each node that asks
for a restart says how far its workers got in the round that failed (``RoundProgress``, carried in
its node key with the request), and the coordinator of the next round, which counts the restart,
also counts it in the job's ``Streak`` unless some node's round made progress: a worker beat more
heartbeats than any worker of an earlier round, a newer ``elastic.checkpoint`` step was saved, or
the round ran at least the progress window. A node whose failure would make the streak reach the
limit closes the job instead (``launcher``: exit code 5, do not requeue).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rendezvous.errors import RendezvousStateError

__all__ = ["RoundProgress", "Streak", "progressed", "counted", "tripped", "SHOWN_FAILURES"]

SHOWN_FAILURES = 8  # the streak keeps what failed in this many of its restarts, the newest last


@dataclass(frozen=True)
class RoundProgress:
    """How far one node's workers got in a round that failed."""

    beats: int = 0  # the most heartbeats one of its workers beat (elastic.heartbeat)
    checkpoint: int = -1  # the newest elastic.checkpoint step on the node (-1: none)
    long: bool = False  # the round ran at least the progress window (--progress-window)

    def encode(self) -> dict[str, Any]:
        return {"beats": self.beats, "checkpoint": self.checkpoint, "long": self.long}

    @classmethod
    def decode(cls, data: Any, where: str) -> "RoundProgress":
        """Validated (it is read from etcd): RendezvousStateError names what is wrong."""
        if not isinstance(data, dict):
            raise RendezvousStateError(f"{where} is malformed: progress is not an object")
        beats, checkpoint, long = data.get("beats", 0), data.get("checkpoint", -1), data.get("long", False)
        if type(beats) is not int or type(checkpoint) is not int or type(long) is not bool or beats < 0:
            raise RendezvousStateError(f"{where} is malformed: progress {data!r}")
        return cls(beats, max(checkpoint, -1), long)


@dataclass(frozen=True)
class Streak:
    """The job's restarts in a row that made no progress, and the furthest any round got."""

    stalled: int = 0  # restarts in a row with no progress
    beats: int = 0  # the most heartbeats one worker beat in any round so far
    checkpoint: int = -1  # the newest elastic.checkpoint step seen so far (-1: none)
    failures: tuple[str, ...] = ()  # what failed in each of the stalled restarts, the newest last

    @property
    def empty(self) -> bool:
        return self == Streak()

    def encode(self) -> dict[str, Any]:
        return {
            "stalled": self.stalled,
            "beats": self.beats,
            "checkpoint": self.checkpoint,
            "failures": list(self.failures),
        }

    @classmethod
    def decode(cls, data: Any, where: str) -> "Streak":
        """Validated (it is read from etcd): RendezvousStateError names what is wrong."""
        if not isinstance(data, dict):
            raise RendezvousStateError(f"{where} is malformed: streak is not an object")
        numbers = [data.get("stalled", 0), data.get("beats", 0), data.get("checkpoint", -1)]
        failures = data.get("failures", [])
        if any(type(n) is not int for n in numbers) or numbers[0] < 0 or numbers[1] < 0:
            raise RendezvousStateError(f"{where} is malformed: streak {data!r}")
        if not isinstance(failures, list) or not all(isinstance(f, str) for f in failures):
            raise RendezvousStateError(f"{where} is malformed: streak.failures is not a list of strings")
        return cls(numbers[0], numbers[1], max(numbers[2], -1), tuple(f[:300] for f in failures[-SHOWN_FAILURES:]))


def progressed(streak: Streak, progress: RoundProgress) -> bool:
    """The failed round got further than any before it (or ran long enough to count as progress)."""
    return progress.long or progress.beats > streak.beats or progress.checkpoint > streak.checkpoint


def counted(streak: Streak, reports: Sequence[tuple[str, RoundProgress | None]]) -> Streak:
    """The streak once a restart is counted, from what each node that asked for it said (what
    failed, how far it got; None: a node that did not say, as written before this record was)."""
    said = [progress for _, progress in reports if progress is not None]
    best = replace(
        streak,
        beats=max([streak.beats, *(p.beats for p in said)]),
        checkpoint=max([streak.checkpoint, *(p.checkpoint for p in said)]),
    )
    if not said or any(progressed(streak, p) for p in said):
        return replace(best, stalled=0, failures=())
    failures = (*streak.failures, "; ".join(sorted({what for what, _ in reports})))[-SHOWN_FAILURES:]
    return replace(best, stalled=streak.stalled + 1, failures=failures)


def tripped(streak: Streak, progress: RoundProgress, limit: int) -> bool:
    """This failure would be the ``limit``-th restart in a row with no progress (``limit`` 0: never)."""
    return limit > 0 and not progressed(streak, progress) and streak.stalled + 1 >= limit
