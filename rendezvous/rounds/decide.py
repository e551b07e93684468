"""The decisions of a rendezvous round, as pure functions of what etcd showed and the time.

No I/O here: the handler reads etcd, calls these, and writes what they decide. Tests call them
with made-up node lists and an injected clock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rendezvous.job.progress import Streak, counted
from rendezvous.job.ranktable import bucket_count
from rendezvous.job.state import CAUSE_NAMES, Cause, JobState, JobStatus, Keep, NodeInfo, Participant

__all__ = [
    "LiveNode",
    "Freeze",
    "Wait",
    "joined",
    "still_running",
    "assign_ranks",
    "decide",
    "frozen_state",
    "formed_cause",
    "forming_state",
    "closed_state",
    "restart_count",
    "streak_after",
    "job_budget",
    "News",
    "forming_news",
]


@dataclass(frozen=True)
class LiveNode:
    """A node key that exists now: the agent's record, when its key was created, and its lease."""

    info: NodeInfo
    create_revision: int
    lease: int = 0


@dataclass(frozen=True)
class Freeze:
    """Close the round now with these participants."""

    participants: tuple[Participant, ...]


@dataclass(frozen=True)
class Wait:
    """Not yet: look again at ``until`` (None: when something changes), with last call started at
    ``last_call_start`` (None: fewer than min_nodes have joined); ``stopping``: participants of the
    round before whose workers may still run (the round cannot start before they are gone)."""

    until: float | None
    last_call_start: float | None
    stopping: tuple[str, ...] = ()
    silent: tuple[tuple[str, float], ...] = ()  # (node, when its lease runs out): set by the coordinator


def still_running(previous: Sequence[Participant], nodes: Sequence[LiveNode], round_: int) -> tuple[str, ...]:
    """Participants of the round before ``round_`` whose workers of it may still run: their node key
    is live (so is their lease) and they have neither asked for ``round_`` or a later one -- a node asks
    for a new round only once its workers of the last are gone -- nor said that their workers finished.

    A participant whose key is gone is not waited for: its reaper killed its workers before revoking
    the lease, or its lease expired, and its workers were stopped by the renew deadline before that.
    """
    live = {n.info.node: n.info for n in nodes}
    return tuple(
        sorted(p.node for p in previous if p.node in live and live[p.node].round < round_ and not live[p.node].finished)
    )


SILENT_RENEWALS = 2  # renewals a node's lease misses before the forming round calls the node silent


def silent_after(renew_every: float) -> float:
    """Seconds of waiting before a node's lease can show it missed ``SILENT_RENEWALS`` renewals
    (etcd gives a lease's time left in whole seconds)."""
    return SILENT_RENEWALS * renew_every + 1.0


def silent_nodes(
    time_left: Sequence[tuple[str, int]], lease_ttl: int, renew_every: float, now: float
) -> tuple[tuple[str, float], ...]:
    """Pure: of the nodes a forming round waits for, each with its lease's time left (whole seconds,
    -1: gone), those whose lease has not been renewed for ``SILENT_RENEWALS`` renewals -- a live
    agent renews every ``renew_every`` -- with the wall-clock time their lease runs out."""
    limit = lease_ttl - silent_after(renew_every)
    return tuple((node, round(now + left, 3)) for node, left in time_left if 0 <= left < limit)


def joined(nodes: Sequence[LiveNode], round_: int) -> list[LiveNode]:
    """The nodes that asked to join ``round_``, oldest first."""
    return sorted((n for n in nodes if n.info.round == round_), key=lambda n: n.create_revision)


def assign_ranks(
    previous: Sequence[Participant], candidates: Sequence[LiveNode], max_nodes: int
) -> tuple[Participant, ...]:
    """Group ranks for the next round, deterministic in its inputs.

    Nodes of the previous round come first and keep their rank when it still fits; the others
    (newcomers, oldest first, then stayers whose rank no longer fits) fill the free ranks in order.
    At most ``max_nodes`` take part; the rest wait for a later round.
    """
    old_rank = {p.node: p.group_rank for p in previous}
    stayers = sorted((c for c in candidates if c.info.node in old_rank), key=lambda c: old_rank[c.info.node])
    newcomers = sorted(
        (c for c in candidates if c.info.node not in old_rank), key=lambda c: (c.create_revision, c.info.node)
    )
    chosen = (stayers + newcomers)[:max_nodes]
    size = len(chosen)
    ranks: dict[str, int] = {}
    for c in chosen:
        rank = old_rank.get(c.info.node)
        if rank is not None and rank < size:
            ranks[c.info.node] = rank
    taken = set(ranks.values())
    free = iter(r for r in range(size) if r not in taken)
    for c in chosen:
        if c.info.node not in ranks:
            ranks[c.info.node] = next(free)
    return tuple(
        sorted(
            (Participant(c.info.node, ranks[c.info.node], c.info.addr, c.info.local_world_size) for c in chosen),
            key=lambda p: p.group_rank,
        )
    )


def decide(
    previous: JobState | None,
    nodes: Sequence[LiveNode],
    round_: int,
    *,
    min_nodes: int,
    max_nodes: int,
    last_call_timeout: float,
    last_call_start: float | None,
    now: float,
) -> Freeze | Wait:
    """What the coordinator does about ``round_`` now.

    - ``max_nodes`` joined: freeze.
    - at least ``min_nodes`` joined and the job ran before (a re-rendezvous) and every live node
      has joined: freeze at once -- nobody else is coming, and dead nodes' keys are already gone.
    - at least ``min_nodes`` joined and the last-call window since that happened has passed: freeze.
    - otherwise wait: until the last call ends, or for a change.

    Whichever of these holds, a round never freezes while a participant of the round before may
    still run its workers (``still_running``): it waits for each to ask for this round or for its
    key to go, so no rank runs in two rounds at once -- also when newcomers or hot spares could
    fill the round without it.
    """
    previous_participants = previous.participants if previous else ()
    candidates = joined(nodes, round_)
    if len(candidates) < min_nodes:
        return Wait(until=None, last_call_start=None)
    start = now if last_call_start is None else last_call_start
    everyone_here = all(n.info.round == round_ for n in nodes)
    if len(candidates) >= max_nodes or (previous_participants and everyone_here) or now >= start + last_call_timeout:
        stopping = still_running(previous_participants, nodes, round_)
        if stopping:
            return Wait(until=None, last_call_start=start, stopping=stopping)
        return Freeze(assign_ranks(previous_participants, candidates, max_nodes))
    return Wait(until=start + last_call_timeout, last_call_start=start)


def frozen_state(
    run_id: str,
    round_: int,
    participants: tuple[Participant, ...],
    nodes: Sequence[LiveNode],
    min_nodes: int,
    max_nodes: int,
    restarts: int = 0,
    max_restarts: int = 0,
    table: str = "",
    keep: Keep = Keep(),
    streak: Streak = Streak(),
    cause: Cause = Cause(),
) -> JobState:
    """The RUNNING state of a frozen round: the master is group rank 0's node and port; its
    participants go to rank table ``table`` (``bucket_count`` buckets); the job's keys stay as ``keep``
    says; ``cause``: why it formed (``formed_cause``)."""
    master = participants[0]
    port = next(n.info.master_port for n in nodes if n.info.node == master.node)
    return JobState(
        run_id=run_id,
        round=round_,
        status=JobStatus.RUNNING,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        master_addr=master.addr,
        master_port=port,
        restarts=restarts,
        max_restarts=max_restarts,
        table=table,
        size=len(participants),
        world=sum(p.local_world_size for p in participants),
        buckets=bucket_count(len(participants)),
        participants=participants,
        keep=keep,
        streak=streak,
        cause=cause,
    )


def formed_cause(state: JobState | None, participants: Sequence[Participant]) -> Cause:
    """Why a round formed, as its frozen state keeps it for every node to read alike: what ended the
    round before (``state``, forming, read with that round's participants: its failures, losses and
    their kind) and, as ``joining``, the participants that were not in it -- every one of the job's
    first round; a node that came while the round formed for another reason too."""
    before = {p.node for p in state.participants} if state is not None else set()
    told = state.cause if state is not None and state.status is JobStatus.JOINING else Cause()
    arrived = [p.node for p in participants if p.node not in before]
    return Cause.of(told.failures, told.lost, arrived, 0, told.kind)


def forming_state(
    state: JobState | None,
    run_id: str,
    round_: int,
    *,
    min_nodes: int,
    max_nodes: int,
    last_call_at: float | None,
    max_restarts: int,
    cause: Cause = Cause(),
    joined: int = 0,
    retention: int = 0,
    stopping: tuple[str, ...] = (),
    silent: tuple[tuple[str, float], ...] = (),
) -> JobState:
    """Round ``round_`` forming: the last frozen round's table, master and restart count carried over
    (and, while the same round forms, its cause and reason); ``stopping``: the participants of the
    round before it still waits for (``still_running``), for every node's progress line. A new job's
    keys are kept ``retention`` seconds after it ends (0: forever); a job's own setting, once written, stays."""
    if state is None:
        return JobState(
            run_id=run_id,
            round=round_,
            status=JobStatus.JOINING,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            last_call_at=last_call_at,
            max_restarts=max_restarts,
            cause=cause,
            joined=joined,
            keep=Keep(retention=retention),
            stopping=stopping[:CAUSE_NAMES],
            silent=silent[:CAUSE_NAMES],
        )
    same = state.status is JobStatus.JOINING and state.round == round_
    return replace(
        state,
        round=round_,
        status=JobStatus.JOINING,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        last_call_at=last_call_at,
        max_restarts=max_restarts,
        cause=state.cause if same else cause,
        finishing=False,
        reason=state.reason if same else "",
        joined=joined,
        stopping=stopping[:CAUSE_NAMES],
        silent=silent[:CAUSE_NAMES],
    )


class News(enum.Enum):
    """What the forming round's state in etcd lacks, as its coordinator decides it (``forming_news``)."""

    NONE = "none"  # nothing: wait for a change, the last call's end or a lease renewal
    RECOUNT = "recount"  # only the count of nodes that joined: written at the progress pace
    TELL = "tell"  # the round is not announced yet, its last call started or ended, or whom it waits for changed


def forming_news(state: JobState | None, target: int, decision: Wait, last_call_at: float | None, count: int) -> News:
    """Pure: what the state lacks of round ``target`` forming as ``decision`` says, ``count`` nodes joined."""
    announced = state is not None and state.status is JobStatus.JOINING and state.round == target
    if (
        not announced
        or (last_call_at is None) != (state.last_call_at is None)
        or state.stopping != decision.stopping[:CAUSE_NAMES]
        or [n for n, _ in state.silent] != [n for n, _ in decision.silent[:CAUSE_NAMES]]
    ):
        return News.TELL
    return News.RECOUNT if state.joined != count else News.NONE


def closed_state(state: JobState, reason: str, *, when: float | None = None, **changes: object) -> JobState:
    """``state`` closed for ``reason`` at ``when`` (wall clock; the job's keys are kept for its
    retention from then): the round, its participants, master and restart count stay as they were,
    so ``status`` and ``history`` still show the last round (``changes`` on top: ``failed``, ``closed_by``, ...)."""
    keep = state.keep._replace(closed_at=round(when, 3)) if when is not None else state.keep
    return replace(state, status=JobStatus.CLOSED, reason=reason, last_call_at=None, keep=keep, **changes)


def restart_count(state: JobState | None, nodes: Sequence[LiveNode], round_: int, peers_lost: bool = False) -> int:
    """The job's restart count for ``round_``: the count so far, plus one when a node that joins it
    says its workers of the round before failed -- one per group restart, however many workers or
    nodes failed at once. Membership changes (a node lost, a node joining) do not count, and a
    failure that comes with a participant its peers found dead (``peers_lost``: ``launcher.peers``)
    is one: its workers failed because a peer's machine died, was cut off or froze.

    ``state`` is the last state (the frozen round before, or ``round_`` forming, which carries the
    count of the round before unchanged).
    """
    count = state.restarts if state is not None else 0
    return count + 1 if _asking_restart(nodes, round_) and not peers_lost else count


def _asking_restart(nodes: Sequence[LiveNode], round_: int) -> list[NodeInfo]:
    """The nodes joining ``round_`` that say their workers of the round before failed."""
    return [n.info for n in nodes if n.info.round == round_ and n.info.failed_round == round_ - 1 > 0]


def streak_after(state: JobState | None, nodes: Sequence[LiveNode], round_: int, peers_lost: bool = False) -> Streak:
    """The job's crash-loop streak for ``round_``: carried over, or -- when ``restart_count`` counts
    a restart -- counted with how far each node that asked for it got (``progress.counted``)."""
    streak = state.streak if state is not None else Streak()
    asking = _asking_restart(nodes, round_)
    if not asking or peers_lost:  # no restart counted
        return streak
    return counted(streak, [(i.failure or f"a worker on node {i.node} failed", i.progress) for i in asking])


def job_budget(state: JobState | None, own: int) -> int:
    """The job's --max-restarts: the one stored with it, or this agent's when the job is new."""
    return state.max_restarts if state is not None else own
