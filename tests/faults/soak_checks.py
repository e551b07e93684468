"""The soak's invariants, as pure functions of what its workers recorded (tests/faults/soak.py).

A worker (ticker.py) records its rank, its round's master, world size and restart count, and ticks
every 10 ms while it runs. A round is known by its master (a fresh port per round) and world size;
rounds are ordered by their first worker's start.

- No rank in two rounds at once: a worker of an earlier round must not tick after the worker of a
  later round with the same rank started (nor, for a rank the later round does not have, after its
  first worker started: a stale worker of a shrunk job is as wrong). One exception is reported
  apart, not excused silently: a tick within ``woken`` seconds after its node was let go on from a
  freeze (SIGCONT), since which process runs first then is the scheduler's choice.
- The restart count is the same for every worker of a round and never goes back from one round to
  the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Worker", "Overlap", "worker_of", "rounds", "overlaps", "restart_problems"]


@dataclass(frozen=True)
class Worker:
    pid: int
    agent: int  # the pid of the agent that started it
    rank: int
    round: tuple[str, int]  # (its round's master, world size)
    restart: int
    created: float
    ticks: tuple[float, ...]


@dataclass(frozen=True)
class Overlap:
    """A worker of an earlier round ran after a later round's worker of the same rank (or its first
    worker, for a rank it does not have) started."""

    rank: int
    old: int  # pid
    new: int
    seconds: float  # from the later worker's start to the old worker's last tick
    ticks: int
    woken: bool  # every such tick came within the wake-up allowance after its node was woken
    after_wake: float = 0.0  # woken: the longest it ran after a wake-up (its last tick after SIGCONT)

    def __str__(self) -> str:
        if self.woken:
            return (
                f"rank {self.rank}: worker {self.old} ran {self.ticks} ticks in the {self.after_wake * 1000:.0f} ms "
                f"after its frozen node woke, beside worker {self.new} of a later round"
            )
        return (
            f"rank {self.rank}: worker {self.old} ran {self.ticks} ticks ({self.seconds * 1000:.0f} ms) "
            f"beside worker {self.new} of a later round (SPLIT BRAIN)"
        )


def worker_of(record: Mapping, ticks: Sequence[float]) -> Worker:
    """A ticker.py record (``w-<pid>.json``) and its ticks."""
    return Worker(
        pid=record["pid"],
        agent=record.get("parent", 0),
        rank=record["rank"],
        round=(record["master"], record["world_size"]),
        restart=record["restart"],
        created=record["created"],
        ticks=tuple(ticks),
    )


def rounds(workers: Iterable[Worker]) -> list[list[Worker]]:
    """The workers grouped by round, rounds in the order they started."""
    grouped: dict[tuple[str, int], list[Worker]] = {}
    for worker in workers:
        grouped.setdefault(worker.round, []).append(worker)
    return sorted(grouped.values(), key=lambda members: min(w.created for w in members))


def overlaps(workers: Iterable[Worker], woken: Mapping[int, Sequence[float]], allowance: float) -> list[Overlap]:
    """Every worker that ran after a later round's worker of its rank started. ``woken``: for each
    agent pid, when its processes were let go on after a freeze."""
    ordered = rounds(workers)
    found = []
    for index, earlier in enumerate(ordered):
        for later in ordered[index + 1 :]:
            by_rank = {w.rank: w for w in later}
            first = min(later, key=lambda w: w.created)
            for old in earlier:
                new = by_rank.get(old.rank, first)
                late = [t for t in old.ticks if t > new.created]
                if late:
                    since = [_since_wake(t, woken.get(old.agent, ())) for t in late]
                    excused = all(s is not None and s <= allowance for s in since)
                    ran = max(since) if excused else 0.0
                    found.append(Overlap(old.rank, old.pid, new.pid, max(late) - new.created, len(late), excused, ran))
    return found


def _since_wake(tick: float, wakes: Sequence[float]) -> float | None:
    """Seconds from the last wake-up before ``tick`` to it (None: no wake-up before it)."""
    before = [tick - wake for wake in wakes if wake <= tick]
    return min(before) if before else None


def restart_problems(workers: Iterable[Worker]) -> list[str]:
    """Rounds whose workers disagree on the restart count, and restart counts that went back."""
    problems, last = [], None
    for members in rounds(workers):
        counts = sorted({w.restart for w in members})
        if len(counts) > 1:
            problems.append(f"round of master {members[0].round[0]}: restart counts {counts} within one round")
        if last is not None and counts[0] < last:
            problems.append(f"round of master {members[0].round[0]}: restart count {counts[0]} after {last}")
        last = max(counts[-1], last if last is not None else counts[-1])
    return problems
