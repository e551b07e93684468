"""A job's account (pure): its wall time, from its first agent's start to its close, cut into
segments that tile it -- training, and time lost by cause -- from the job's history records.

Per round: the coordinator's ``round_frozen`` (when it formed, how long forming took, and how long
its agent had run: the job's first agent started no later) and the ``round_ended`` record of its
lowest group rank (``launcher.goodput.marks``). Between two rounds the time goes to stopping the
workers and forming the next round (before the first one, the agents' own start until the first
node's arrival, then waiting for nodes; fenced when the round before ended for want of a lease); in
a round, to starting the workers until their first heartbeat (checks first, when a pre-flight check
ran), then training -- except, when the round ended in a fault, the steps since the newest
``elastic.checkpoint`` save (redone after the restart; none under ``elastic.inprocess``, whose
survivors keep their steps) and a hung rank's silence until the verdict. Straggler drag is training time
lost to slow steps: a named straggler's slow stretch (from ``slow_for`` before it was named) loses
the share its score says, and a round's steps slower than the job's healthy pace beyond that are
lost where no verdict explains them (``launcher.goodput.drag``).

What cannot be told is said in ``notes``, never guessed: a job whose workers call no
``elastic.heartbeat()`` has no first or last step (a worker's life is training, from its process's
start to the first worker's exit 0; the stop from there to the last exit), one that saves no
``elastic.checkpoint`` has no last save (nothing counts as redone).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rendezvous.job.history import Event, Kind, last_run

from .drag import Pace, Stretch, inside, lay, rate_shares
from .ends import describe_end

__all__ = ["Spent", "TITLES", "Segment", "Incident", "Account", "account_of", "MIN_RATE_STEPS"]


class Spent(str, enum.Enum):
    """Where a second went (``elastic_lost_seconds_total``'s ``cause``, TRAINING aside)."""

    TRAINING = "training"
    WAITING = "waiting_for_nodes"
    RENDEZVOUS = "rendezvous"
    START = "start"
    REDONE = "redone"
    HANG = "hang"
    STRAGGLER = "straggler"
    FENCED = "fenced"
    CHECKS = "checks"
    STOPPING = "stopping"
    UNKNOWN = "unknown"


TITLES = {
    Spent.TRAINING: "training",
    Spent.WAITING: "waiting for nodes",
    Spent.RENDEZVOUS: "rendezvous",
    Spent.START: "process start and imports",
    Spent.REDONE: "steps redone since the last save",
    Spent.HANG: "hang until detected",
    Spent.STRAGGLER: "straggler drag",
    Spent.FENCED: "fenced / etcd outage",
    Spent.CHECKS: "health and pre-flight checks",
    Spent.STOPPING: "stopping workers",
    Spent.UNKNOWN: "not recorded (a round's nodes died)",
}
_START = -1  # the incident of the job's start (the first round's wait and start)
MIN_RATE_STEPS = 6  # heartbeats a round needs for its step time to count


@dataclass(frozen=True)
class Segment:
    start: float  # seconds since the epoch
    end: float
    cause: Spent
    round: int
    drag: float = 0.0  # of a training segment: seconds of it lost to slow steps

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Incident:
    """One fault or wait and everything it cost, for the costliest-first list."""

    round: int
    what: str
    seconds: float
    parts: tuple[tuple[Spent, float], ...]


@dataclass(frozen=True)
class Account:
    start: float
    end: float
    segments: tuple[Segment, ...]
    incidents: tuple[Incident, ...]
    events: tuple[Event, ...]
    rounds: int
    notes: tuple[str, ...] = ()
    closed: bool = True
    from_start: bool = False  # begins at its first agent's start (its records say when), not its first arrival

    @property
    def wall(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def lost(self) -> dict[Spent, float]:
        """Seconds lost by cause, costliest first (drag taken out of training)."""
        totals: dict[Spent, float] = {}
        for segment in self.segments:
            if segment.cause is not Spent.TRAINING:
                totals[segment.cause] = totals.get(segment.cause, 0.0) + segment.seconds
            elif segment.drag:
                totals[Spent.STRAGGLER] = totals.get(Spent.STRAGGLER, 0.0) + segment.drag
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    @property
    def productive(self) -> float:
        return sum(s.seconds - s.drag for s in self.segments if s.cause is Spent.TRAINING)

    @property
    def goodput(self) -> float:
        return self.productive / self.wall if self.wall > 0 else 0.0

    def windows(self, count: int = 20) -> list[tuple[float, float, float]]:
        """(start, end, goodput) of ``count`` equal windows across the job."""
        if self.wall <= 0:
            return []
        width = self.wall / count
        out = []
        for i in range(count):
            lo, hi = self.start + i * width, self.start + (i + 1) * width
            good = 0.0
            for s in self.segments:
                overlap = min(s.end, hi) - max(s.start, lo)
                if s.cause is Spent.TRAINING and overlap > 0:
                    good += overlap * (1.0 - s.drag / s.seconds if s.seconds > 0 else 1.0)
            out.append((lo, hi, good / width))
        return out


@dataclass
class _Round:
    number: int
    formed: float | None = None
    formed_in: float = 0.0
    world: int = 0
    ended: Event | None = None
    events: list[Event] = field(default_factory=list)

    def at(self, key: str) -> float | None:
        """A ``round_ended`` time (seconds from the workers' start) on the wall clock."""
        if self.ended is None or key not in self.ended.details:
            return None
        return self.started + float(self.ended.details[key])

    @property
    def started(self) -> float:
        d = self.ended.details
        return self.ended.time - float(d.get("stop", 0.0)) - float(d.get("ran", 0.0))

    @property
    def stopped_at(self) -> float:
        return self.ended.time

    @property
    def outcome(self) -> str:
        return str(self.ended.details.get("outcome", "")) if self.ended is not None else ""


def account_of(events: Iterable[Event], *, now: float | None = None) -> Account:
    """The account of a job from its history records (in time order); ``now``: where a running
    job's account ends (default: its last record). A job whose id ran again: its newest run."""
    events = last_run(sorted(events, key=lambda e: e.time))
    if not events:
        return Account(0.0, 0.0, (), (), (), 0, ("no history records",), closed=False)
    rounds = _rounds(events)
    closes = [e.time for e in events if e.kind == Kind.JOB_CLOSED]
    end = max(closes) if closes else (now if now is not None else events[-1].time)
    if not closes and rounds and rounds[-1].ended is None and rounds[-1].formed is not None:
        end = min(end, rounds[-1].formed)  # a running job: counted to the start of its current round
    firsts = [r.formed - r.formed_in for r in rounds if r.formed is not None]
    arrival = min([events[0].time, *firsts])
    start = min([arrival, *(e.time - up for e in events if (up := _up(e)) is not None)])
    saves = any(int(r.ended.details.get("step", -1)) >= 0 for r in rounds if r.ended is not None)
    beats = any("first_step" in r.ended.details for r in rounds if r.ended is not None)
    cutter = _Cutter(start)
    cutter.add(arrival, Spent.START, rounds[0].number if rounds else 0)  # the agents' own start
    for index, r in enumerate(rounds):
        after = rounds[index + 1] if index + 1 < len(rounds) else None
        until = after.formed - after.formed_in if after is not None and after.formed is not None else end
        _cut_round(cutter, r, rounds[index - 1] if index else None, until, saves=saves, beats=beats)
    cutter.add(end, Spent.STOPPING if closes else Spent.TRAINING, rounds[-1].number if rounds else 0)
    segments = _with_drag(cutter.segments, rounds)
    notes = []
    if not beats:
        notes.append(
            "the workers call no elastic.heartbeat(): their imports and set-up count as training (a worker's life "
            "is training until the first one exits; the stop is from there to the last one's exit)"
        )
    if beats and not saves:
        notes.append("the workers save no elastic.checkpoint: steps redone after a fault count as training")
    incidents = _incidents(segments, rounds)
    return Account(
        start, end, segments, incidents, tuple(events), len(rounds), tuple(notes), bool(closes), start < arrival
    )


def _up(e: Event) -> float | None:
    """How long the agent that froze a round had run then (an older agent's record has no ``up``)."""
    up = e.details.get("up") if e.kind == Kind.ROUND_FROZEN else None
    valid = isinstance(up, (int, float)) and not isinstance(up, bool) and 0.0 <= up < 86400.0 * 365
    return float(up) if valid else None


class _Cutter:
    """Segments laid end to end from ``start``: each ``add`` runs from where the last one ended."""

    def __init__(self, start: float) -> None:
        self.cursor = start
        self.segments: list[Segment] = []

    def add(self, until: float | None, cause: Spent, round_: int) -> None:
        if until is None or until <= self.cursor:
            return
        last = self.segments[-1] if self.segments else None
        if last is not None and last.cause is cause and last.round == round_:
            self.segments[-1] = Segment(last.start, until, cause, round_)
        else:
            self.segments.append(Segment(self.cursor, until, cause, round_))
        self.cursor = until


def _rounds(events: Sequence[Event]) -> list[_Round]:
    found: dict[int, _Round] = {}
    for e in events:
        r = found.setdefault(e.round, _Round(e.round))
        r.events.append(e)
        if e.kind == Kind.ROUND_FROZEN and r.formed is None:
            r.formed, r.formed_in = e.time, float(e.details.get("formed_in", 0.0))
            r.world = int(e.details.get("world_size", 0))
        elif e.kind == Kind.ROUND_ENDED:
            rank = int(e.details.get("group_rank", 0))
            if r.ended is None or rank < int(r.ended.details.get("group_rank", 0)):
                r.ended = e
    return [r for _, r in sorted(found.items()) if r.formed is not None or r.ended is not None]


def _cut_round(cut: _Cutter, r: _Round, before: _Round | None, until: float, *, saves: bool, beats: bool) -> None:
    """Round ``r``'s segments, from the end of ``before``'s; ``until``: when the next round began to form."""
    gap = Spent.WAITING if before is None else Spent.FENCED if before.outcome == "fenced" else Spent.RENDEZVOUS
    formed = r.formed if r.formed is not None else (r.started if r.ended is not None else None)
    cut.add(formed, gap, r.number)
    if r.ended is None:  # no record of its workers: its nodes died with it
        cut.add(until, Spent.UNKNOWN, r.number)
        return
    checked = any(e.kind == Kind.PREFLIGHT for e in r.events)
    cut.add(r.started, Spent.CHECKS if checked else Spent.START, r.number)
    ended, first_step = r.at("ran"), r.at("first_step")
    if beats:
        cut.add(first_step if first_step is not None else ended, Spent.START, r.number)
    if r.outcome != "succeeded":
        train_until = r.at("last_step") if r.outcome == "hung" else ended
        kept = r.at("saved") if saves and not r.ended.details.get("kept") else train_until
        cut.add(min(kept or cut.cursor, train_until or cut.cursor), Spent.TRAINING, r.number)
        cut.add(train_until, Spent.REDONE, r.number)
        cut.add(ended, Spent.HANG if r.outcome == "hung" else Spent.REDONE, r.number)
    cut.add(_trained_until(r, ended), Spent.TRAINING, r.number)
    cut.add(r.stopped_at, Spent.STOPPING, r.number)  # a finished round's last step to its workers' exit too


def _trained_until(r: _Round, ended: float | None) -> float | None:
    """Where a round's training ends: at its fault; in a round that succeeded, at its last heartbeat,
    or -- workers that call no ``elastic.heartbeat()`` -- at the first worker's exit 0 that its
    nodes recorded (the stop is from there to the last one's), else at the round's end."""
    if r.outcome != "succeeded":
        return ended
    last = r.at("last_step")
    if last is not None:
        return last
    exits = [
        e.time - float(e.details.get("stop", 0.0)) - float(e.details.get("ran", 0.0)) + float(e.details["first_exit"])
        for e in r.events
        if e.kind == Kind.ROUND_ENDED and _number(e.details.get("first_exit"))
    ]
    return min(exits) if exits else ended


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < float("inf")


def _pace(r: _Round) -> Pace:
    """The round's steps: how many, their mean (first heartbeat to last) and healthy step (an older
    agent's record holds the median step instead)."""
    steps = int(r.ended.details.get("steps", 0)) if r.ended is not None else 0
    first, last = r.at("first_step"), r.at("last_step")
    if steps < MIN_RATE_STEPS or first is None or last is None or last <= first:
        return Pace(r.world, steps, None)
    pace = r.ended.details.get("healthy_step", r.ended.details.get("median_step"))
    valid = isinstance(pace, (int, float)) and not isinstance(pace, bool) and 0.0 < pace < float("inf")
    return Pace(r.world, steps, (last - first) / (steps - 1), float(pace) if valid else None)


def _with_drag(segments: list[Segment], rounds: list[_Round]) -> tuple[Segment, ...]:
    """Training segments with the seconds of them lost to slow steps, placed where they were slow."""
    share = rate_shares({r.number: _pace(r) for r in rounds})
    named = _named_stragglers(rounds)
    out: list[Segment] = []
    for s in segments:
        if s.cause is not Spent.TRAINING:
            out.append(s)
            continue
        pieces = lay(s.start, s.end, share.get(s.round, 0.0), named.get(s.round, []))
        out += [Segment(lo, hi, s.cause, s.round, drag) for lo, hi, drag in pieces]
    return tuple(out)


def _named_stragglers(rounds: list[_Round]) -> dict[int, list[Stretch]]:
    """(since, until, share of the job's speed lost) for each straggler named in a round: the job
    steps at the slowest rank's pace, a score of 0.5 halving it."""
    out: dict[int, list[Stretch]] = {}
    for r in rounds:
        open_: dict[object, Event] = {}
        for e in r.events:
            key = (e.node, e.details.get("rank"))
            if e.kind == Kind.STRAGGLER:  # slow since ``slow_for`` seconds before it was named
                open_[key] = e
            elif e.kind == Kind.STRAGGLER_RECOVERED and key in open_:
                named = open_.pop(key)
                out.setdefault(r.number, []).append((_onset(named), e.time, _share(named)))
        for named in open_.values():
            out.setdefault(r.number, []).append((_onset(named), None, _share(named)))
    return out


def _while_named(segment: Segment, stretches: list[Stretch]) -> bool:
    """Whether a training piece lies in a named straggler's slow stretch (``lay`` cut it there)."""
    return any(inside(segment.start, segment.end, stretch) for stretch in stretches)


def _onset(named: Event) -> float:
    return named.time - float(named.details.get("slow_for", 0.0))


def _share(named: Event) -> float:
    return 1.0 - float(named.details.get("score", 1.0))


def _incidents(segments: Sequence[Segment], rounds: list[_Round]) -> tuple[Incident, ...]:
    """What each round's end cost (its redone steps and hang, the stop, the next round's forming
    and start), the wait for the first round, and each round's drag: a named straggler's, from when
    it was slow, with its round's end; a round's other slow steps as an incident of their own (its
    end did not make them slow); costliest first."""
    by_round = {r.number: r for r in rounds}
    order = [r.number for r in rounds]
    named = _named_stragglers(rounds)
    costs: dict[int, dict[Spent, float]] = {}
    slow: dict[int, float] = {}
    for s in segments:
        owner = s.round
        if s.cause in (Spent.WAITING, Spent.RENDEZVOUS, Spent.FENCED, Spent.START, Spent.CHECKS) and owner in order:
            at = order.index(owner)
            owner = order[at - 1] if at > 0 else _START  # the next round's forming and start: the fault's cost
        parts = costs.setdefault(owner, {})
        if s.cause is Spent.TRAINING:
            if s.drag and _while_named(s, named.get(owner, [])):
                parts[Spent.STRAGGLER] = parts.get(Spent.STRAGGLER, 0.0) + s.drag
            elif s.drag:
                slow[owner] = slow.get(owner, 0.0) + s.drag
            continue
        parts[s.cause] = parts.get(s.cause, 0.0) + s.seconds
    slowed = "round {}: steps slower than the job's healthy step"
    incidents = [Incident(n, slowed.format(n), round(t, 3), ((Spent.STRAGGLER, t),)) for n, t in slow.items() if t > 0]
    for number, parts in costs.items():
        total = sum(parts.values())
        if total > 0:
            what = (
                describe_end(number, by_round[number].outcome, by_round[number].events)
                if number in by_round
                else "the job's start: the first round's nodes and workers"
            )
            incidents.append(Incident(number, what, round(total, 3), tuple(sorted(parts.items(), key=lambda p: -p[1]))))
    return tuple(sorted(incidents, key=lambda i: -i.seconds))
