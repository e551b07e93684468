"""The join protocol as pure decisions: from what one read (or the watch since) showed, what this node
does next on its way into a round. ``RendezvousHandler.next_rendezvous`` executes them; the round's
own rules (when it freezes, who gets which rank) are ``rendezvous.decide``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .state import JobState, JobStatus, Participant

__all__ = ["Closed", "Joined", "Announce", "ReadAll", "Coordinate", "Follow", "JoinStep", "join_step", "target_round"]


@dataclass(frozen=True)
class Closed:
    """The job is closed: nobody joins it again."""


@dataclass(frozen=True)
class Joined:
    """The round froze with this node in it."""

    participant: Participant


@dataclass(frozen=True)
class Announce:
    """(Re)write this node's key asking for ``round`` (a later round, or on a new lease)."""

    round: int


@dataclass(frozen=True)
class ReadAll:
    """This node coordinates: read every node before deciding."""


@dataclass(frozen=True)
class Coordinate:
    """This node coordinates and knows every node: decide the round."""


@dataclass(frozen=True)
class Follow:
    """Wait on the state and on the coordinator's key (``leader``; "" when nobody coordinates yet)."""

    leader: str


JoinStep = Union[Closed, Joined, Announce, ReadAll, Coordinate, Follow]


def target_round(state: JobState | None) -> int:
    """The round a node starting to join asks for: the one forming, else the one after the last."""
    if state is None:
        return 1
    return state.round if state.status is JobStatus.JOINING else state.round + 1


def join_step(
    state: JobState | None, target: int, node: str, *, coordinator: str | None, all_nodes: bool, lease_alive: bool,
) -> JoinStep:
    """What ``node``, waiting for round ``target``, does next given the state and who coordinates."""
    if state is not None and state.status is JobStatus.CLOSED:
        return Closed()
    if state is not None and state.status is JobStatus.RUNNING and state.round >= target:
        me = state.participant(node)
        # the round froze without us: wait for the next one
        return Joined(me) if me is not None else Announce(state.round + 1)
    if state is not None and state.status is JobStatus.JOINING and state.round > target:
        return Announce(state.round)
    if not lease_alive:
        return Announce(target)
    if coordinator == node:
        return Coordinate() if all_nodes else ReadAll()
    return Follow(coordinator or "")
