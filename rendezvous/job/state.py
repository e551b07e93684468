"""The job state and node records as they cross the wire: versioned JSON, validated on read.

``JobState`` is written only by the round's coordinator, by compare-and-swap, under
``<prefix>/<run_id>/state``; ``NodeInfo`` is each agent's own record under ``nodes/<node>``,
attached to its lease. Decoding checks the schema version and every field's type, and raises
RendezvousStateError naming what is wrong -- never pickle, never a KeyError.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from rendezvous.errors import RendezvousStateError
from rendezvous.etcd.endpoints import host_port
from rendezvous.job.progress import RoundProgress, Streak

__all__ = [
    "SCHEMA_VERSION",
    "CLOSED_BY_OPERATOR",
    "CLOSED_BY_CRASH_LOOP",
    "JobStatus",
    "JobOutcome",
    "Participant",
    "Cause",
    "Keep",
    "JobState",
    "NodeInfo",
    "parse_json",
]

SCHEMA_VERSION = 3  # 3: the participants in a bucketed rank table beside the state (rendezvous.job.ranktable)
CLOSED_BY_OPERATOR = "operator"  # JobState.closed_by of a job elastic-ctl closed
CLOSED_BY_CRASH_LOOP = "crash-loop"  # ... of a job the crash-loop breaker closed (failed, too)
CAUSE_NAMES = 16  # names kept per list of a Cause: the line that shows them names a few


class JobStatus(str, enum.Enum):
    """Where a job is. JOINING -> RUNNING -> JOINING (re-rendezvous) ... -> CLOSED (final)."""

    JOINING = "joining"  # the coordinator is forming round ``round``
    RUNNING = "running"  # round ``round`` is frozen: ranks are assigned
    CLOSED = "closed"  # the job finished or failed; the run id cannot be joined again


class JobOutcome(str, enum.Enum):
    """What became of a job, as ``elastic-ctl list`` and ``status`` name it (``JobState.outcome``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CLOSED_BY_OPERATOR = "closed by an operator"
    RUNNING = "running"
    JOINING = "joining"
    STOPPED = "stopped"  # open, and no agent of it is alive (every one stopped without closing it, or lost)


class FailureKind(str, enum.Enum):
    """What a node's failed round was: a worker that exited non-zero, or a hang the job agreed on."""

    WORKER = "worker_failure"
    HANG = "hang"


class Participant(NamedTuple):
    """One node of a frozen round."""

    node: str
    group_rank: int
    addr: str
    local_world_size: int


class Cause(NamedTuple):
    """Why the coordinator ended the running round, for every node's one line (names capped at CAUSE_NAMES)."""

    failures: tuple[str, ...] = ()  # "rank 1 on node b failed (exit code 1)"
    lost: tuple[str, ...] = ()  # participants whose node key is gone
    joining: tuple[str, ...] = ()  # newcomers asking to join
    waiting: int = 0  # nodes asking for the next round
    kind: FailureKind | None = None  # what the first of ``failures`` was (None: no failure)

    def encode(self) -> dict[str, Any]:
        data = {
            "failures": list(self.failures),
            "lost": list(self.lost),
            "joining": list(self.joining),
            "waiting": self.waiting,
        }
        return {**data, "kind": self.kind.value} if self.kind is not None else data

    @classmethod
    def of(cls, failures, lost, joining, waiting: int, kind: FailureKind | None = None) -> "Cause":
        return cls(*(tuple(names[:CAUSE_NAMES]) for names in (failures, lost, joining)), waiting, kind)


class Keep(NamedTuple):
    """How long the job's keys stay in etcd: its state, rank table and history live on one lease of
    ``retention`` seconds (0: kept forever, no lease), renewed while the job runs and once more when
    it closes, so they vanish by themselves a retention period after the job ended (or was abandoned)."""

    lease: int = 0  # the job's lease (0: none yet, or kept forever)
    retention: int = 0  # its TTL in seconds (0: the keys are kept forever)
    closed_at: float | None = None  # when the job closed (wall clock)

    @property
    def renew_every(self) -> float | None:
        """Seconds between renewals of the job's lease while the job lives (None: it has none): a
        third of the retention, so its keys outlive the job by a full retention period."""
        return self.retention / 3 if self.lease and self.retention else None

    def encode(self) -> dict[str, Any]:
        return {"lease": self.lease, "retention": self.retention, "closed_at": self.closed_at}


@dataclass(frozen=True)
class JobState:
    """The job's header, stored under ``state``. A frozen round's participants are in its rank table
    (``table``, ``size`` rows in ``buckets``); ``participants`` holds them when read with the table."""

    run_id: str
    round: int
    status: JobStatus
    min_nodes: int
    max_nodes: int
    master_addr: str = ""
    master_port: int = 0
    last_call_at: float | None = None  # wall-clock time the coordinator freezes the forming round
    reason: str = ""  # why the job was closed
    restarts: int = 0  # the job's restart count: group restarts caused by a worker failure, on any node
    max_restarts: int = 0  # the job's --max-restarts budget (the first agent's value)
    failed: bool = False  # closed because a worker failed with no restart left
    closed_by: str = ""  # "operator" when elastic-ctl closed it
    table: str = ""  # the rank table of the last frozen round ("" before the first)
    size: int = 0  # nodes in that round
    world: int = 0  # workers in that round
    buckets: int = 0  # the table's buckets
    finishing: bool = False  # a participant of the running round finished: the job is ending
    joined: int = 0  # nodes that asked for the forming round, as its coordinator last said (for progress lines)
    cause: Cause = Cause()  # why the round before ended (set when the coordinator starts the next)
    stopping: tuple[str, ...] = ()  # participants of the round before whose workers may still run (forming round)
    silent: tuple[tuple[str, float], ...] = ()  # of those, the ones whose lease is not renewed: (node, it runs out at)
    keep: Keep = Keep()  # the job's retention lease
    streak: Streak = Streak()  # restarts in a row with no progress, and the furthest the job got (crash loops)
    schema: int = SCHEMA_VERSION
    participants: tuple[Participant, ...] = field(default=(), compare=False)  # not stored here

    def outcome(self, live_nodes: int) -> JobOutcome:
        """What became of the job: succeeded, failed, closed by an operator; or, while open, running
        or joining -- and stopped when none of its ``live_nodes`` is alive."""
        if self.status is JobStatus.CLOSED:
            if self.failed:
                return JobOutcome.FAILED
            return JobOutcome.CLOSED_BY_OPERATOR if self.closed_by == CLOSED_BY_OPERATOR else JobOutcome.SUCCEEDED
        if not live_nodes:
            return JobOutcome.STOPPED
        return JobOutcome.RUNNING if self.status is JobStatus.RUNNING else JobOutcome.JOINING

    def participant(self, node: str) -> Participant | None:
        """``node``'s entry, when the participants were read with the state."""
        for candidate in self.participants:
            if candidate.node == node:
                return candidate
        return None

    def _fields(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "participants"}
        data["status"] = self.status.value
        data["cause"] = self.cause.encode()
        data["stopping"] = list(self.stopping)
        data["silent"] = [[node, when] for node, when in self.silent]
        if not self.silent:
            del data["silent"]  # the header stays as small as before for every other state
        data["keep"] = self.keep.encode()
        data["streak"] = self.streak.encode()
        if self.streak.empty:
            del data["streak"]  # written once a restart was counted
        return data

    def as_dict(self) -> dict[str, Any]:
        data = self._fields()
        data["participants"] = [p._asdict() for p in self.participants]
        return data

    def encode(self) -> bytes:
        """JSON of the header: small and the same size at any K, since every follower reads it."""
        return json.dumps(self._fields(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str = "job state") -> "JobState":
        data = _load(raw, where)
        try:
            status = JobStatus(_typed(data, "status", str, where))
        except ValueError as exc:
            raise RendezvousStateError(f"{where} is malformed: {exc}") from exc
        last_call = data.get("last_call_at")
        if last_call is not None and not isinstance(last_call, (int, float)):
            raise RendezvousStateError(f"{where} is malformed: last_call_at is not a number")
        counts = {name: _optional(data, name, int, 0, where) for name in ("size", "world", "buckets", "joined")}
        if any(v < 0 for v in counts.values()) or (counts["size"] > 0) != (counts["buckets"] > 0):
            raise RendezvousStateError(f"{where} is malformed: size, world and buckets {counts} do not agree")
        return cls(
            run_id=_typed(data, "run_id", str, where),
            round=_typed(data, "round", int, where),
            status=status,
            min_nodes=_typed(data, "min_nodes", int, where),
            max_nodes=_typed(data, "max_nodes", int, where),
            master_addr=_typed(data, "master_addr", str, where),
            master_port=_typed(data, "master_port", int, where),
            last_call_at=last_call,
            reason=_typed(data, "reason", str, where),
            restarts=_optional(data, "restarts", int, 0, where),
            max_restarts=_optional(data, "max_restarts", int, 0, where),
            failed=_optional(data, "failed", bool, False, where),
            closed_by=_optional(data, "closed_by", str, "", where),
            table=_optional(data, "table", str, "", where),
            finishing=_optional(data, "finishing", bool, False, where),
            cause=_cause(_optional(data, "cause", dict, {}, where), where),
            stopping=_names(data.get("stopping", []), "stopping", where),
            silent=_silent(data.get("silent", []), where),
            keep=_keep(_optional(data, "keep", dict, {}, where), where),
            streak=Streak.decode(data.get("streak", {}), where),
            **counts,
        )


def _keep(data: dict, where: str) -> Keep:
    lease, retention, closed = data.get("lease", 0), data.get("retention", 0), data.get("closed_at")
    if type(lease) is not int or type(retention) is not int or lease < 0 or retention < 0:
        raise RendezvousStateError(f"{where} is malformed: keep.lease and keep.retention must be ints >= 0")
    if closed is not None and (isinstance(closed, bool) or not isinstance(closed, (int, float))):
        raise RendezvousStateError(f"{where} is malformed: keep.closed_at is not a time")
    return Keep(lease, retention, closed)


def _silent(raw: Any, where: str) -> tuple[tuple[str, float], ...]:
    """``silent``: a list of [node, time] pairs."""
    if not isinstance(raw, list) or not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], (int, float)) for p in raw
    ):
        raise RendezvousStateError(f"{where} is malformed: silent is not a list of [node, time] pairs")
    return tuple((node, float(when)) for node, when in raw)


def _names(names: Any, name: str, where: str) -> tuple[str, ...]:
    """A list of node names or lines read from etcd (the first CAUSE_NAMES of it)."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RendezvousStateError(f"{where} is malformed: {name} is not a list of strings")
    return tuple(names[:CAUSE_NAMES])


def _cause(data: dict, where: str) -> Cause:
    lists = [_names(data.get(name, []), f"cause.{name}", where) for name in ("failures", "lost", "joining")]
    waiting = data.get("waiting", 0)
    if type(waiting) is not int:
        raise RendezvousStateError(f"{where} is malformed: cause.waiting is not int")
    return Cause.of(*lists, waiting, _kind(data.get("kind"), "cause.kind", where))


def _kind(value: Any, name: str, where: str) -> FailureKind | None:
    """A failure kind read from etcd (absent: None, as written before kinds were)."""
    if value is None or value == "":
        return None
    try:
        return FailureKind(value)
    except (ValueError, TypeError):
        raise RendezvousStateError(f"{where} is malformed: {name} is not one of worker_failure, hang") from None


@dataclass(frozen=True)
class NodeInfo:
    """What an agent says about itself under ``nodes/<node>`` while it holds its lease."""

    node: str
    round: int  # the round this node wants to join
    addr: str
    local_world_size: int
    master_port: int  # a free port on this node, used if it becomes group rank 0
    finished: bool = False  # its workers of ``round`` all succeeded; it waits for the others
    failed_round: int = 0  # its workers of this round failed: it asks for a restart (0: none)
    failure: str = ""  # what failed, for the other nodes' one line: "rank 3 on node n1 failed (exit code 1)"
    failure_kind: FailureKind | None = None  # what that was: a worker's failure or a hang
    probe: str = ""  # host:port where its agent answers its peers' probes ("": it answers none)
    progress: RoundProgress | None = None  # with a failure: how far its workers got (crash-loop breaker)
    quiet: bool = False  # its workers of ``round`` still alive have done nothing since the others exited 0
    schema: int = field(default=SCHEMA_VERSION)

    def encode(self) -> bytes:
        data = asdict(self)
        kind = data.pop("failure_kind")
        if kind is not None:  # written only with a failure: a node record is no larger than before kinds
            data["failure_kind"] = kind.value
        if not data["probe"]:
            del data["probe"]
        del data["progress"]
        if not data["quiet"]:
            del data["quiet"]  # written only at a job's end, by a node whose workers may be stuck at exit
        if self.progress is not None:
            data["progress"] = self.progress.encode()
        return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()

    def finished_round(self, round_: int) -> bool:
        """Its workers of round ``round_`` all succeeded."""
        return self.finished and self.round == round_

    def done_round(self, round_: int) -> bool:
        """Its workers of round ``round_`` all succeeded, or those still alive have done nothing since
        the others exited 0 (``launcher.hangs.exitstuck``: they may be stuck at exit)."""
        return (self.finished or self.quiet) and self.round == round_

    @classmethod
    def decode(cls, raw: bytes, where: str = "node record") -> "NodeInfo":
        data = _load(raw, where)
        return cls(
            node=_typed(data, "node", str, where),
            round=_typed(data, "round", int, where),
            addr=_typed(data, "addr", str, where),
            local_world_size=_typed(data, "local_world_size", int, where),
            master_port=_typed(data, "master_port", int, where),
            finished=_optional(data, "finished", bool, False, where),
            failed_round=_optional(data, "failed_round", int, 0, where),
            failure=_optional(data, "failure", str, "", where),
            failure_kind=_kind(data.get("failure_kind"), "failure_kind", where),
            probe=_endpoint(_optional(data, "probe", str, "", where), where),
            progress=RoundProgress.decode(data["progress"], where) if "progress" in data else None,
            quiet=_optional(data, "quiet", bool, False, where),
        )


def parse_json(raw: bytes, where: str) -> Any:
    """JSON read from etcd; RendezvousStateError naming ``where`` when it is not JSON."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RendezvousStateError(f"{where} is not valid JSON: {exc}") from exc


def _load(raw: bytes, where: str) -> dict[str, Any]:
    data = parse_json(raw, where)
    if not isinstance(data, dict):
        raise RendezvousStateError(f"{where} is not a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise RendezvousStateError(
            f"{where} has schema version {schema!r}; this etcd-elastic reads version {SCHEMA_VERSION} "
            f"(upgrade etcd-elastic on every node, or use a new run id)"
        )
    return data


def _typed(data: Any, name: str, kind: type, where: str) -> Any:
    if not isinstance(data, dict) or name not in data:
        raise RendezvousStateError(f"{where} is malformed: {name!r} is missing")
    value = data[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RendezvousStateError(f"{where} is malformed: {name!r} is not {kind.__name__}")
    return value


def _optional(data: dict[str, Any], name: str, kind: type, default: Any, where: str) -> Any:
    """A field added after schema 2 was first written: its default when absent, else checked as ``_typed``."""
    return _typed(data, name, kind, where) if name in data else default


def _endpoint(text: str, where: str) -> str:
    """A probe endpoint as a node record holds it: "" or host:port."""
    if text and host_port(text) is None:
        raise RendezvousStateError(f"{where} is malformed: probe {text!r} is not host:port")
    return text
