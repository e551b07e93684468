"""A round's step times, kept small (pure): how long the steps between two heartbeats took, counted
in buckets a tenth of a percent wide, so that a round of millions of steps costs a few hundred
counters and its *healthy step* is read to within 0.05 %: the mean of its steps no longer than
``STALL`` times their median. A healthy job's steps jitter (on a 2-core machine a 56.0 ms median
step had a 56.6 ms mean without its stalls), and that jitter is the job's healthy rate, not time
lost: a median would count every step slower than it as partly lost, and a job with no fault at all
would read 99.0 % there at best. A stall (a fault's slow steps, a straggler's at half speed) is left
out, so it does not move the healthy step either. The goodput account measures straggler drag
against it: a round's steps slower than the job's healthy step are its lost time
(``launcher.goodput.drag``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

__all__ = ["StepTimes", "STALL", "WIDTH"]

WIDTH = 1.001  # a bucket's upper edge over its lower one
STALL = 1.5  # a step longer than this many times the median is a stall, not jitter
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

    @staticmethod
    def combined(times: Iterable[StepTimes]) -> StepTimes:
        """The steps of several workers taken together."""
        total = StepTimes()
        for t in times:
            total._buckets.update(t._buckets)
        return total

    def median(self) -> float | None:
        """The median step (a bucket's middle); None with no step counted."""
        half, seen = self.count / 2.0, 0
        for bucket in sorted(self._buckets):
            seen += self._buckets[bucket]
            if seen >= half and seen > 0:
                return _middle(bucket)
        return None

    def healthy(self) -> float | None:
        """The mean of the steps no longer than ``STALL`` times the median; None with no step counted."""
        median = self.median()
        if median is None:
            return None
        kept = [(bucket, n) for bucket, n in self._buckets.items() if _middle(bucket) <= STALL * median]
        return sum(_middle(bucket) * n for bucket, n in kept) / sum(n for _, n in kept)


def _middle(bucket: int) -> float:
    return WIDTH ** (bucket + 0.5)
