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

A loop is the same failure again: a streak counts only failures that are ``alike`` -- the same
exit code or signal, the same traceback site where the error file has one, the same rank for a
worker killed by a signal, after about as long a run. Failures that differ (workers SIGKILLed from
outside at random times and ranks: an OOM killer elsewhere, preemption, an operator) start the
count again: they are no evidence of a loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rendezvous.errors import RendezvousStateError

__all__ = ["RoundProgress", "Streak", "alike", "progressed", "counted", "tripped", "SHOWN_FAILURES"]

SHOWN_FAILURES = 8  # the streak keeps what failed in this many of its restarts, the newest last
RAN_SLACK = 2.0  # seconds two runs' lengths may differ by and still be "as long" ...
RAN_SHARE = 0.15  # ... or this share of the longer one


@dataclass(frozen=True)
class RoundProgress:
    """How far one node's workers got in a round that failed, and what failed (unknown: "" or -1)."""

    beats: int = 0  # the most heartbeats one of its workers beat (elastic.heartbeat)
    checkpoint: int = -1  # the newest elastic.checkpoint step on the node (-1: none)
    long: bool = False  # the round ran at least the progress window (--progress-window)
    how: str = ""  # "exit 1", "SIGKILL", "hang": how the first failed worker ended
    rank: int = -1  # its global rank
    site: str = ""  # where it raised: the innermost frame of its error file's traceback
    ran: float = -1.0  # seconds its workers ran before the failure

    def encode(self) -> dict[str, Any]:
        data: dict[str, Any] = {"beats": self.beats, "checkpoint": self.checkpoint, "long": self.long}
        known = {"how": self.how, "rank": self.rank, "site": self.site, "ran": round(self.ran, 2)}
        return data | {k: v for k, v in known.items() if v not in ("", -1, -1.0)}

    @classmethod
    def decode(cls, data: Any, where: str) -> "RoundProgress":
        """Validated (it is read from etcd): RendezvousStateError names what is wrong."""
        if not isinstance(data, dict):
            raise RendezvousStateError(f"{where} is malformed: progress is not an object")
        beats, checkpoint, long = data.get("beats", 0), data.get("checkpoint", -1), data.get("long", False)
        if type(beats) is not int or type(checkpoint) is not int or type(long) is not bool or beats < 0:
            raise RendezvousStateError(f"{where} is malformed: progress {data!r}")
        how, rank, site, ran = data.get("how", ""), data.get("rank", -1), data.get("site", ""), data.get("ran", -1.0)
        texts = isinstance(how, str) and isinstance(site, str) and len(how) <= 40 and len(site) <= 300
        numbers = type(rank) is int and type(ran) in (int, float) and rank >= -1 and (ran >= 0 or ran == -1)
        if not (texts and numbers):
            raise RendezvousStateError(f"{where} is malformed: progress {data!r}")
        return cls(beats, max(checkpoint, -1), long, how, rank, site, float(ran))


def alike(a: RoundProgress, b: RoundProgress) -> bool:
    """Two failures that look like the same one again (what a crash loop is): nothing known of both
    differs -- how each ended, where it raised, the rank when a signal ended it (the process a
    kernel or an operator picked), and how long the round ran (within ``RAN_SLACK`` seconds or
    ``RAN_SHARE`` of the longer run)."""
    if a.how and b.how and a.how != b.how:
        return False
    if a.site and b.site and a.site != b.site:
        return False
    if a.how.startswith("SIG") and a.rank >= 0 and b.rank >= 0 and a.rank != b.rank:
        return False
    if a.ran >= 0 and b.ran >= 0:
        return abs(a.ran - b.ran) <= max(RAN_SLACK, RAN_SHARE * max(a.ran, b.ran))
    return True


@dataclass(frozen=True)
class Streak:
    """The job's restarts in a row that made no progress and failed alike, and the furthest any
    round got."""

    stalled: int = 0  # restarts in a row with no progress, each failure alike the one before
    beats: int = 0  # the most heartbeats one worker beat in any round so far
    checkpoint: int = -1  # the newest elastic.checkpoint step seen so far (-1: none)
    failures: tuple[str, ...] = ()  # what failed in each of the stalled restarts, the newest last
    last: tuple[RoundProgress, ...] = ()  # what the nodes said of the newest stalled restart's failure

    @property
    def empty(self) -> bool:
        return self == Streak()

    def encode(self) -> dict[str, Any]:
        return {
            "stalled": self.stalled,
            "beats": self.beats,
            "checkpoint": self.checkpoint,
            "failures": list(self.failures),
            "last": [p.encode() for p in self.last],
        }

    @classmethod
    def decode(cls, data: Any, where: str) -> "Streak":
        """Validated (it is read from etcd): RendezvousStateError names what is wrong."""
        if not isinstance(data, dict):
            raise RendezvousStateError(f"{where} is malformed: streak is not an object")
        numbers = [data.get("stalled", 0), data.get("beats", 0), data.get("checkpoint", -1)]
        failures, last = data.get("failures", []), data.get("last", [])
        if any(type(n) is not int for n in numbers) or numbers[0] < 0 or numbers[1] < 0:
            raise RendezvousStateError(f"{where} is malformed: streak {data!r}")
        if not isinstance(failures, list) or not all(isinstance(f, str) for f in failures):
            raise RendezvousStateError(f"{where} is malformed: streak.failures is not a list of strings")
        if not isinstance(last, list) or len(last) > SHOWN_FAILURES:
            raise RendezvousStateError(f"{where} is malformed: streak.last is not a short list")
        marks = tuple(RoundProgress.decode(p, f"{where} (streak.last)") for p in last)
        shown = tuple(f[:300] for f in failures[-SHOWN_FAILURES:])
        return cls(numbers[0], numbers[1], max(numbers[2], -1), shown, marks)


def progressed(streak: Streak, progress: RoundProgress) -> bool:
    """The failed round got further than any before it (or ran long enough to count as progress)."""
    return progress.long or progress.beats > streak.beats or progress.checkpoint > streak.checkpoint


def _again(streak: Streak, said: Sequence[RoundProgress]) -> bool:
    """The failure is alike the streak's newest (a streak with none known yet: it goes on)."""
    return not streak.last or any(alike(a, b) for a in streak.last for b in said)


def counted(streak: Streak, reports: Sequence[tuple[str, RoundProgress | None]]) -> Streak:
    """The streak once a restart is counted, from what each node that asked for it said (what
    failed, how far it got; None: a node that did not say, as written before this record was).
    A failure unlike the streak's newest starts a streak of its own."""
    said = [progress for _, progress in reports if progress is not None]
    best = replace(
        streak,
        beats=max([streak.beats, *(p.beats for p in said)]),
        checkpoint=max([streak.checkpoint, *(p.checkpoint for p in said)]),
    )
    if not said or any(progressed(streak, p) for p in said):
        return replace(best, stalled=0, failures=(), last=())
    what, last = "; ".join(sorted({what for what, _ in reports})), tuple(said[:SHOWN_FAILURES])
    if not _again(streak, said):
        return replace(best, stalled=1, failures=(what,), last=last)
    failures = (*streak.failures, what)[-SHOWN_FAILURES:]
    return replace(best, stalled=streak.stalled + 1, failures=failures, last=last)


def tripped(streak: Streak, progress: RoundProgress, limit: int) -> bool:
    """This failure would be the ``limit``-th restart in a row with no progress, each alike the one
    before (``limit`` 0: never)."""
    if limit <= 0 or progressed(streak, progress):
        return False
    return (streak.stalled + 1 if _again(streak, [progress]) else 1) >= limit
