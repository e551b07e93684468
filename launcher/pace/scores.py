"""Straggler scores, decided (pure): each rank's pace from its own-work timings, its score against
the job's fastest rank, when a low score is a straggler, and when a node's figures are worth a write.

A rank's *pace* is the median over its last ``WINDOW`` samples, each sample the mean length of the
own-work spans (``elastic.section``, ``elastic.watch_ddp``) it timed in about ``SAMPLE`` seconds. Its
*score* is the job's fastest pace over its own (1.0: as fast as the fastest; 0.5: twice as slow).
The spans come with the timing thread's waits for a CPU already taken off (the worker reads its own
schedstat at both ends of a span): a loaded node's ranks are judged by how fast they work once they
run, as the hang watch judges them.
A rank is judged once its window is full. A score below ``THRESHOLD`` names a straggler at the first
evaluation: the median of a full window is below it only when half the window's samples (2 s) are
slow, which is the confirmation (a second one on top only made every straggler cost a second more).
Back above ``RECOVERED`` at ``CONFIRM`` evaluations in a row, it no longer is one.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

__all__ = [
    "SAMPLE",
    "WINDOW",
    "MIN_SAMPLES",
    "THRESHOLD",
    "RECOVERED",
    "CONFIRM",
    "REWRITE",
    "RankPace",
    "StragglerRule",
    "Change",
    "score",
    "worth_writing",
]

SAMPLE = 0.5  # seconds of spans a sample averages (at least one span); also how often ranks are judged
WINDOW = 8  # samples a pace is the median of (a 2x slowdown moves it in 4 samples: 2 s; a 1.4x one in 5)
MIN_SAMPLES = WINDOW  # samples before a rank has a pace: a full window, so no round's first steps judge it
THRESHOLD = 0.75  # a score below this is slow (nvidia-resiliency-ext's default)
RECOVERED = 0.85  # a straggler scores above this to be one no more
CONFIRM = 3  # evaluations in a row above RECOVERED that a straggler's recovery takes
REWRITE = 0.10  # a node's published pace is written again when it moved by more than this share


class RankPace:
    """One rank's samples, fed the cumulative own-work figures of its heartbeat record."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (when it began, mean span)
        self._since: tuple[float, float, int] | None = None  # (time, work, spans) the open sample began at

    def feed(self, now: float, work: float, spans: int) -> None:
        """The record read at ``now``: ``work`` seconds over ``spans`` spans so far."""
        if self._since is None or spans < self._since[2] or work < self._since[1]:
            self._since = (now, work, spans)  # first reading, or a new record (a new worker)
            return
        began, work0, spans0 = self._since
        if now - began >= SAMPLE and spans > spans0:
            self._samples.append((began, (work - work0) / (spans - spans0)))
            self._since = (now, work, spans)

    def slow_for(self, fastest: float, now: float) -> float:
        """Seconds to ``now`` since the newest samples in a row that score below ``RECOVERED`` against
        ``fastest`` began: how long this rank has been slow when a verdict names it (the goodput
        account's straggler drag). The sample a slowdown began in is partly slow and scores between
        the two thresholds: it is counted, to within a sample's length."""
        since = None
        for began, sample in reversed(self._samples):
            if score(fastest, sample) >= RECOVERED:
                break
            since = began
        return 0.0 if since is None else max(0.0, now - since)

    def pace(self) -> float | None:
        """The median span length over the window; None until ``MIN_SAMPLES`` samples."""
        if len(self._samples) < MIN_SAMPLES:
            return None
        return statistics.median(sample for _, sample in self._samples)


def score(fastest: float, pace: float) -> float:
    """The job's fastest pace over this rank's: 1.0 at best."""
    if pace <= 0.0:
        return 1.0
    return min(1.0, fastest / pace)


class Change:
    STRAGGLING = "straggling"
    RECOVERED = "recovered"


@dataclass
class StragglerRule:
    """A rank's verdicts with hysteresis: ``judge(score)`` returns a Change when its state flips."""

    straggling: bool = False
    _run: int = 0  # evaluations in a row that point to the other state

    def judge(self, value: float) -> str | None:
        flips = value >= RECOVERED if self.straggling else value < THRESHOLD
        self._run = self._run + 1 if flips else 0
        if self._run < (CONFIRM if self.straggling else 1):
            return None
        self._run = 0
        self.straggling = not self.straggling
        return Change.STRAGGLING if self.straggling else Change.RECOVERED


def worth_writing(written: float | None, pace: float) -> bool:
    """Whether a node's pace, last published as ``written``, moved enough to publish again."""
    if written is None or written <= 0.0:
        return True
    return abs(pace / written - 1.0) > REWRITE
