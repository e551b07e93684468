"""A round's step times, kept small (pure): how long the steps between two heartbeats took, counted
in buckets a tenth of a percent wide, so that a round of millions of steps costs a few hundred
counters and its median step -- the round's healthy pace, which its slow steps do not move -- is
read to within 0.05 %. The goodput account measures straggler drag against it: a round's steps
slower than the job's healthy pace are its lost time (``launcher.goodput.drag``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

__all__ = ["StepTimes", "WIDTH"]

WIDTH = 1.001  # a bucket's upper edge over its lower one
_LOG = math.log(WIDTH)


class StepTimes:
    """Step durations counted by bucket."""

    def __init__(self) -> None:
        self._buckets: Counter[int] = Counter()

    def add(self, seconds: float, steps: int = 1) -> None:
        """``steps`` steps of ``seconds`` each (a read that found several new heartbeats: their mean)."""
        if steps > 0 and seconds > 0.0 and math.isfinite(seconds):
            self._buckets[math.floor(math.log(seconds) / _LOG)] += steps

    @property
    def count(self) -> int:
        return sum(self._buckets.values())

    def median(self) -> float | None:
        """The median step (a bucket's middle); None with no step counted."""
        return StepTimes.merged([self])

    @staticmethod
    def merged(times: Iterable[StepTimes]) -> float | None:
        """The median step of several workers' steps taken together."""
        total: Counter[int] = Counter()
        for t in times:
            total.update(t._buckets)
        half, seen = sum(total.values()) / 2.0, 0
        for bucket in sorted(total):
            seen += total[bucket]
            if seen >= half and seen > 0:
                return WIDTH ** (bucket + 0.5)
        return None
