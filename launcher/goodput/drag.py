"""Straggler drag, decided (pure): the share of a round's speed lost against the fastest round of
its world size, and a training stretch's lost seconds laid on its pieces -- cut where a named
straggler's slow stretch begins and ends -- so that a report's windows show the drag where the
steps were slow, not spread over the whole round."""

from __future__ import annotations

__all__ = ["SLOW", "Stretch", "rate_shares", "lay"]

SLOW = 1.1  # a round this much slower than the fastest of its size is dragged

Stretch = tuple[float, float | None, float]  # a named straggler's (since, until, share of the job's speed lost)


def rate_shares(times: dict[int, tuple[int, float | None]]) -> dict[int, float]:
    """Each round's share of its speed lost (``times``: round -> (world size, seconds a step)):
    against the fastest round of its world size, 0 within SLOW of it or with no step time."""
    fastest: dict[int, float] = {}
    for world, step in times.values():
        if step is not None:
            fastest[world] = min(fastest.get(world, float("inf")), step)
    shares = {}
    for number, (world, step) in times.items():
        slow = step is not None and step > SLOW * fastest[world]
        shares[number] = 1.0 - fastest[world] / step if slow else 0.0
    return shares


def lay(start: float, end: float, share: float, named: list[Stretch]) -> list[tuple[float, float, float]]:
    """(start, end, seconds lost) of the pieces of a training stretch: its drag -- the round's rate
    ``share`` of it, or a named straggler's share of the stretch it was slow, whichever is more --
    laid on the pieces by how slow each was."""
    total = (end - start) * share
    for since, until, fraction in named:
        overlap = min(end, until or end) - max(start, since)
        total = max(total, overlap * fraction) if overlap > 0 else total
    inner = {t for since, until, _ in named for t in (since, until) if t is not None and start < t < end}
    cuts = sorted({start, end, *inner})
    pieces = list(zip(cuts, cuts[1:]))
    weights = [_weight(lo, hi, share, named) for lo, hi in pieces]
    whole, total = sum(weights), min(total, end - start)
    return [(lo, hi, round(total * w / whole, 3) if whole > 0 else 0.0) for (lo, hi), w in zip(pieces, weights)]


def _weight(lo: float, hi: float, share: float, named: list[Stretch]) -> float:
    """How slow the piece [lo, hi) was: its rate share, or that of a slow stretch it lies in."""
    weight = (hi - lo) * share
    for since, until, fraction in named:
        if since <= lo and (until is None or hi <= until):
            weight = max(weight, (hi - lo) * fraction)
    return weight
