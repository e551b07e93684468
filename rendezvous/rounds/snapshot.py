"""Lease-held membership: a job's node keys, and the view of who is alive.

- An agent's node key is written on its lease (``rendezvous.etcd.session.Session``), so it vanishes
  when the agent's lease ends and everyone watching hears it.
- ``read_nodes`` / ``read_round`` are the reads the rounds use; ``apply_round_events`` brings a
  read up to date by watch, and ``RoundFollower`` is the watch of a node waiting for a round.
- Following a running round is ``rendezvous.rounds.monitor.JobMonitor``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from rendezvous.errors import RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.recipes import Election
from rendezvous.etcd.txn import KeyValue, op_get
from rendezvous.etcd.watch import EventType, KeyRange, Watch, WatchEvent
from rendezvous.job.keys import JobKeys
from rendezvous.job.ranktable import read_table
from rendezvous.job.state import JobState, NodeInfo
from rendezvous.job.store import decode_state

from .decide import LiveNode

__all__ = [
    "Snapshot",
    "Handover",
    "read_round",
    "apply_node_event",
    "apply_round_events",
    "read_nodes",
    "RoundFollower",
    "round_watch",
    "coordinator_election",
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
    coordinator: str | None  # the coordinator: the holder of the coordinator key (``coordinator_election``)
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
            nodes.append(LiveNode(NodeInfo.decode(kv.value, f"node record {kv.key!r}"), kv.create_revision, kv.lease))
        except RendezvousStateError:
            continue  # a stray key under nodes/ is not a node; it takes no part
    return tuple(nodes)


@dataclass(frozen=True)
class Handover:
    """A join's watch and what it showed, for the round's monitor to go on with: following the round
    then costs no read and no new stream."""

    watch: Watch
    coordinating: bool  # the watch is the coordinator's (it follows every node)
    snapshot: Snapshot


def read_round(
    client: EtcdClient, keys: JobKeys, *, all_nodes: bool, put: Any = None, claim: tuple[str, int] | None = None
) -> Snapshot:
    """State, coordinator and (``all_nodes``) every node and the state's rank table, at one revision.

    ``put`` (an ``op_put``) is written in the same transaction, before the reads. ``claim`` (node,
    lease): when nobody coordinates, that node becomes the coordinator (its key on that lease).
    """
    reads = [op_get(keys.state)] + ([op_get(keys.nodes, prefix=True)] if all_nodes else [])
    before = [put] if put is not None else []
    election = coordinator_election(keys)
    if claim is None:
        held = election.observe(client, before=before, reads=reads)
    else:
        held = election.campaign(client, *claim, before=before, reads=reads)
    state, token = _decode_state(keys, held.reads[0].kvs)
    nodes = _decode_nodes(held.reads[1].kvs) if all_nodes else ()
    revision, leader = held.revision, held.holder
    if all_nodes and state is not None and state.table:
        state = replace(state, participants=read_table(client, keys, state, revision))
    return Snapshot(state, token, nodes, revision, leader, all_nodes)


def apply_node_event(keys: JobKeys, nodes: dict[str, LiveNode], event: WatchEvent) -> None:
    """Bring ``nodes`` (by node id) up to date with a put or delete under the nodes prefix.

    A value that is not a node record takes the key out, as ``read_round`` leaves it out.
    """
    node_id = event.key.decode(errors="replace")[len(keys.nodes) :]
    if event.type is EventType.PUT:
        try:
            nodes[node_id] = LiveNode(NodeInfo.decode(event.value), event.create_revision, event.lease)
            return
        except RendezvousStateError:
            pass
    nodes.pop(node_id, None)


def apply_round_events(keys: JobKeys, snapshot: Snapshot, events: list[WatchEvent]) -> Snapshot | None:
    """The snapshot after the events of a round's watch, or None when only a read can tell.

    The one way watch events are applied, for a node joining a round and for the monitor of a
    running one alike. The watch carries values, so a new state is the state now (its token is the
    event's revision), and a snapshot of every node follows node puts and deletions. A read is
    needed for: a resync (history lost), the coordinator key changing (the read may make this node
    the coordinator), a deleted state or one that is not ours (the read reports it), and any node
    event in a snapshot that holds no nodes. A state naming another rank table than the one read
    carries no participants: a view that needs them reads them (``RoundFollower`` does).
    """
    state, token = snapshot.state, snapshot.token
    nodes = {n.info.node: n for n in snapshot.nodes} if snapshot.all_nodes else None
    state_key, coordinator_key = keys.state_bytes, keys.coordinator.encode()
    for event in events:
        if event.type is EventType.RESYNC:
            return None
        if event.revision <= snapshot.revision:
            continue  # the read already showed it
        if event.key == coordinator_key:
            return None
        if event.key == state_key:
            if event.type is not EventType.PUT:
                return None
            if token is not None and event.revision <= token:
                continue
            try:
                new = decode_state(keys, event.value)
            except RendezvousStateError:
                return None  # the read that follows reports it
            if state is not None and new.table == state.table:
                new = replace(new, participants=state.participants)
            state, token = new, event.revision
            continue
        if nodes is None:
            return None
        apply_node_event(keys, nodes, event)
    live = tuple(nodes.values()) if nodes is not None else ()
    return Snapshot(state, token, live, snapshot.revision, snapshot.coordinator, snapshot.all_nodes)


def lacks_table(snapshot: Snapshot) -> bool:
    """The state names a rank table whose rows this snapshot did not read."""
    state = snapshot.state
    return state is not None and bool(state.table) and not state.participants


def read_nodes(client: EtcdClient, keys: JobKeys) -> tuple[tuple[LiveNode, ...], int]:
    kvs, revision = client.get_prefix(keys.nodes)
    return _decode_nodes(kvs), revision


class RoundFollower:
    """A follower's watch while a round forms: the coordinator (``leader`` "") hears the state and
    every node change; a follower the state and the deletion of the coordinator's key, which may
    make it the coordinator. Reopened when the coordinator changes.

    A follower watching one key rather than the nodes prefix keeps etcd's work per node change
    constant: with K followers on the prefix, every join would be matched against K watchers.
    """

    GATHER = 0.1  # seconds the coordinator keeps taking node events into one batch
    QUIET = 0.01  # ... while they come at least this often

    def __init__(self, client: EtcdClient, keys: JobKeys, watch: Watch | None = None) -> None:
        """``watch``: a follower's watch (the state and the coordinator key) to go on with."""
        self._client = client
        self._keys = keys
        self._watch = watch
        self._coordinating: bool | None = None if watch is None else False

    def next(self, snapshot: Snapshot, leader: str, timeout: float) -> Snapshot | None:
        """The snapshot after what the watch carries within ``timeout`` (unchanged when nothing
        came), or None when only a read can tell (the coordinator changed, history was lost).

        The coordinator takes node events in batches (up to GATHER seconds while they keep coming):
        each batch costs it one look at every node, so K joins must not mean K looks."""
        coordinating = not leader
        if self._watch is None or self._coordinating != coordinating:
            self.close()
            self._watch = round_watch(self._client, self._keys, coordinating, snapshot.revision + 1)
            self._coordinating = coordinating
        event = self._watch.get(timeout=timeout)
        if event is None:
            return snapshot
        events = [event, *self._watch.drain()]
        if not leader:
            events += self._gather()
        after = apply_round_events(self._keys, snapshot, events)
        if after is not None and coordinating and lacks_table(after):
            return None  # the coordinator decides from the table of the round before: read it
        return after

    def _gather(self) -> list[WatchEvent]:
        events: list[WatchEvent] = []
        until = time.monotonic() + self.GATHER
        while (left := until - time.monotonic()) > 0:
            event = self._watch.get(timeout=min(left, self.QUIET))
            if event is None:
                break
            events += [event, *self._watch.drain()]
        return events

    def detach(self) -> tuple[Watch, bool] | None:
        """The watch, to go on with (and whether it is the coordinator's); this follower lets go of it."""
        watch, self._watch = self._watch, None
        return (watch, bool(self._coordinating)) if watch is not None else None

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close(wait=False)
            self._watch = None


def coordinator_election(keys: JobKeys) -> Election:
    """Who coordinates the job's rounds: the holder of its ``coordinator`` key, on that node's lease."""
    return Election(keys.coordinator)


def round_watch(client: EtcdClient, keys: JobKeys, coordinating: bool, start_revision: int) -> Watch:
    """The state, and every node (the coordinator) or the coordinator's going (anyone else)."""
    other = KeyRange(keys.nodes, prefix=True) if coordinating else coordinator_election(keys).vacated()
    return Watch(client, KeyRange(keys.state), other, start_revision=start_revision)
