"""Following a running round, at a cost to etcd that does not grow with the job on any one node.

One node -- the coordinator, the holder of the ``coordinator`` key -- keeps the round: it reads every
node and the round's rank table once, and watches the nodes prefix. When a participant's key goes,
a node asks for the next round (its workers failed, or it is new and there is room), or the first
participant finishes, it says so in the job state, by compare-and-swap: the next round forming
(with the cause, for every node's one line) or the round finishing. Every other node watches two
keys: the state, and the coordinator key, whose deletion (the coordinator's lease ended) makes them
claim it -- one wins and keeps the round from then on. So a change costs etcd O(K) events in all,
where K monitors on the nodes prefix would each receive every node's every write.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import replace

from rendezvous.errors import LeaseNotFoundError, RendezvousError, RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.watch import Watch, WatchEvent
from rendezvous.job.keys import JobKeys
from rendezvous.job.state import Cause, JobState, JobStatus
from rendezvous.job.store import JobStateStore

from .decide import LiveNode, forming_state, joined, still_running
from .ending import closed_finished, round_cause
from .snapshot import Handover, Snapshot, apply_round_events, read_round, round_watch

__all__ = ["JobMonitor"]


def _locked(method):
    """Run under the monitor's lock: its thread changes the nodes and the state as events come."""

    @functools.wraps(method)
    def locked(self):
        with self._changes:
            return method(self)

    return locked


class JobMonitor:
    """Follows a running round by watch: lost participants, waiting nodes, state changes.

    A follower applies the watch's events when asked (``poll``, ``wait``): they only ever change
    what it is told. The keeper applies them in a thread of its own as they come, and publishes what
    changed, so every node learns of a change whatever the keeper's agent is busy with.
    ``handover``: the watch (the coordinator's, or not) and the snapshot the round was joined with
    (``RoundFollower.detach``), so that following the round costs no read and no new stream.
    """

    RETRY = 0.5  # seconds before the keeper's thread reads again after etcd failed it

    def __init__(
        self,
        client: EtcdClient,
        keys: JobKeys,
        round_: int,
        node: str = "",
        lease: int = 0,
        handover: Handover | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._round = round_
        self._node, self._lease = node, lease
        self._store = JobStateStore(client, keys)
        self._changes = threading.Condition()  # guards what the events built; notified on each batch
        self._version = 0
        self._closed = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._published: tuple | None = None
        self.keeper = False
        self.lease_gone = False  # etcd said this node's lease is gone: it is no longer a member
        self._view = Snapshot(None, None, (), 0, None)  # what the read and the watch since showed
        if handover is not None:
            snapshot = handover.snapshot
            if handover.coordinating != (snapshot.coordinator == node) or (
                handover.coordinating and not snapshot.all_nodes
            ):
                handover.watch.close(wait=False)  # not the watch (or the view) this node's part needs: read
                handover = None
        if handover is None:
            self._setup()
        else:
            self._adopt(handover.watch, handover.snapshot)

    def _setup(self) -> None:
        """Read the state and the coordinator (claiming it if nobody holds it); the keeper reads every node too.

        A state that is not ours ends the round for this monitor: the join that follows reads it
        again and names the error."""
        claim = (self._node, self._lease) if self._node and self._lease else None
        try:
            try:
                snapshot = read_round(self._client, self._keys, all_nodes=False, claim=claim)
            except LeaseNotFoundError:  # this node's lease ended: it is no longer a member (``lease_gone``)
                self.lease_gone = True
                snapshot = read_round(self._client, self._keys, all_nodes=False)
            if self._node and snapshot.coordinator == self._node:
                snapshot = read_round(self._client, self._keys, all_nodes=True)
        except RendezvousStateError:
            with self._changes:
                self._view = replace(self._view, state=None, token=None)
                self._changed()
            self._closed.set()
            return
        watch = round_watch(self._client, self._keys, snapshot.all_nodes, snapshot.revision + 1)
        self._adopt(watch, snapshot)

    def _adopt(self, watch: Watch, snapshot: Snapshot) -> None:
        if self._closed.is_set():
            watch.close(wait=False)
            return
        with self._changes:
            old, self._watch = self._watch, watch
            self.keeper = bool(self._node) and snapshot.coordinator == self._node
            self._view = snapshot
            self._changed()
        if old is not None and old is not watch:
            old.close(wait=False)
        if self.keeper and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"round-{self._round}-keeper", daemon=True)
            self._thread.start()
        self._publish()

    def _run(self) -> None:
        stale = False  # only a new read can tell (history lost)
        renew_at = time.monotonic() + _renew_every(self.state)
        while not self._closed.is_set():
            try:
                if stale:
                    self._setup()
                    stale = False
                    continue
                event = self._watch.get(timeout=max(renew_at - time.monotonic(), 0.0))  # close() wakes it
                if event is not None:
                    stale = not self._apply_all([event, *self._watch.drain()])
                if time.monotonic() >= renew_at:
                    renew_at = time.monotonic() + self._renew()
            except RendezvousError:
                self._closed.wait(self.RETRY)  # etcd out of reach while reading or publishing: try again

    def _renew(self) -> float:
        """Renew the job's lease; seconds until the next renewal (a minute, after a failed one)."""
        try:
            self._store.renew(self.state)
        except RendezvousError:
            return 60.0
        return _renew_every(self.state)

    def _changed(self) -> None:
        self._version += 1
        self._changes.notify_all()

    def poll(self) -> None:
        """Apply what the watch delivered so far (the keeper's thread does that by itself)."""
        if self._thread is None and self._watch is not None:
            self._take(self._watch.drain())

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a change of membership or state; True when there is one."""
        self.poll()
        if self.changed:
            return True
        self.next_event(timeout)
        return self.changed

    def next_event(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the watch to deliver something (applied by then)."""
        if self._thread is None:
            event = self._watch.get(timeout) if self._watch is not None else None
            if event is None:
                return False
            self._take([event, *self._watch.drain()])
            return True
        with self._changes:
            seen = self._version
            return self._changes.wait_for(lambda: self._version != seen, timeout=max(timeout, 0.0))

    def _take(self, events: list[WatchEvent]) -> None:
        """A follower applies events in its caller's thread; what only a read can tell means a read."""
        if events and not self._apply_all(events):
            self._setup()

    def _apply_all(self, events: list[WatchEvent]) -> bool:
        """Apply a batch (``apply_round_events``) and publish what it changed; False when a new read is needed."""
        with self._changes:
            after = apply_round_events(self._keys, self._view, events)
            if after is not None:
                self._view = after
                self._changed()
        if after is not None:
            self._publish()
        return after is not None

    def detach(self) -> tuple[Watch, bool] | None:
        """A follower's watch, for the next round's join to go on with (None for the keeper)."""
        if self._thread is not None or self._watch is None:
            return None
        watch, self._watch = self._watch, None
        self._closed.set()
        return watch, False

    def _publish(self) -> None:
        """The keeper tells every node, by one write of the state, that the round ends or is ending."""
        with self._changes:
            state, token = self._mine(), self._view.token
            if not self.keeper or state is None:
                return
            nodes = list(self._view.nodes)
            cause = round_cause(state, nodes)
            if cause.lost or cause.waiting > 0:
                change, new = (
                    "next",
                    forming_state(
                        state,
                        state.run_id,
                        state.round + 1,
                        min_nodes=state.min_nodes,
                        max_nodes=state.max_nodes,
                        last_call_at=None,
                        max_restarts=state.max_restarts,
                        cause=cause,
                        joined=len(joined(nodes, state.round + 1)),
                        # whom the next round waits for, said now: the coordinator may be one of them,
                        # busy stopping its own workers, and say nothing more until they are gone
                        stopping=still_running(state.participants, nodes, state.round + 1),
                    ),
                )
            elif self.some_finished and not state.finishing:
                change, new = "finishing", replace(state, finishing=True)
            else:
                return
            if self._published == (change, token):
                return
        self._store.compare_and_swap(new, token)
        self._published = (change, token)  # once: the watch brings the state it wrote (or the one that won)

    @property
    def state(self) -> JobState | None:
        return self._view.state

    def _by_node(self) -> dict[str, LiveNode]:
        return {n.info.node: n for n in self._view.nodes}

    def _mine(self) -> JobState | None:
        """The state, while it is still the running round this monitor follows."""
        state = self._view.state
        if state is None or state.round != self._round or state.status is not JobStatus.RUNNING:
            return None
        return state

    def _cause(self) -> Cause | None:
        """What the keeper said ended this round, once the next one is forming."""
        state = self._view.state
        if state is not None and state.status is JobStatus.JOINING and state.round > self._round:
            return state.cause
        return None

    def _told(self) -> Cause:
        """Why this round ends: what the keeper said, or (for the keeper, until it said so) what it sees."""
        cause = self._cause()
        if cause is not None or not self.keeper:
            return cause or Cause()
        return round_cause(self._mine(), list(self._view.nodes))

    @property
    @_locked
    def cause(self) -> Cause:
        """Why this round ends (who failed, who left, who joins, how many wait): what the keeper said
        in the state, or for the keeper, until it said so, what it sees."""
        return self._told()

    @property
    def moved_on(self) -> bool:
        """The job left this round: another round is forming or running, or it closed, or was reset."""
        return self._mine() is None

    @property
    @_locked
    def finished(self) -> bool:
        """Every participant of this round said its workers all succeeded or, once the round is
        finishing, left it (for a node other than the keeper: the keeper's node saw that and closed
        the job)."""
        state = self._mine()
        if state is None or not self.keeper:
            return closed_finished(self._view.state, self._round)
        nodes = self._by_node()
        for participant in state.participants:
            node = nodes.get(participant.node)
            if node is None and state.finishing:
                continue  # it left an ending round (ending.lost_participants)
            if node is None or not node.info.finished_round(self._round):
                return False
        return True

    def unfinished(self, quiet: bool = True) -> tuple[str, ...] | None:
        """The participants of this round whose workers have not all succeeded nor gone quiet at exit
        (``NodeInfo.done_round``; not ``quiet``: whose workers have not all succeeded; a participant
        whose key is gone included, unless the round is finishing), sorted; None when the job left
        the round. The keeper answers from what it watches; another node reads every node's key once
        (a look taken only while the job ends: ``launcher.hangs.exitstuck``, and the exit barrier's
        last word)."""
        with self._changes:
            state, nodes = self._mine(), self._view.nodes if self.keeper else None
        if state is not None and nodes is None:  # a follower's state lacks the rank table: read both
            snapshot = read_round(self._client, self._keys, all_nodes=True)
            state, nodes = snapshot.state, snapshot.nodes
        if state is None or state.round != self._round or state.status is not JobStatus.RUNNING:
            return None
        done = {n.info.node for n in nodes if (n.info.done_round if quiet else n.info.finished_round)(self._round)}
        if state.finishing:  # a participant gone from an ending round left it (ending.lost_participants)
            done |= {p.node for p in state.participants} - {n.info.node for n in nodes}
        return tuple(sorted(p.node for p in state.participants if p.node not in done))

    @property
    @_locked
    def some_finished(self) -> bool:
        """A participant of this round said its workers all succeeded, or that those still alive went
        quiet after a rank exited 0 (``NodeInfo.done_round``: a node says so only once a rank of the
        round exited 0 somewhere): the job is ending."""
        state = self._mine()
        if state is None:
            return closed_finished(self._view.state, self._round)
        if state.finishing or not self.keeper:
            return state.finishing
        nodes = self._by_node()
        return any(
            (node := nodes.get(p.node)) is not None and node.info.done_round(self._round) for p in state.participants
        )

    @property
    @_locked
    def changed(self) -> bool:
        told = self._told()  # one look at the nodes, not one for lost and one for waiting
        return bool(told.lost) or told.waiting > 0 or self.moved_on or self.lease_gone

    def close(self, join: bool = False) -> None:
        """Stop following: the keeper's thread is woken (its watch closed, a retry's wait ended) and
        ends at once; ``join`` waits for that and for the watch's stream (when the node leaves: nothing
        of it stays behind)."""
        self._closed.set()
        if self._watch is not None:
            self._watch.close(wait=join)  # its stream is cancelled, not polled: gone at once
        if join and self._thread is not None:
            self._thread.join(timeout=2)


def _renew_every(state: JobState | None) -> float:
    """When the keeper renews the job's lease next (``Keep.renew_every``; an hour's look when it has none)."""
    return (state.keep.renew_every if state is not None else None) or 3600.0
