"""The coordinator's side of a round: decide it (``decide.decide``), tell everyone it is forming, and
freeze it -- its rank table first, then the state that names the table, by compare-and-swap.

Only the holder of the coordinator key runs this, on a view of every node that it reads once and
then follows by watch (``RoundFollower``); what it decides is ``rendezvous.rounds.decide``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from rendezvous.errors import RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.txn import op_delete
from rendezvous.job.history import HistoryWriter, record_freeze
from rendezvous.job.keys import JobKeys
from rendezvous.job.ranktable import drop_other_tables, new_table_id, watch_lists, write_table
from rendezvous.job.state import CAUSE_NAMES, Cause, JobState, JobStatus, Keep
from rendezvous.job.store import JobStateStore
from rendezvous.settings import RendezvousSettings

from .decide import (
    Freeze,
    News,
    Wait,
    decide,
    formed_cause,
    forming_news,
    forming_state,
    frozen_state,
    job_budget,
    joined,
    restart_count,
    silent_after,
    silent_nodes,
    still_running,
    streak_after,
)
from .ending import round_cause
from .snapshot import Snapshot

__all__ = ["RoundCoordinator", "PROGRESS_EVERY", "progress_every"]

PROGRESS_EVERY = 2.0  # seconds between the coordinator's updates of a forming round's joined count ...
PROGRESS_NODES = 200  # ... and one more second for every this many nodes: each update is an event for every node


def progress_every(nodes: int) -> float:
    """Seconds between updates of the joined count: every node receives each, so a big job's get rarer."""
    return max(PROGRESS_EVERY, nodes / PROGRESS_NODES)


class RoundCoordinator:
    """What this node does about a forming round while it holds the coordinator key."""

    def __init__(
        self,
        client: EtcdClient,
        settings: RendezvousSettings,
        keys: JobKeys,
        *,
        max_restarts: int,
        history: HistoryWriter | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._settings = settings
        self._keys = keys
        self._store = JobStateStore(client, keys)
        self._max_restarts = max_restarts  # this agent's; the job's is the first agent's, kept in the state
        self._history = history
        self._clock, self._wall = clock, wall_clock
        self._renewed_at = clock()
        self.start(clock())

    def start(self, now: float) -> None:
        """A new wait for a round begins (``now``): no last call started, no count told yet."""
        self._since = now
        self._last_call_start: float | None = None
        self._told_at = float("-inf")  # when the forming round's joined count was last written
        self._silent_at = float("-inf")  # when the leases of the nodes it waits for were last looked at
        self._silent: tuple[tuple[str, float], ...] = ()

    def step(self, snapshot: Snapshot, target: int) -> float | None:
        """Decide the round. Returns None after a write, else when to look again (inf: on a change)."""
        state = snapshot.state
        self._keep_job(state)
        decision = self._decide(snapshot, target)
        if isinstance(decision, Freeze):
            self._freeze(snapshot, target, decision)
            return None
        self._last_call_start = decision.last_call_start
        waiting_for = self._waiting_for(snapshot, target)
        decision = replace(decision, silent=self._silent_of(snapshot, waiting_for))
        last_call_at = None
        if decision.until is not None:
            last_call_at = round(self._wall() + (decision.until - self._clock()), 3)
        count = len(joined(snapshot.nodes, target))
        news = forming_news(state, target, decision, last_call_at, count)
        next_progress = self._told_at + progress_every(len(snapshot.nodes))
        if news is News.TELL or (news is News.RECOUNT and self._clock() >= next_progress):
            self._tell(snapshot, target, decision, last_call_at, count)
            return None
        wake = float("inf") if decision.until is None else decision.until
        if state is not None and state.keep.renew_every:
            wake = min(wake, self._renewed_at + state.keep.renew_every)  # to renew the job's lease
        if waiting_for:
            wake = min(wake, self._clock() + self._settings.renew_every)  # to see whether they went silent
        return min(wake, next_progress) if news is News.RECOUNT else wake

    def _waiting_for(self, snapshot: Snapshot, target: int) -> tuple[str, ...]:
        """Participants of the round before, alive in etcd, that have not asked for ``target``."""
        state = snapshot.state
        previous = state.participants if state is not None else ()
        return still_running(previous, snapshot.nodes, target)[:CAUSE_NAMES]

    def _silent_of(self, snapshot: Snapshot, waiting_for: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
        """Of the nodes the round waits for, those whose lease is not renewed any more (a dead or cut
        off machine), with when it runs out, for every node's progress line. Their leases are read
        once a renewal interval, and only once the wait is long enough to tell (a quick round reads
        none)."""
        now, settings = self._clock(), self._settings
        if not waiting_for:
            self._silent = ()
        elif now - self._since >= silent_after(settings.renew_every) and now >= self._silent_at + settings.renew_every:
            self._silent_at = now
            leases = {n.info.node: n.lease for n in snapshot.nodes}
            time_left = []
            for node in waiting_for:
                try:
                    time_left.append((node, self._client.lease_ttl(leases[node]) if leases.get(node) else -1))
                except RendezvousError:
                    pass  # etcd away: said at the next look
            self._silent = silent_nodes(time_left, settings.lease_ttl, settings.renew_every, self._wall())
        return tuple(s for s in self._silent if s[0] in waiting_for)

    def _decide(self, snapshot: Snapshot, target: int) -> Freeze | Wait:
        state = snapshot.state
        return decide(
            state if state is not None and state.participants else None,
            snapshot.nodes,
            target,
            min_nodes=self._settings.min_nodes,
            max_nodes=self._settings.max_nodes,
            last_call_timeout=self._settings.last_call_timeout,
            last_call_start=self._last_call_start,
            now=self._clock(),
        )

    def _tell(self, snapshot: Snapshot, target: int, decision: Wait, last_call_at: float | None, count: int) -> None:
        """Tell everyone a round is forming: how many joined, when its last call ends, whom it waits
        for (for progress lines) and, as it starts, why the running round ends."""
        state = snapshot.state
        ending = state is not None and state.status is JobStatus.RUNNING
        forming = forming_state(
            state,
            self._settings.run_id,
            target,
            min_nodes=self._settings.min_nodes,
            max_nodes=self._settings.max_nodes,
            last_call_at=last_call_at,
            max_restarts=job_budget(state, self._max_restarts),
            joined=count,
            cause=round_cause(state, snapshot.nodes) if ending else Cause(),
            retention=self._settings.retention,
            stopping=decision.stopping,
            silent=decision.silent,
        )
        self._store.compare_and_swap(forming, snapshot.token)
        self._told_at = self._clock()

    def _keep_job(self, state: JobState | None) -> None:
        """While a round forms, its coordinator renews the job's lease (``Keep.renew_every``; the
        running round's keeper does it after: ``monitor``), so a long wait loses no key."""
        if state is None or not state.keep.renew_every or self._clock() < self._renewed_at + state.keep.renew_every:
            return
        self._renewed_at = self._clock()
        try:
            self._store.renew(state)
        except RendezvousError:
            pass  # the next look tries again; the lease has two thirds of its time left

    def _peers_lost(self, round_: int) -> bool:
        """Peers found a participant of ``round_`` dead (``launcher.peers``): its failures use no restart."""
        return self._client.count_prefix(self._keys.lost_in(round_)) > 0

    def _freeze(self, snapshot: Snapshot, target: int, decision: Freeze) -> None:
        """Write the round's rank table, then commit the round by CAS of the state that names it."""
        state = snapshot.state
        lost = self._peers_lost(target - 1)
        frozen = frozen_state(
            self._settings.run_id,
            target,
            decision.participants,
            snapshot.nodes,
            self._settings.min_nodes,
            self._settings.max_nodes,
            restarts=restart_count(state, snapshot.nodes, target, lost),
            streak=streak_after(state, snapshot.nodes, target, lost),
            max_restarts=job_budget(state, self._max_restarts),
            table=new_table_id(target),
            keep=state.keep if state is not None else Keep(retention=self._settings.retention),
            cause=formed_cause(state, decision.participants),
        )
        frozen, granted = self._store.leased(frozen)  # the table goes on the job's lease, as the state
        probes = {n.info.node: (n.info.probe, n.lease) for n in snapshot.nodes if n.info.probe and n.lease}
        watch = watch_lists(frozen.participants, probes)
        write_table(
            self._client, self._keys, frozen.table, frozen.participants, frozen.buckets, frozen.keep.lease, watch
        )
        if not self._store.compare_and_swap(frozen, snapshot.token):
            if granted:
                self._store.release(frozen.keep.lease)  # this table goes with it
            return  # lost the race: the next commit deletes this table
        self._client.txn([], [*drop_other_tables(self._keys, frozen.table), op_delete(self._keys.lost, prefix=True)])
        if self._history is not None:
            record_freeze(self._history, state, frozen, formed_in=self._clock() - self._since)
