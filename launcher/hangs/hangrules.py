"""Hang rules, pure: when a worker counts as hung, and what its agent reports of it to the job.

A worker is judged only once it has called ``elastic.heartbeat()`` (or ``elastic.phase``): then a
silence longer than its timeout is a hang. The timeout is the phase's own inside a phase; in steady
state the one given (``--heartbeat-timeout``) or, by default, learned: ``FACTOR`` times the slowest
step seen after ``WARMUP`` steps (the first step, often compilation, is not counted), never below
``FLOOR``; until then, and for a worker that has not beaten yet, the first-heartbeat timeout. A
worker whose processes have done nothing at all for ``IDLE`` seconds of its silence -- no CPU, no
byte read or written, none of them running or waiting for a disk (``procstat.Idleness``): a
deadlock, a collective whose peer is gone, a stopped process -- is held to ``IDLE`` instead of
``FLOOR``; a busy one (a loop, a long computation) keeps the floor.

Once a worker of the job has exited 0, the others are past their last step (a final save, the
teardown): their timeout becomes ``FACTOR`` times the steady one, or ``FACTOR`` times the longest
any finished worker here took from its last heartbeat to its exit if that is longer -- bounded, and
learned from the job, so a rank that stops after its peers finished is still found.

Time the worker could not run is not silence: the seconds it waited for a CPU while runnable
(``/proc/PID/schedstat``) and the seconds the agent's own loop woke late (both mean the node is
starved, not the rank hung) are credited back (``RankWatch.starved``) until its next heartbeat.

Which rank of the job to blame is ``verdict``'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from launcher.hangs.steptimes import StepTimes

from .beatfile import Beat
from .blame import Doing

__all__ = [
    "HangTimeouts",
    "RankWatch",
    "RankReport",
    "FACTOR",
    "FLOOR",
    "WARMUP",
    "IDLE",
    "seconds",
    "positive_seconds",
]

FACTOR = 5.0  # the learned steady timeout: this many times the slowest step seen ...
FLOOR = 5.0  # ... and never below this many seconds
WARMUP = 5  # steps seen before the steady timeout is learned
IDLE = 1.0  # the learned timeout's floor for a worker whose processes did nothing for this long


def positive_seconds(value: object, what: str) -> float | None:
    """A hang timeout as given (None: not given): a finite number of seconds above 0, else one
    ValueError naming ``what``. The one check of the CLI, the launch API and ``HangTimeouts``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class HangTimeouts:
    first: float = 900.0  # seconds to the first heartbeat (start-up, loading, compilation)
    steady: float | None = None  # seconds between heartbeats; None: learned from the steps seen
    judge_first: bool = False  # a worker that never beat is judged by ``first`` (set when it was given)

    def __post_init__(self) -> None:
        positive_seconds(self.first, "the first-heartbeat timeout")
        positive_seconds(self.steady, "the heartbeat timeout")


@dataclass(frozen=True)
class RankReport:
    """One rank as its agent sees it, in the form nodes exchange through etcd (times are wall clock)."""

    rank: int
    node: str
    last: float | None  # the last heartbeat (None: none yet)
    started: float  # when the worker started
    silent: float  # seconds since the last heartbeat (or since the start)
    timeout: float  # the timeout that applies now (inf: not judged)
    kind: str  # "step", "phase", "first" or "finishing"
    phase: str  # the phase's name ("step" outside any)
    judged: bool  # it beat at least once, or the first-heartbeat timeout applies to it
    doing: Doing | None = None  # what its stack showed, when one was taken (``blame``)

    @property
    def overdue(self) -> bool:
        return self.judged and self.silent > self.timeout

    @property
    def stalled(self) -> bool:
        """Silent past half its timeout: stuck, likely behind a rank that hung."""
        return self.judged and self.silent > self.timeout / 2

    @property
    def progress(self) -> float:
        """The wall time of its last sign of progress."""
        return self.last if self.last is not None else self.started

    def as_dict(self) -> dict:
        data = asdict(self)
        data["timeout"] = None if math.isinf(self.timeout) else self.timeout
        data["doing"] = None if self.doing is None else self.doing.as_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RankReport":
        """Validated: a report is read from etcd. ValueError names what is wrong."""
        try:
            timeout = math.inf if data["timeout"] is None else float(data["timeout"])
            report = cls(
                int(data["rank"]),
                str(data["node"]),
                None if data["last"] is None else float(data["last"]),
                float(data["started"]),
                float(data["silent"]),
                timeout,
                str(data["kind"]),
                str(data["phase"]),
                bool(data["judged"]),
                None if data.get("doing") is None else Doing.from_dict(data["doing"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a hang report is malformed ({exc!r})") from None
        return report


class RankWatch:
    """What the agent knows of one local worker's heartbeats: fed each monitor tick."""

    def __init__(self, rank: int, started: float, timeouts: HangTimeouts, *, judge_first: bool = False) -> None:
        self.rank = rank
        self.started = started  # the agent's monotonic clock
        self.timeouts = timeouts
        self.judge_first = judge_first or timeouts.judge_first
        self.beat: Beat | None = None
        self.first: float | None = None  # monotonic time of its first heartbeat seen (goodput's first step)
        self.steps = 0  # intervals learned from
        self.slowest = 0.0
        self.times = StepTimes()  # the plain steps' durations (goodput's healthy pace)
        self.starved = 0.0  # seconds since its last heartbeat that it could not run (the node starved)
        self.idle_for = 0.0  # seconds its processes have done nothing at all, up to the last look

    def starve(self, seconds: float) -> None:
        """``seconds`` it waited for a CPU, or its agent's loop woke late: not counted as silence."""
        self.starved += max(0.0, seconds)

    def idle(self, seconds: float) -> None:
        """Its processes have done nothing at all for ``seconds``, up to now."""
        self.idle_for = seconds

    def silence(self, now: float) -> float:
        """Seconds since its last heartbeat, when the idle floor could apply to it (else 0.0): in
        steady state, outside any phase, with a learned timeout."""
        beat = self.beat
        if beat is None or beat.phase or self.timeouts.steady is not None or self.learned is None:
            return 0.0
        return now - beat.last

    def feed(self, beat: Beat) -> None:
        previous = self.beat
        if not beat.attached or beat.count == 0:
            return
        if previous is not None and beat.count > previous.count and beat.last > previous.last:
            plain = beat.phase_changes == previous.phase_changes and not beat.phase
            if plain and previous.count >= 2:  # the first interval (often compilation) is not a step
                n = beat.count - previous.count
                self.slowest = max(self.slowest, (beat.last - previous.last) / n)
                self.steps += n
                self.times.add((beat.last - previous.last) / n, n)
        if self.first is None:
            self.first = beat.last
        if previous is None or beat.count != previous.count or beat.phase_changes != previous.phase_changes:
            self.beat = beat
            self.starved = self.idle_for = 0.0  # it beat: silence is counted from now

    @property
    def learned(self) -> float | None:
        """The steady timeout learned so far (None during warm-up)."""
        if self.steps < WARMUP:
            return None
        return max(FLOOR, FACTOR * self.slowest)

    @property
    def steady(self) -> float | None:
        """The steady timeout: given, or learned (None while neither) -- from ``IDLE`` up while its
        processes have done nothing for that long."""
        if self.timeouts.steady is not None:
            return self.timeouts.steady
        if self.learned is not None and self.idle_for >= IDLE:
            return max(IDLE, FACTOR * self.slowest)
        return self.learned

    def _finishing_timeout(self, tail: float) -> float:
        """Past the last step: FACTOR times the steady timeout or the longest tail seen; until the
        steady timeout is known (the job ends during its warm-up), the first-heartbeat timeout. Not
        the idle floor: work after the last step may wait on files or peers."""
        steady = self.timeouts.steady if self.timeouts.steady is not None else self.learned
        if steady is None:
            return self.timeouts.first
        return min(self.timeouts.first, FACTOR * max(steady, tail))

    def report(
        self, node: str, now: float, wall_now: float, *, finishing: bool = False, tail: float = 0.0
    ) -> RankReport:
        """Its state at ``now`` (monotonic), with times converted to the wall clock for other nodes.

        ``finishing``: a worker of the job already exited 0, so the others are past their last step;
        ``tail``: the longest a finished worker took from its last heartbeat to its exit."""
        beat = self.beat
        started_wall = wall_now - (now - self.started)
        if beat is None:
            timeout = self.timeouts.first if self.judge_first else math.inf
            silent = max(0.0, now - self.started - self.starved)
            return RankReport(self.rank, node, None, started_wall, silent, timeout, "first", "step", self.judge_first)
        silent = max(0.0, now - beat.last - self.starved)
        if beat.phase:
            timeout, kind, phase = (beat.phase_timeout or self.timeouts.first), "phase", beat.phase
        elif finishing:
            timeout, kind, phase = self._finishing_timeout(tail), "finishing", "finishing"
        else:
            steady = self.steady
            timeout, kind, phase = (steady if steady is not None else self.timeouts.first), "step", "step"
        last = wall_now - (now - beat.last)
        return RankReport(self.rank, node, last, started_wall, silent, timeout, kind, phase, True)


def seconds(value: float) -> str:
    """``4.0 s``, ``61 s``: a duration as the lines say it."""
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
