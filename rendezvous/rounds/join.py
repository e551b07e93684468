"""What a node learns from a round (``RendezvousInfo``, ``Progress``), and the join protocol as pure
decisions: from what one read (or the watch since) showed, what this node does next on its way into
a round. ``RendezvousHandler.next_rendezvous`` executes them; the round's own rules (when it
freezes, who gets which rank) are ``rendezvous.rounds.decide``'s."""

from __future__ import annotations

from dataclasses import dataclass

from rendezvous.job.progress import Streak
from rendezvous.job.state import JobState, JobStatus

__all__ = [
    "RendezvousInfo",
    "Progress",
    "Closed",
    "Frozen",
    "Announce",
    "ReadAll",
    "Coordinate",
    "Follow",
    "JoinStep",
    "join_step",
    "target_round",
    "progress_of",
    "waits_as_spare",
]


@dataclass(frozen=True)
class RendezvousInfo:
    """What a node learns from a completed round."""

    run_id: str
    round: int
    node: str
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    world_size: int  # workers in the whole job: the sum of every node's local world size
    base_global_rank: int  # the global rank of this node's local rank 0
    restart_count: int = 0  # the job's restart count (TORCHELASTIC_RESTART_COUNT of every worker)
    max_restarts: int = 0  # the job's budget (TORCHELASTIC_MAX_RESTARTS)
    watch: tuple = ()  # the peers this node probes this round (``ranktable.Target``s)
    min_nodes: int = 0  # the job's --nnodes (the first agent's; 0: not known)
    max_nodes: int = 0
    streak: Streak = Streak()  # the job's restarts in a row with no progress (the crash-loop breaker's)


@dataclass(frozen=True)
class Progress:
    """How a forming round looks from here, for a progress line."""

    round: int
    nodes_joined: int
    min_nodes: int
    max_nodes: int
    last_call_in: float | None  # seconds until the coordinator freezes the round, if known
    timeout_in: float | None = None  # seconds until this node's join_timeout, if known
    stopping: tuple[str, ...] = ()  # participants of the round before whose workers the round waits for
    running: int | None = None  # the round before runs with this many nodes and nobody forms this one yet
    silent: tuple[tuple[str, float], ...] = ()  # nodes the round waits for whose lease is not renewed: seconds left
    coordinator: str = ""  # set when one of those is the coordinator (nobody forms the round meanwhile)
    stayer: bool = False  # with ``running``: this node ran in that round (it waits for the next to start)

    @property
    def key(self) -> tuple:
        """What a new progress line is said for when it changes."""
        return (self.nodes_joined, self.last_call_in is not None, self.stopping, self.running, self.silent_nodes)

    @property
    def silent_nodes(self) -> tuple[str, ...]:
        return tuple(node for node, _ in self.silent)


@dataclass(frozen=True)
class Closed:
    """The job is closed: nobody joins it again."""


@dataclass(frozen=True)
class Frozen:
    """The round froze: this node's row in its rank table says whether it takes part."""


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


JoinStep = Closed | Frozen | Announce | ReadAll | Coordinate | Follow


def target_round(state: JobState | None) -> int:
    """The round a node starting to join asks for: the one forming, else the one after the last."""
    if state is None:
        return 1
    return state.round if state.status is JobStatus.JOINING else state.round + 1


def join_step(
    state: JobState | None,
    target: int,
    node: str,
    *,
    coordinator: str | None,
    all_nodes: bool,
    lease_alive: bool,
) -> JoinStep:
    """What ``node``, waiting for round ``target``, does next given the state and who coordinates."""
    if state is not None and state.status is JobStatus.CLOSED:
        return Closed()
    if state is not None and state.status is JobStatus.RUNNING and state.round >= target:
        return Frozen()
    if state is not None and state.status is JobStatus.JOINING and state.round > target:
        return Announce(state.round)
    if not lease_alive:
        return Announce(target)
    if coordinator == node:
        return Coordinate() if all_nodes else ReadAll()
    return Follow(coordinator or "")


def waits_as_spare(state: JobState | None, target: int) -> bool:
    """Whether a node waiting for round ``target`` waits as a spare: a round runs without it."""
    return state is not None and state.status is JobStatus.RUNNING and state.round < target


def progress_of(
    state: JobState | None,
    target: int,
    min_nodes: int,
    max_nodes: int,
    now: float,
    timeout_in: float | None,
    ran_in: int | None = None,
) -> Progress | None:
    """How round ``target`` looks to a node waiting for it (``ran_in``: the round it last ran in),
    from the state read at wall-clock ``now``;
    None when a line could only be stale: the round froze (with or without this node) or the job
    closed, which the join loop is about to tell."""
    if state is not None and state.status is JobStatus.JOINING and state.round == target:
        last_call_in = None if state.last_call_at is None else max(state.last_call_at - now, 0.0)
        silent = tuple((node, max(when - now, 0.0)) for node, when in state.silent)
        return Progress(
            target, state.joined, min_nodes, max_nodes, last_call_in, timeout_in, state.stopping, silent=silent
        )
    if waits_as_spare(state, target):  # a node waiting for a place: the round before runs without it
        stayer = ran_in == state.round
        return Progress(target, 0, min_nodes, max_nodes, None, timeout_in, running=state.size, stayer=stayer)
    if state is None or (state.status is JobStatus.JOINING and state.round < target):
        return Progress(target, 0, min_nodes, max_nodes, None, timeout_in)  # nobody has said more yet
    return None
