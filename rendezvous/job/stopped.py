"""When a job that nobody closed lost its last agent, read from its history (pure).

No agent writes while a job runs steadily, so the moment the last one went is known only from what
the agents said as they left: every agent stopped by a signal records ``node_left`` with its time.
When every node of the last round did, the job has had no live agent since the last of those
records. A node whose machine was lost (or whose agent was SIGKILLed) says nothing: its lease ran
out some time after the last thing the job knows of that round (its formation, a departure), so
the view gives that time as a lower bound and counts the silent nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from .history import Event, Kind
from .state import JobState, JobStatus

__all__ = ["Stopped", "stopped_from"]


@dataclass(frozen=True)
class Stopped:
    since: float | None  # no live agent since then (exact when ``silent`` is 0, else a lower bound); None: no record
    silent: int  # nodes of the last round that left no word (their leases ran out)

    def short(self, now: float) -> str:
        """``stopped since 12:03:04 UTC``, ``stopped after 12:03:04 UTC`` (a lower bound), or ``stopped``."""
        if self.since is None:
            return "stopped"
        return f"stopped {'after' if self.silent else 'since'} {_clock(self.since, now)}"

    def describe(self, now: float) -> str:
        """``no live agent since 12:03:04 UTC``; ``... since some time after 12:03:04 UTC; 1 node left
        no word: its lease ran out``; the date too when it is not today's."""
        if self.since is None:
            return "no live agent (the job's history does not say since when)"
        when = _clock(self.since, now)
        if not self.silent:
            return f"no live agent since {when}"
        nodes = f"{self.silent} node{'s' if self.silent > 1 else ''}"
        leases = "its lease" if self.silent == 1 else "their leases"
        return f"no live agent since some time after {when}; {nodes} left no word: {leases} ran out"


def stopped_from(state: JobState, events: Iterable[Event]) -> Stopped:
    """How the job's last frozen round lost its agents, from its history records (a node's records
    carry the round it last ran: while the next one forms, the round before)."""
    last = state.round if state.status is JobStatus.RUNNING else state.round - 1
    left: dict[str, float] = {}
    known: list[float] = []
    for event in events:
        if event.round != last:
            continue
        if event.kind == Kind.NODE_LEFT:
            left[event.node] = max(event.time, left.get(event.node, event.time))
        known.append(event.time)
    silent = max(state.size - len(left), 0)
    if not silent:
        return Stopped(max(left.values()) if left else None, 0)
    return Stopped(max(known) if known else None, silent)


def _clock(when: float, now: float) -> str:
    moment, today = datetime.fromtimestamp(when, timezone.utc), datetime.fromtimestamp(now, timezone.utc)
    shown = "%H:%M:%S" if moment.date() == today.date() else "%Y-%m-%d %H:%M:%S"
    return moment.strftime(shown) + " UTC"
