"""A job's keys in etcd: the one key layout, and the framing of the stored state.

    <prefix>/<run_id>/state          the job's state (JSON behind STATE_HEADER), written only by CAS
    <prefix>/<run_id>/nodes/<node>   one node's record, on its agent's lease
    <prefix>/<run_id>/coordinator    the node that decides the rounds, on its agent's lease
    <prefix>/<run_id>/ranks/<table>/<bucket>  a frozen round's rank table (``rendezvous.job.ranktable``)
    <prefix>/<run_id>/store/<key>    the c10d-style store's keys
    <prefix>/<run_id>/queues/<name>  the store's FIFO queues (apart: queues are not keys)
    <prefix>/<run_id>/history/<seq>  the job's history records
    <prefix>/<run_id>/hangs/<round>/ a suspected hang's suspect, reports and verdict (agents' leases),
                                     and elastic-ctl status's asks for heartbeats (the asker's lease)
    <prefix>/<run_id>/pace/<node>    one node's own-work pace in the round it runs (straggler scores),
                                     on its agent's lease, written only when it moves by 10 %

The stored state is the state behind a one-line header (``elastic-state/1``) so that a value that is
not ours -- garbage written by hand, another tool's key -- is refused with RendezvousStateError
instead of being decoded. Nothing read from etcd is ever unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass

from rendezvous.errors import RendezvousSettingsError, RendezvousStateError

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "STATE_HEADER",
    "JobKeys",
    "job_key",
    "jobs_root",
    "validate_run_id",
    "frame_state",
    "unwrap_state",
    "history_prefix",
]

DEFAULT_KEY_PREFIX = "/elastic"
STATE_HEADER = b"elastic-state/1\n"


def validate_run_id(run_id: str) -> str:
    """A run id is a non-empty key segment, and a path segment (its log and checkpoint directories):
    no '/', no '\\', not '.' or '..', no whitespace, no control characters (NUL included)."""
    if not isinstance(run_id, str) or not run_id:
        raise RendezvousSettingsError("the run id must be a non-empty string")
    if run_id in (".", ".."):
        raise RendezvousSettingsError(f"run id {run_id!r} would name a directory outside the job's own")
    if any(ch in "/\\" or ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in run_id):
        raise RendezvousSettingsError(f"run id {run_id!r} may not contain '/', '\\', spaces or control characters")
    if len(run_id) > 200:
        raise RendezvousSettingsError(f"run id is {len(run_id)} characters long; at most 200 are allowed")
    return run_id


def jobs_root(key_prefix: str) -> str:
    """``<prefix>/``, the prefix normalised (one leading '/', none trailing): every job's keys are under it."""
    if not isinstance(key_prefix, str):
        raise RendezvousSettingsError("the key prefix must be a string")
    return ("/" + key_prefix.strip("/") if key_prefix.strip("/") else "") + "/"


def job_key(key_prefix: str, run_id: str, *parts: str) -> str:
    """``<prefix>/<run_id>/<parts...>`` with the prefix normalised (``jobs_root``)."""
    return jobs_root(key_prefix) + "/".join([validate_run_id(run_id), *parts])


def frame_state(state: bytes) -> bytes:
    """The value stored for ``state``."""
    return STATE_HEADER + bytes(state)


def unwrap_state(key: str, value: bytes) -> bytes:
    """The state inside a stored value; RendezvousStateError when the value is not ours."""
    if not value.startswith(STATE_HEADER):
        raise RendezvousStateError(
            f"the value under {key} is not etcd-elastic state (it starts with {value[:40]!r}); "
            f"delete the key or use another run id"
        )
    return value[len(STATE_HEADER) :]


@dataclass(frozen=True)
class JobKeys:
    """Every key of one job."""

    prefix: str
    run_id: str

    def ctl(self, verb: str, endpoints: str, *, job: bool = True) -> str:
        """The ``elastic-ctl`` command that acts on this job (``job``; else on every job under the
        prefix, as ``list``), as it can be pasted: with the etcd endpoints, the job id and (when not
        the default) the key prefix."""
        conf = f" --rdzv-conf key_prefix={self.prefix}" if self.prefix != DEFAULT_KEY_PREFIX else ""
        run_id = f" --rdzv-id {self.run_id}" if job else ""
        return f"elastic-ctl {verb} --rdzv-endpoint {endpoints}{run_id}{conf}"

    @property
    def root(self) -> str:
        """``<prefix>/<run_id>/``: every key of the job is under it."""
        return job_key(self.prefix, self.run_id, "")

    @property
    def state(self) -> str:
        return job_key(self.prefix, self.run_id, "state")

    @property
    def state_bytes(self) -> bytes:
        return self.state.encode()

    @property
    def nodes(self) -> str:
        return job_key(self.prefix, self.run_id, "nodes") + "/"

    def node(self, node_id: str) -> str:
        return self.nodes + node_id

    @property
    def coordinator(self) -> str:
        return job_key(self.prefix, self.run_id, "coordinator")

    @property
    def rank_tables(self) -> str:
        return job_key(self.prefix, self.run_id, "ranks") + "/"

    def rank_table(self, table: str) -> str:
        return self.rank_tables + table + "/"

    def rank_bucket(self, table: str, bucket: int) -> str:
        return self.rank_table(table) + str(bucket)

    @property
    def store(self) -> str:
        return job_key(self.prefix, self.run_id, "store") + "/"

    @property
    def queues(self) -> str:
        return job_key(self.prefix, self.run_id, "queues") + "/"

    @property
    def history(self) -> str:
        return history_prefix(self.root)

    def suspects(self, round_: int, target: str) -> str:
        """``<prefix>/<run_id>/suspects/<round>/<target>/``: the watchers that find ``target`` dead,
        one key each on its own lease (``launcher.peers``)."""
        return job_key(self.prefix, self.run_id, "suspects", str(round_), target) + "/"

    @property
    def lost(self) -> str:
        """``<prefix>/<run_id>/lost/``: ``<round>/<node>`` for each node its watchers found dead in a
        round (``launcher.peers``); read and cleared by the next freeze (no restart for that round)."""
        return job_key(self.prefix, self.run_id, "lost") + "/"

    def lost_in(self, round_: int, node: str = "") -> str:
        """``lost/<round>/``, the records of one round; with ``node``, that node's record."""
        return f"{self.lost}{round_}/{node}"

    def hangs(self, round_: int) -> str:
        """``<prefix>/<run_id>/hangs/<round>/``: one round's hang cases."""
        return job_key(self.prefix, self.run_id, "hangs", str(round_)) + "/"

    def pace(self, node: str = "") -> str:
        """``<prefix>/<run_id>/pace/``: the nodes' own-work paces; with ``node``, that node's."""
        return job_key(self.prefix, self.run_id, "pace") + "/" + node

    @property
    def working(self) -> tuple[str, ...]:
        """The prefixes of what a run works with, all but its state and its history: what a new run
        of a closed job's id deletes (``JobStateStore.rerun``)."""
        parts = ("coordinator", "nodes/", "ranks/", "store/", "queues/", "suspects/", "lost/", "hangs/", "pace/")
        return tuple(self.root + part for part in parts)


def history_prefix(job_root: str) -> str:
    """``<prefix>/<run_id>/history/`` from the job's root ``<prefix>/<run_id>/``."""
    return job_root.rstrip("/") + "/history/"
