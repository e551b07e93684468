"""Straggler drag, decided (pure): the share of a round's speed lost against the job's healthy pace,
and a training stretch's lost seconds laid on its pieces -- cut where a named straggler's slow
stretch begins and ends -- so that a report's windows show the drag where the steps were slow, not
spread over the whole round.

A round's pace is its healthy step (``launcher.hangs.steptimes``: the mean of its steps without
its stalls), which its stalls do not move. The job's healthy pace at a world size is the median of
its rounds' paces, each weighted by its steps (a slow round among many does not move it either); a
round whose mean step is slower than that lost the difference -- the steps slower than the job's
healthy rate, whatever made them slow. A round recorded with neither a healthy nor a median step
(an older agent's record) is paced by its mean and dragged only when more than ``SLOW`` times
slower than the fastest round of its size.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SLOW", "Pace", "Stretch", "rate_shares", "lay", "inside"]

SLOW = 1.1  # a round without a healthy step: this much slower than the fastest of its size is dragged

Stretch = tuple[float, float | None, float]  # a named straggler's (since, until, share of the job's speed lost)


@dataclass(frozen=True)
class Pace:
    """One round's steps: its world size, how many, their mean and (when recorded) healthy step."""

    world: int
    steps: int
    mean: float | None
    healthy: float | None = None


def rate_shares(paces: dict[int, Pace]) -> dict[int, float]:
    """Each round's share of its speed lost against the job's healthy pace at its world size (0
    with no step time)."""
    healthy = {
        world: _healthy([p for p in paces.values() if p.world == world]) for world in {p.world for p in paces.values()}
    }
    fastest: dict[int, float] = {}
    for p in paces.values():
        if p.mean is not None:
            fastest[p.world] = min(fastest.get(p.world, float("inf")), p.mean)
    shares = {}
    for number, p in paces.items():
        if p.mean is None:
            shares[number] = 0.0
        elif p.healthy is not None and healthy[p.world] is not None:
            shares[number] = max(0.0, 1.0 - healthy[p.world] / p.mean)
        else:
            shares[number] = 1.0 - fastest[p.world] / p.mean if p.mean > SLOW * fastest[p.world] else 0.0
    return shares


def _healthy(paces: list[Pace]) -> float | None:
    """The median of the rounds' healthy steps, each counted as often as the round stepped."""
    known = sorted((p.healthy, p.steps) for p in paces if p.healthy is not None and p.mean is not None)
    half, seen = sum(steps for _, steps in known) / 2.0, 0
    for pace, steps in known:
        seen += steps
        if seen >= half:
            return pace
    return None


def lay(start: float, end: float, share: float, named: list[Stretch]) -> list[tuple[float, float, float]]:
    """(start, end, seconds lost) of the pieces of a training stretch, cut where a named straggler's
    slow stretch begins and ends: a piece in a slow stretch loses that stretch's share of it (the job
    stepped at the straggler's pace), and what the round's rate ``share`` lost beyond those -- its slow
    steps that no verdict explains -- is laid on the other pieces by their length (on every piece
    where none is outside a slow stretch)."""
    inner = {t for since, until, _ in named for t in (since, until) if t is not None and start < t < end}
    cuts = sorted({start, end, *inner})
    pieces = list(zip(cuts, cuts[1:]))
    explained = [(hi - lo) * _named_share(lo, hi, named) for lo, hi in pieces]
    rest = max(0.0, min(share, 1.0) * (end - start) - sum(explained))
    room = [hi - lo if loss == 0.0 else 0.0 for (lo, hi), loss in zip(pieces, explained)]
    if sum(room) == 0.0:
        room = [hi - lo for lo, hi in pieces]
    whole = sum(room)
    return [
        (lo, hi, round(min(hi - lo, loss + (rest * r / whole if whole > 0 else 0.0)), 3))
        for (lo, hi), loss, r in zip(pieces, explained, room)
    ]


def _named_share(lo: float, hi: float, named: list[Stretch]) -> float:
    """The share of its speed the piece [lo, hi) lost to the named stragglers' stretches it lies in."""
    return min(1.0, max((stretch[2] for stretch in named if inside(lo, hi, stretch)), default=0.0))


def inside(lo: float, hi: float, stretch: Stretch) -> bool:
    """Whether the piece [lo, hi) lies in a named straggler's slow stretch (``lay`` cuts pieces there)."""
    since, until, _ = stretch
    return since <= lo and (until is None or hi <= until)
