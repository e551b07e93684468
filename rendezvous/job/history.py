"""A job's history in etcd: one small JSON record per event, under ``<prefix>/<run_id>/history/``.

Keys are ``history/<ns since the epoch, 20 digits>-<node>``, so key order is time order and a
range read or a watch of the prefix gives the timeline. At most ``limit`` records are kept, exactly,
whatever the number of writers: after a write that finds more, the writer deletes every record
older than the ``limit``-th newest it read -- a later read can only find newer ones, so no two
writers ever delete more than the excess between them. Records live on the job's lease (read from
its state), so they expire with its other keys. A record says what changed, never a list of every
node: a record's size does not grow with the job.

Writing never blocks or fails a round: records go through a queue to one writer thread, each
write has a short budget, and a failed write is reported once (``report``) and dropped.

Kinds and their details::

    round_frozen   world_size, nodes (a count), joined, left (up to NAMES names each, and
                   joined_count, left_count), formed_in (s), up (s since the freezing agent's process started)
    node_left      reason                                worker_failed rank, host, exit_code | signal, message
    group_restarted restart_count, max_restarts          job_closed    reason, failed, by
    round_requested reason (an operator's new round)
    node_lost      reason, by (the watcher that ended the lease of a node its peers found dead)
    node_unhealthy reason (its health gate failed: it takes no rank)    node_healthy (it passes again)
    straggler      rank, local_rank, score, pace, fastest (s) (a rank named a straggler)
    straggler_recovered  the same (it is no longer one)
    preflight      seconds, nodes, slowest_pair_ms, findings, excluded (group rank 0's, after the check)
    round_ended    outcome, group_rank, ran, stop, steps, step, first_step, last_step, saved (group ranks 0
                   and 1, once their workers of the round are gone: the goodput account's, launcher.goodput)
"""

from __future__ import annotations

import enum
import json
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from etcd3 import etcdrpc

from rendezvous.errors import LeaseNotFoundError, RendezvousError, RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.txn import op_delete, prefix_range_end

from .keys import history_prefix, unwrap_state
from .state import JobState

__all__ = [
    "Kind",
    "Event",
    "HistoryWriter",
    "read_history",
    "unhealthy_nodes",
    "gray_failures",
    "decode_events",
    "last_run",
    "RERUN",
    "record_freeze",
    "freeze_details",
    "job_lease",
    "history_prefix",
    "DEFAULT_LIMIT",
    "NAMES",
]

DEFAULT_LIMIT = 1000
NAMES = 8  # node names a record lists of those that joined or left (the counts say how many in all)
SCHEMA = 1
_WRITE_BUDGET = 2.0


class Kind(str, enum.Enum):
    """What a history record says happened: its ``kind``, written by the agents, the reaper and
    ``elastic-ctl``, and read by the goodput account, its page, ``status`` and ``history``. A
    member is its own value wherever a string is (compared, hashed, JSON); records are decoded with
    the kind as written, so a kind this version does not know is kept, not refused."""

    ROUND_FROZEN = "round_frozen"  # a round formed: its nodes, who joined and left, how long it took
    ROUND_ENDED = "round_ended"  # what a node measured of one round of its workers (the goodput account)
    ROUND_REQUESTED = "round_requested"  # a new round asked for (a node's or an operator's reason)
    GROUP_RESTARTED = "group_restarted"  # a round formed after a failure: the workers restart (count, budget)
    WORKER_FAILED = "worker_failed"  # a worker exited non-zero
    WORKER_HUNG = "worker_hung"  # the job agreed a rank hung
    WORKER_STUCK_AT_EXIT = "worker_stuck_at_exit"  # a worker alive and doing nothing after the others exited 0, ended
    NODE_LEFT = "node_left"  # a node left the job (its agent said why, or its reaper)
    NODE_LOST = "node_lost"  # a node's peers found it dead
    NODE_UNHEALTHY = "node_unhealthy"  # a node failed its health checks and took no rank
    NODE_HEALTHY = "node_healthy"  # its checks pass again
    PREFLIGHT = "preflight"  # the pre-flight check of a round
    STRAGGLER = "straggler"  # a rank named slow
    STRAGGLER_RECOVERED = "straggler_recovered"  # a straggler at its healthy pace again
    JOB_CLOSED = "job_closed"  # the job closed (finished, failed, or by an operator)
    JOB_RERUN = "job_rerun"  # a new launch of a closed job's id began a new run of it

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class Event:
    time: float  # seconds since the epoch
    round: int
    node: str
    kind: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The record as ``elastic-ctl history --json`` prints it: details as fields of their own."""
        return {**self.details, "time": self.time, "round": self.round, "node": self.node, "kind": self.kind}

    def key(self, job_prefix: str) -> str:
        """Where the record is kept: time order is key order."""
        return f"{history_prefix(job_prefix)}{int(self.time * 1e9):020d}-{self.node}"

    def encode(self) -> bytes:
        return json.dumps({"schema": SCHEMA, **self.as_dict()}, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str = "history record") -> "Event":
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RendezvousStateError(f"{where} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise RendezvousStateError(f"{where} is not a history record of schema {SCHEMA}")
        try:
            when, round_, node, kind = data.pop("time"), data.pop("round"), data.pop("node"), data.pop("kind")
        except KeyError as exc:
            raise RendezvousStateError(f"{where} is malformed: {exc.args[0]!r} is missing") from None
        data.pop("schema")
        if not (
            isinstance(when, (int, float)) and type(round_) is int and isinstance(node, str) and isinstance(kind, str)
        ):
            raise RendezvousStateError(f"{where} is malformed: time, round, node or kind has the wrong type")
        return cls(float(when), round_, node, kind, data)


def read_history(client: EtcdClient, job_prefix: str) -> tuple[list[Event], int]:
    """Every record of the job, oldest first (records that do not decode are skipped), and the revision read at."""
    kvs, revision = client.get_prefix(history_prefix(job_prefix))
    return decode_events(kvs), revision


RERUN = Kind.JOB_RERUN  # a new launch of a closed job's id began a new run of it (``JobStateStore.rerun``)


def last_run(events: Iterable[Event]) -> list[Event]:
    """The records of the job's newest run: those after its last ``job_rerun`` record (all of them
    for a job run once). The records of earlier runs stay, for ``history``, until they expire."""
    events = list(events)
    starts = [i for i, e in enumerate(events) if e.kind == RERUN]
    return events[starts[-1] + 1 :] if starts else events


def decode_events(kvs: Iterable[Any]) -> list[Event]:
    """The records among ``kvs`` (of the history prefix), in their order; what does not decode is skipped."""
    events = []
    for kv in kvs:
        try:
            events.append(Event.decode(kv.value, f"history record {kv.key!r}"))
        except RendezvousStateError:
            continue
    return events


class HistoryWriter:
    """Writes a node's history records in the background; never raises, never blocks the caller."""

    def __init__(
        self,
        client: EtcdClient,
        job_prefix: str,
        node: str,
        *,
        limit: int = DEFAULT_LIMIT,
        report: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        echo: Callable[[Event], None] | None = None,
        started: float | None = None,
    ) -> None:
        """``started``: when this node's agent started (epoch seconds; the CLI's process start),
        said in each ``round_frozen`` it writes (``up``): the goodput account's start of the job."""
        self.started = started
        self._client = client
        self._job_prefix = job_prefix
        self._prefix = history_prefix(job_prefix)
        self.node = node
        self.limit = limit
        self._report = report
        self._clock = clock
        self._echo = echo  # also hands each record to this, as it is queued (--event-log-handler console)
        self.on_failure: Callable[[], None] | None = None  # each record that could not be written (metrics)
        self._queue: queue.Queue[Event | None] = queue.Queue()
        self._failed_once = False
        self._lease: int | None = None  # the job's lease, as its state names it (None: not read yet)
        self._thread = threading.Thread(target=self._run, name="history", daemon=True)
        self._thread.start()

    def read(self) -> list[Event]:
        """Every record of the job now, oldest first (a RendezvousError when etcd cannot be read)."""
        return read_history(self._client, self._job_prefix)[0]

    def uptime(self) -> float | None:
        """Seconds since this node's agent started (None: not known, see ``started``)."""
        return max(self._clock() - self.started, 0.0) if self.started is not None else None

    def record(self, kind: Kind, round_: int, *, node: str | None = None, store: bool = True, **details: Any) -> None:
        """Queue a record about ``node`` (default: this writer's node); details that are None are left out.
        ``store`` False: only echoed (the console event log), not written to etcd."""
        cleaned = {k: v for k, v in details.items() if v is not None}
        event = Event(self._clock(), round_, node or self.node, kind, cleaned)
        if store:
            self._queue.put(event)
        if self._echo is not None:
            try:
                self._echo(event)
            except Exception:  # noqa: BLE001 -- as the write itself: never worth an agent
                pass

    def close(self, timeout: float = 3.0) -> None:
        """Write what is queued (within ``timeout``) and stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self._write(event)
            except RendezvousError as exc:
                if self.on_failure is not None:
                    self.on_failure()
                if not self._failed_once and self._report is not None:
                    self._failed_once = True
                    self._report(f"could not write the job's history in etcd ({exc}); history records are dropped")
            except Exception:  # noqa: BLE001 -- a history record is never worth an agent
                pass

    def _write(self, event: Event) -> None:
        lease = self._job_lease()
        if lease is None:
            return  # the job is gone
        try:
            self._client.put(event.key(self._job_prefix), event.encode(), lease=lease)
        except LeaseNotFoundError:  # the job's lease changed (or ended): read it again
            self._lease = None
            if (lease := self._job_lease()) is not None:
                self._client.put(event.key(self._job_prefix), event.encode(), lease=lease)
        if self._client.count_prefix(self._prefix) > self.limit:  # a count, no values: a small read
            self._trim()

    def _trim(self) -> None:
        """Delete every record older than the ``limit``-th newest (one range read of keys, one delete)."""
        request = etcdrpc.RangeRequest(
            key=self._prefix.encode(),
            range_end=prefix_range_end(self._prefix),
            keys_only=True,
            limit=self.limit + 1,
            sort_order=etcdrpc.RangeRequest.DESCEND,
            sort_target=etcdrpc.RangeRequest.KEY,
        )
        newest = self._client.range(request).kvs
        if len(newest) > self.limit:
            self._client.txn([], [_delete_through(self._prefix, newest[-1].key)], timeout=_WRITE_BUDGET)

    def _job_lease(self) -> int | None:
        if self._lease is None:
            self._lease = job_lease(self._client, self._job_prefix)
        return self._lease


def job_lease(client: EtcdClient, job_prefix: str) -> int | None:
    """The lease the keys of the job under ``job_prefix`` live on, as its state names it (0: none,
    kept until deleted); None when the job has no state (reset, or expired): a record written then
    would outlive everything else of the job, so it is not written. Every writer of the job's history
    puts its records on this lease."""
    kv = client.get(job_prefix.rstrip("/") + "/state")
    if kv is None:
        return None
    try:
        return JobState.decode(unwrap_state("state", kv.value)).keep.lease
    except RendezvousStateError:
        return 0


def _delete_through(prefix: str, last: bytes) -> Any:
    """Delete every key of ``prefix`` up to and including ``last``."""
    op = op_delete(prefix)
    op.request_delete_range.range_end = last + b"\0"
    return op


def freeze_details(
    before: JobState | None, frozen: JobState, *, formed_in: float, up: float | None = None
) -> dict[str, Any]:
    """A ``round_frozen`` record's details: what changed since the round before, in a size that does
    not grow with the job (the counts, and the first ``NAMES`` names of those that joined or left);
    ``up``: how long the freezing agent's process had run (the account's start of the job: its own start too)."""
    previous = {p.node for p in before.participants} if before is not None else set()
    now = {p.node for p in frozen.participants}
    joined, left = sorted(now - previous), sorted(previous - now)
    return {
        "world_size": frozen.world,
        "nodes": len(now),
        "joined": joined[:NAMES],
        "joined_count": len(joined),
        "left": left[:NAMES],
        "left_count": len(left),
        "formed_in": round(formed_in, 3),
        **({"up": round(up, 3)} if up is not None else {}),
    }


def unhealthy_nodes(events: Iterable[Event]) -> tuple[tuple[str, str], ...]:
    """(node, why) for each node whose last health record says unhealthy (``launcher.nodecheck``)."""
    last: dict[str, Event] = {}
    for event in events:
        if event.kind in (Kind.NODE_UNHEALTHY, Kind.NODE_HEALTHY):
            last[event.node] = event
    return tuple(
        (node, str(e.details.get("reason", ""))) for node, e in sorted(last.items()) if e.kind == Kind.NODE_UNHEALTHY
    )


def gray_failures(events: Iterable[Event]) -> tuple[str, ...]:
    """Lines for ``elastic-ctl status``: the ranks named stragglers and not recovered since (their
    last record), and the last pre-flight check's findings."""
    stragglers: dict[tuple[str, object], Event] = {}
    preflight: Event | None = None
    for event in events:
        if event.kind in (Kind.STRAGGLER, Kind.STRAGGLER_RECOVERED):
            stragglers[(event.node, event.details.get("rank"))] = event
        elif event.kind == Kind.PREFLIGHT:
            preflight = event
    lines = [
        f"straggler: rank {e.details.get('rank')} on {node} (score {e.details.get('score')})"
        for (node, _), e in sorted(stragglers.items(), key=lambda item: str(item[0]))
        if e.kind == Kind.STRAGGLER
    ]
    if preflight is not None:
        found = preflight.details.get("findings") or ["nothing found"]
        lines.append(f"pre-flight check of round {preflight.round}: {'; '.join(str(f) for f in found)}")
    return tuple(lines)


def record_freeze(history: HistoryWriter, before: JobState | None, frozen: JobState, *, formed_in: float) -> None:
    """The coordinator's records of a round it froze: a group restart, and the round (who joined and left)."""
    up = history.uptime()
    if before is not None and frozen.restarts > before.restarts:
        history.record(
            Kind.GROUP_RESTARTED, frozen.round, restart_count=frozen.restarts, max_restarts=frozen.max_restarts
        )
    history.record(Kind.ROUND_FROZEN, frozen.round, **freeze_details(before, frozen, formed_in=formed_in, up=up))
