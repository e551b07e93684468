"""Hang rules, pure: when a worker counts as hung, which rank of the job to blame, and the line.

A worker is judged only once it has called ``elastic.heartbeat()`` (or ``elastic.phase``): then a
silence longer than its timeout is a hang. The timeout is the phase's own inside a phase; in steady
state the one given (``--heartbeat-timeout``) or, by default, learned: ``FACTOR`` times the slowest
step seen after ``WARMUP`` steps (the first step, often compilation, is not counted), never below
``FLOOR``; until then, and for a worker that has not beaten yet, the first-heartbeat timeout.

When one rank hangs, its peers block in the next collective and fall silent a moment later, on
every node. So the rank to blame is the one whose last sign of progress is the oldest across the
job (``decide``); it is a hang only if that rank is past its own timeout -- a peer silent behind a
rank in a long checkpoint phase is not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .record import Beat

__all__ = [
    "HangTimeouts",
    "RankWatch",
    "RankReport",
    "Verdict",
    "decide",
    "thread_stacks",
    "main_thread",
    "blocked_at",
    "FACTOR",
    "FLOOR",
    "WARMUP",
    "TIE",
    "positive_seconds",
]

FACTOR = 5.0  # the learned steady timeout: this many times the slowest step seen ...
FLOOR = 5.0  # ... and never below this many seconds
WARMUP = 5  # steps seen before the steady timeout is learned
TIE = 0.05  # seconds: ranks whose last heartbeats are this close stopped "together"


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

    @property
    def overdue(self) -> bool:
        return self.judged and self.silent > self.timeout

    @property
    def progress(self) -> float:
        """The wall time of its last sign of progress."""
        return self.last if self.last is not None else self.started

    def as_dict(self) -> dict:
        data = asdict(self)
        data["timeout"] = None if math.isinf(self.timeout) else self.timeout
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
        self.steps = 0  # intervals learned from
        self.slowest = 0.0

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
        if previous is None or beat.count != previous.count or beat.phase_changes != previous.phase_changes:
            self.beat = beat

    @property
    def learned(self) -> float | None:
        """The steady timeout learned so far (None during warm-up)."""
        if self.steps < WARMUP:
            return None
        return max(FLOOR, FACTOR * self.slowest)

    def report(self, node: str, now: float, wall_now: float, *, finishing: bool = False) -> RankReport:
        """Its state at ``now`` (monotonic), with times converted to the wall clock for other nodes.

        ``finishing``: a worker of the job already exited 0, so the others are past their last step
        (a final save, teardown): the first-heartbeat timeout applies instead of the learned one."""
        beat = self.beat
        started_wall = wall_now - (now - self.started)
        if beat is None:
            timeout = self.timeouts.first if self.judge_first else math.inf
            return RankReport(
                self.rank, node, None, started_wall, now - self.started, timeout, "first", "step", self.judge_first
            )
        silent = now - beat.last
        if beat.phase:
            timeout, kind, phase = (beat.phase_timeout or self.timeouts.first), "phase", beat.phase
        elif finishing:
            timeout, kind, phase = self.timeouts.first, "finishing", "finishing"
        else:
            steady = self.timeouts.steady if self.timeouts.steady is not None else self.learned
            timeout, kind, phase = (steady if steady is not None else self.timeouts.first), "step", "step"
        return RankReport(self.rank, node, wall_now - silent, started_wall, silent, timeout, kind, phase, True)


@dataclass(frozen=True)
class Verdict:
    """What the job decided about a suspected hang."""

    hung: bool
    culprit: RankReport
    blocked: int  # other ranks silent for more than half their timeout: stuck behind it
    tied: tuple[int, ...]  # other ranks whose last heartbeat is within TIE of the culprit's
    hold_until: float | None = None  # not hung: the wall time the culprit's own timeout ends

    def line(self) -> str:
        """``rank 1 on node n-b hung: no heartbeat for 61 s (last in phase "step", ...)``."""
        c = self.culprit
        what = "no first heartbeat" if c.last is None else "no heartbeat"
        since = " since it started" if c.last is None else ""
        details = [f'last in phase "{c.phase}"', f"timeout {_seconds(c.timeout)}"]
        if self.blocked:
            details.append(f"{self.blocked} rank{'s' if self.blocked > 1 else ''} blocked behind it")
        if self.tied:
            others = ", ".join(map(str, self.tied))
            details.append(
                f"rank{'s' if len(self.tied) > 1 else ''} {others} stopped within {TIE * 1000:.0f} ms of it: "
                "a deadlock, or a stop between heartbeats; see the stacks"
            )
        return f"rank {c.rank} on node {c.node} hung: {what} for {_seconds(c.silent)}{since} ({'; '.join(details)})"

    def as_dict(self) -> dict:
        return {
            "hung": self.hung,
            "culprit": self.culprit.as_dict(),
            "blocked": self.blocked,
            "tied": list(self.tied),
            "hold_until": self.hold_until,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        try:
            return cls(
                bool(data["hung"]),
                RankReport.from_dict(data["culprit"]),
                int(data["blocked"]),
                tuple(int(r) for r in data["tied"]),
                None if data["hold_until"] is None else float(data["hold_until"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a hang verdict is malformed ({exc!r})") from None


def decide(reports: list[RankReport]) -> Verdict | None:
    """Blame the judged rank whose last sign of progress is the oldest; None when no rank is judged."""
    judged = [r for r in reports if r.judged]
    if not judged:
        return None
    culprit = min(judged, key=lambda r: (r.progress, r.rank))
    others = [r for r in judged if r is not culprit]
    tied = tuple(
        sorted(
            r.rank
            for r in others
            if r.last is not None and culprit.last is not None and r.progress - culprit.progress <= TIE
        )
    )
    blocked = sum(1 for r in others if r.silent > r.timeout / 2)
    if culprit.overdue:
        return Verdict(True, culprit, blocked, tied)
    return Verdict(False, culprit, blocked, tied, hold_until=culprit.progress + culprit.timeout)


def thread_stacks(dump: str) -> list[list[str]]:
    """faulthandler's dump split into threads: each a header line and its frames (innermost first)."""
    return [lines for lines in (part.strip("\n").splitlines() for part in dump.split("\n\n")) if lines]


def main_thread(dump: str) -> list[str]:
    """The thread whose stack ends in ``<module>`` (the main thread), else the first one dumped."""
    threads = thread_stacks(dump)
    for lines in threads:
        if lines[-1].rstrip().endswith("in <module>"):
            return lines
    return threads[0] if threads else []


def blocked_at(frames: list[str]) -> str:
    """Where a blocked thread waits: its innermost frame, and the program's own frame that called it."""
    calls = [f.strip() for f in frames[1:] if f.strip().startswith("File ")]
    if not calls:
        return "?"
    own = next((f for f in calls if "site-packages" not in f and "/lib/python" not in f), None)
    return calls[0] if own in (None, calls[0]) else f"{calls[0]}, called from {own}"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
