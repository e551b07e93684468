"""Lease-held membership: a job's node keys, and the view of who is alive.

- An agent's node key is written on its lease (``rendezvous.session.Session``), so it vanishes
  when the agent's lease ends and everyone watching hears it.
- ``JobKeys`` names a job's keys. ``read_nodes`` / ``read_round`` are the reads the rounds use.
- ``JobMonitor`` follows a running round by watch (never by polling): which participants are gone,
  how many nodes wait to join, whether the job state moved on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from .client import EtcdClient
from .txn import KeyValue, op_get, op_get_first_created
from .decide import LiveNode, coordinator, failures_reported, lost_participants, newcomers, nodes_waiting
from .errors import RendezvousStateError
from .jobstore import decode_state
from .keys import JobKeys
from .state import JobState, JobStatus, NodeInfo
from .watch import EventType, KeyRange, Watch, WatchEvent

__all__ = [
    "Snapshot", "read_round", "apply_node_event", "apply_round_events", "read_nodes", "JobMonitor",
    "RoundFollower",
]

@dataclass(frozen=True)
class Snapshot:
    """What one read showed, brought up to date by watch events: the state (and its token), the
    nodes (every node when ``all_nodes``, else none), and the coordinator.

    ``revision`` is the store revision of the read; events after the read advance the state and
    nodes but not it, since a watch of two key ranges may deliver one range's events late.
    """

    state: JobState | None
    token: int | None
    nodes: tuple[LiveNode, ...]
    revision: int
    coordinator: str | None  # the coordinator: the live node key created first
    all_nodes: bool = False


def _decode_state(keys: JobKeys, kvs) -> tuple[JobState | None, int | None]:
    if not kvs:
        return None, None
    kv = KeyValue.from_proto(kvs[0])
    return decode_state(keys, kv.value), kv.mod_revision


def _decode_nodes(kvs) -> tuple[LiveNode, ...]:
    nodes = []
    for kv in kvs:
        try:
            nodes.append(LiveNode(NodeInfo.decode(kv.value, f"node record {kv.key!r}"), kv.create_revision))
        except RendezvousStateError:
            continue  # a stray key under nodes/ is not a node; it takes no part
    return tuple(nodes)


def read_round(client: EtcdClient, keys: JobKeys, *, all_nodes: bool, put: Any = None) -> Snapshot:
    """State and nodes at one revision, in one round trip.

    With ``all_nodes`` False only the first-created node key is read (enough to know who coordinates).
    ``put`` (an ``op_put``) is written in the same transaction, before the reads.
    """
    ops = [op_get(keys.state), op_get(keys.nodes, prefix=True) if all_nodes else op_get_first_created(keys.nodes)]
    response = client.txn([], ([put] if put is not None else []) + ops)
    reads = response.responses[-2:]
    state, token = _decode_state(keys, reads[0].response_range.kvs)
    node_kvs = reads[1].response_range.kvs
    nodes = _decode_nodes(node_kvs)
    # without all nodes, the one read is the first-created node key: the coordinator itself
    return Snapshot(state, token, nodes if all_nodes else (), response.header.revision, coordinator(nodes), all_nodes)


def apply_node_event(keys: JobKeys, nodes: dict[str, LiveNode], event: WatchEvent) -> None:
    """Bring ``nodes`` (by node id) up to date with a put or delete under the nodes prefix.

    A value that is not a node record takes the key out, as ``read_round`` leaves it out.
    """
    node_id = event.key.decode(errors="replace")[len(keys.nodes):]
    if event.type is EventType.PUT:
        try:
            nodes[node_id] = LiveNode(NodeInfo.decode(event.value), event.create_revision)
            return
        except RendezvousStateError:
            pass
    nodes.pop(node_id, None)


def apply_round_events(keys: JobKeys, snapshot: Snapshot, events: list[WatchEvent]) -> Snapshot | None:
    """The snapshot after the events of a round's watch, or None when only a read can tell.

    The watch carries values, so a new state is the state now (its token is the event's revision),
    and a snapshot of every node follows node puts and deletions. A follower's snapshot holds no
    nodes: a node event (the coordinator's key deleted) needs a read, to learn who coordinates now.
    A resync (history lost) or a deleted or corrupt state needs a read too.
    """
    state, token = snapshot.state, snapshot.token
    nodes = {n.info.node: n for n in snapshot.nodes}
    state_key = keys.state_bytes
    for event in events:
        if event.type is EventType.RESYNC:
            return None
        if event.revision <= snapshot.revision:
            continue  # the read already showed it
        if event.key == state_key:
            if event.type is not EventType.PUT:
                return None
            if token is not None and event.revision <= token:
                continue
            try:
                state = decode_state(keys, event.value)
            except RendezvousStateError:
                return None  # the read that follows reports it
            token = event.revision
            continue
        if not snapshot.all_nodes:
            return None
        apply_node_event(keys, nodes, event)
    if not snapshot.all_nodes:
        return Snapshot(state, token, (), snapshot.revision, snapshot.coordinator)
    live = tuple(nodes.values())
    return Snapshot(state, token, live, snapshot.revision, coordinator(live), True)


def read_nodes(client: EtcdClient, keys: JobKeys) -> tuple[tuple[LiveNode, ...], int]:
    kvs, revision = client.get_prefix(keys.nodes)
    return _decode_nodes(kvs), revision


class JobMonitor:
    """Follows a running round by watch: lost participants, waiting nodes, state changes.

    ``poll()`` applies what the watch delivered so far without waiting; ``wait(timeout)`` blocks
    until something arrives. Both are cheap enough for an agent's 0.1 s monitor loop.
    """

    def __init__(self, client: EtcdClient, keys: JobKeys, round_: int) -> None:
        self._client = client
        self._keys = keys
        self._state: JobState | None = None
        self._round = round_
        self._nodes: dict[str, LiveNode] = {}
        self._resync()
        self._watch = Watch(
            client, KeyRange(keys.state), KeyRange(keys.nodes, prefix=True), start_revision=self._revision + 1
        )

    def _resync(self) -> None:
        snapshot = read_round(self._client, self._keys, all_nodes=True)
        self._nodes = {n.info.node: n for n in snapshot.nodes}
        self._state = snapshot.state
        self._revision = snapshot.revision

    def poll(self) -> None:
        for event in self._watch.drain():
            self._apply(event)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a change of membership or state; True when there is one."""
        if self.changed:
            return True
        self.next_event(timeout)
        return self.changed

    def next_event(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the watch to deliver something, and apply it all."""
        event = self._watch.get(timeout)
        if event is None:
            return False
        self._apply(event)
        self.poll()
        return True

    def _apply(self, event) -> None:
        if event.type is EventType.RESYNC:
            self._resync()
            return
        if event.key == self._keys.state_bytes:
            if event.type is EventType.DELETE:
                self._state = None
            else:
                try:
                    self._state = decode_state(self._keys, event.value)
                except RendezvousStateError:
                    pass  # the next read by next_rendezvous reports it
            return
        apply_node_event(self._keys, self._nodes, event)

    @property
    def state(self) -> JobState | None:
        return self._state

    def _mine(self) -> JobState | None:
        """The state, while it is still the running round this monitor follows."""
        state = self._state
        if state is None or state.round != self._round or state.status is not JobStatus.RUNNING:
            return None
        return state

    @property
    def lost(self) -> list[str]:
        return lost_participants(self._mine(), set(self._nodes))

    @property
    def waiting(self) -> int:
        return nodes_waiting(self._mine(), list(self._nodes.values()))

    @property
    def failures(self) -> list[str]:
        return failures_reported(self._mine(), list(self._nodes.values()))

    @property
    def newcomers(self) -> list[str]:
        return newcomers(self._mine(), list(self._nodes.values()))

    @property
    def moved_on(self) -> bool:
        """The job left this round: another round is forming or running, or it closed, or was reset."""
        return self._mine() is None

    @property
    def finished(self) -> bool:
        """Every participant of this round said its workers all succeeded."""
        state = self._mine()
        if state is None:
            return False
        for participant in state.participants:
            node = self._nodes.get(participant.node)
            if node is None or not node.info.finished_round(self._round):
                return False
        return True

    @property
    def some_finished(self) -> bool:
        """A participant of this round said its workers all succeeded: the job is ending."""
        state = self._mine()
        return state is not None and any(
            (node := self._nodes.get(p.node)) is not None and node.info.finished_round(self._round) for p in state.participants)

    @property
    def changed(self) -> bool:
        return bool(self.lost) or self.waiting > 0 or self.moved_on

    def close(self) -> None:
        self._watch.close()


class RoundFollower:
    """A follower's watch while a round forms: the coordinator (``leader`` "") hears the state and
    every node change; a follower the state and the deletion of the coordinator's key, which may
    make it the coordinator. Reopened when the coordinator changes.

    A follower watching one key rather than the nodes prefix keeps etcd's work per node change
    constant: with K followers on the prefix, every join would be matched against K watchers.
    """

    def __init__(self, client: EtcdClient, keys: JobKeys) -> None:
        self._client = client
        self._keys = keys
        self._watch: Watch | None = None
        self._leader: str | None = None

    def next(self, snapshot: Snapshot, leader: str, timeout: float) -> Snapshot | None:
        """The snapshot after what the watch carries within ``timeout`` (unchanged when nothing
        came), or None when only a read can tell (the coordinator changed, history was lost)."""
        if self._watch is None or self._leader != leader:
            self.close()
            nodes = KeyRange(self._keys.nodes, prefix=True) if not leader else KeyRange(self._keys.node(leader), deletes_only=True)
            self._watch = Watch(self._client, KeyRange(self._keys.state), nodes, start_revision=snapshot.revision + 1)
            self._leader = leader
        event = self._watch.get(timeout=timeout)
        return snapshot if event is None else apply_round_events(self._keys, snapshot, [event, *self._watch.drain()])

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
