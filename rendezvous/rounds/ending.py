"""How a running round ends, as pure functions of its state and the live nodes: why (failures
reported, participants lost, newcomers waiting: ``round_cause``), whether it is finishing, and --
when the job moved on to a newcomer's round just as this node's workers succeeded -- whether the
round finished after all (``ending_after``).

No I/O here: the round's monitor and the handler read etcd and call these.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from rendezvous.job.state import CLOSED_BY_OPERATOR, Cause, FailureKind, JobState, JobStatus, Participant

from .decide import LiveNode

__all__ = [
    "Ending",
    "closed_finished",
    "ending_after",
    "failures_reported",
    "finishing",
    "lost_participants",
    "newcomer_round",
    "newcomers",
    "nodes_waiting",
    "round_cause",
    "rerun_refused",
]


def round_cause(state: JobState | None, nodes: Sequence[LiveNode]) -> Cause:
    """Why the running round ``state`` (read with its participants) ends, from the live nodes."""
    live = {n.info.node for n in nodes}
    reported = _reports(state, nodes)
    return Cause.of(
        [text for text, _ in reported],
        lost_participants(state, live),
        newcomers(state, nodes),
        nodes_waiting(state, nodes),
        reported[0][1] if reported else None,
    )


def failures_reported(state: JobState | None, nodes: Sequence[LiveNode]) -> list[str]:
    """What the nodes asking to restart the running round said failed (``rank 1 on node b failed (exit code 1)``)."""
    return [text for text, _ in _reports(state, nodes)]


def _reports(state: JobState | None, nodes: Sequence[LiveNode]) -> list[tuple[str, FailureKind]]:
    """``failures_reported`` with each failure's kind (a node that did not say: a worker's failure)."""
    if state is None or state.status is not JobStatus.RUNNING:
        return []
    return sorted(
        (n.info.failure or f"a worker on node {n.info.node} failed", n.info.failure_kind or FailureKind.WORKER)
        for n in nodes
        if n.info.failed_round == state.round and n.info.round > state.round
    )


def newcomers(state: JobState | None, nodes: Sequence[LiveNode]) -> list[str]:
    """Nodes asking to join after the running round that are not taking part in it."""
    if state is None or state.status is not JobStatus.RUNNING:
        return []
    members = {p.node for p in state.participants}
    return sorted(n.info.node for n in nodes if n.info.round > state.round and n.info.node not in members)


def nodes_waiting(state: JobState | None, nodes: Sequence[LiveNode]) -> int:
    """Live nodes asking for a round after the running one.

    A participant asking again (its workers failed) always counts; a newcomer counts only while
    the running round has room for it (below max_nodes) and is not ``finishing``: a job at its end
    is not restarted for a newcomer, who waits and hears the job close (exit 0, a spare never needed).
    """
    if state is None or state.status is not JobStatus.RUNNING:
        return 0
    members = {p.node for p in state.participants}
    asking = [n for n in nodes if n.info.round > state.round]
    rejoining = sum(1 for n in asking if n.info.node in members)
    newcomers = len(asking) - rejoining
    room = 0 if finishing(state, nodes) else max(state.max_nodes - len(state.participants), 0)
    return rejoining + min(newcomers, room)


def lost_participants(state: JobState | None, live: set[str]) -> list[str]:
    """Participants of the running round whose node key is gone (their agent died or left) -- none
    once the round is finishing: a participant's workers all succeeded, so the training is done, and
    a node that leaves now left an ending job (its exit barrier gave up, or it ended beside a rank
    stuck at exit), which the others finish without a new round, as torch's agents do."""
    if state is None or state.status is not JobStatus.RUNNING or state.finishing:
        return []
    return [p.node for p in state.participants if p.node not in live]


def finishing(state: JobState | None, nodes: Sequence[LiveNode]) -> bool:
    """A participant of the running round ``state`` said its workers all succeeded: the job is at
    its end (the coordinator writes ``finishing`` once it sees that)."""
    if state is None or state.status is not JobStatus.RUNNING:
        return False
    return state.finishing or any(n.info.finished_round(state.round) for n in nodes)


def newcomer_round(state: JobState | None, round_: int) -> bool:
    """``state`` is the round after ``round_`` forming for newcomers alone: no failure, no loss."""
    return (
        state is not None
        and state.status is JobStatus.JOINING
        and state.round == round_ + 1
        and state.cause.waiting > 0
        and not state.cause.failures
        and not state.cause.lost
    )


def closed_finished(state: JobState | None, round_: int) -> bool:
    """``state`` is the job closed because it finished, in round ``round_`` or in the newcomer's
    round after it (a participant that finished it closed the job from there)."""
    return (
        state is not None
        and state.status is JobStatus.CLOSED
        and state.round in (round_, round_ + 1)
        and not state.failed
        and not state.closed_by
    )


class Ending(enum.Enum):
    """How round ``round_`` ended, seen by a node whose workers of it succeeded."""

    FINISHED = "finished"  # every participant's workers succeeded: the job is done
    GOES_ON = "goes on"  # a participant's workers were stopped for the next round (or it is gone)
    UNDECIDED = "undecided"  # a participant has not yet said either


def ending_after(previous: Sequence[Participant], nodes: Sequence[LiveNode], round_: int) -> Ending:
    """Round ``round_`` (its participants ``previous``) after the job moved on to a newcomer's round:
    the newcomer came just before the last workers ended, so each participant either finished the
    round or had its workers stopped and asked for the next one. Every participant finished: the job
    is done, and the newcomer hears it close. One stopped (or gone): the job goes on with the newcomer."""
    live = {n.info.node: n.info for n in nodes}
    infos = [live.get(p.node) for p in previous]
    if infos and all(info is not None and info.finished_round(round_) for info in infos):
        return Ending.FINISHED
    if any(info is None or (info.round > round_ and not info.finished) for info in infos):
        return Ending.GOES_ON
    return Ending.UNDECIDED


def rerun_refused(closed: JobState, launched_at: float, live_nodes: int) -> tuple[str, bool] | None:
    """Why this launch may not begin a new run of the closed job ``closed``, and whether waiting
    would change that; None: it may (torchrun's c10d runs the same id again, so does this).

    ``launched_at``: when this node's agent was launched (wall clock); ``live_nodes``: the node keys
    under the job, read with the state (lease-held: an agent of the old run still alive). A node
    launched before the job closed is a late node of that run, never of a new one; a job an
    operator closed stays closed until ``elastic-ctl reset``.
    """
    if closed.closed_by == CLOSED_BY_OPERATOR:
        return "an operator closed it", False
    closed_at = closed.keep.closed_at
    if closed_at is None:
        return "its state does not say when it closed", False
    if launched_at <= closed_at:
        early = closed_at - launched_at
        return f"this node was launched {early:.1f} s before it closed: a late node of that run", False
    if live_nodes:
        return f"{live_nodes} node(s) of the finished run are still alive", True
    return None
