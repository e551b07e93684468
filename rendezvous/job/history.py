"""A job's history in etcd: one small JSON record per event, under ``<prefix>/<run_id>/history/``.

Keys are ``history/<ns since the epoch, 20 digits>-<node>``, so key order is time order and a
range read or a watch of the prefix gives the timeline. At most ``limit`` records are kept: the
writer deletes the oldest in the same transaction as it writes a new one, once the count it last
saw is over the limit.

Writing never blocks or fails a round: records go through a queue to one writer thread, each
write has a short budget, and a failed write is reported once (``report``) and dropped.

Kinds and their details::

    round_frozen   world_size, nodes, formed_in (s)      node_joined   -
    node_left      reason                                worker_failed rank, host, exit_code | signal, message
    group_restarted restart_count, max_restarts          job_closed    reason, failed, by
    round_requested reason (an operator's new round)
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rendezvous.errors import RendezvousError, RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.txn import op_delete, op_put

from .keys import history_prefix
from .state import JobState

__all__ = ["Event", "HistoryWriter", "read_history", "record_freeze", "history_prefix", "DEFAULT_LIMIT"]

DEFAULT_LIMIT = 1000
SCHEMA = 1
_WRITE_BUDGET = 2.0


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
    events = []
    for kv in kvs:
        try:
            events.append(Event.decode(kv.value, f"history record {kv.key!r}"))
        except RendezvousStateError:
            continue
    return events, revision


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
    ) -> None:
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
        self._count: int | None = None
        self._thread = threading.Thread(target=self._run, name="history", daemon=True)
        self._thread.start()

    def record(self, kind: str, round_: int, *, node: str | None = None, **details: Any) -> None:
        """Queue a record about ``node`` (default: this writer's node); details that are None are left out."""
        cleaned = {k: v for k, v in details.items() if v is not None}
        event = Event(self._clock(), round_, node or self.node, kind, cleaned)
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
        ops = [op_put(event.key(self._job_prefix), event.encode())]
        if self._count is None or self._count >= self.limit:
            self._count = self._client.count_prefix(self._prefix)
            if self._count >= self.limit:
                oldest, _ = self._client.get_prefix(self._prefix, keys_only=True, limit=self._count - self.limit + 1)
                if oldest:
                    ops.append(_delete_through(self._prefix, oldest[-1].key))
                    self._count -= len(oldest)
        self._client.txn([], ops, timeout=_WRITE_BUDGET)
        self._count += 1


def _delete_through(prefix: str, last: bytes) -> Any:
    """Delete every key of ``prefix`` up to and including ``last``."""
    op = op_delete(prefix)
    op.request_delete_range.range_end = last + b"\0"
    return op


def record_freeze(history: HistoryWriter, before: JobState | None, frozen: JobState, *, formed_in: float) -> None:
    """The coordinator's records of a round it froze: who joined, who left, a group restart, the round."""
    previous = {p.node for p in before.participants} if before is not None else set()
    now = {p.node for p in frozen.participants}
    for node in sorted(now - previous):
        history.record("node_joined", frozen.round, node=node)
    for node in sorted(previous - now):
        history.record("node_left", frozen.round, node=node, reason="not in the new round (its lease ended)")
    if before is not None and frozen.restarts > before.restarts:
        history.record("group_restarted", frozen.round, restart_count=frozen.restarts, max_restarts=frozen.max_restarts)
    history.record(
        "round_frozen",
        frozen.round,
        world_size=frozen.world,
        nodes=[p.node for p in frozen.participants],
        formed_in=round(formed_in, 3),
    )
