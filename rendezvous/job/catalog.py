"""The jobs under a key prefix, as an operator lists them (``elastic-ctl list``): each job's state,
its live nodes, how much it keeps in etcd, and when its keys expire. Reads only (plain ranges, so it
works while etcd is out of space)."""

from __future__ import annotations

from dataclasses import dataclass

from rendezvous.errors import RendezvousError, RendezvousStateError
from rendezvous.etcd.client import EtcdClient

from .history import decode_events
from .keys import JobKeys, history_prefix, jobs_root
from .state import JobOutcome, JobState
from .stopped import Stopped, stopped_from
from .store import decode_state

__all__ = ["JobEntry", "list_jobs"]


@dataclass(frozen=True)
class JobEntry:
    run_id: str
    state: JobState | None  # None: keys without a state (being reset), or a state that is not ours
    nodes: int  # live node keys
    keys: int  # keys under the job's prefix
    bytes: int  # their keys' and values' bytes
    expires_in: int | None  # seconds until the job's lease ends its keys (None: kept until deleted)
    stopped: Stopped | None = None  # no live agent and nobody closed it: since when, from its history


def list_jobs(client: EtcdClient, prefix: str) -> list[JobEntry]:
    """Every job under ``prefix`` (the first path segment after it), in run id order."""
    root = jobs_root(prefix)
    kvs, revision = client.get_prefix(root, keys_only=True)
    run_ids = sorted({kv.key.decode(errors="replace")[len(root) :].split("/", 1)[0] for kv in kvs})
    return [_entry(client, JobKeys(prefix, run_id), revision) for run_id in run_ids if run_id]


def _entry(client: EtcdClient, keys: JobKeys, revision: int) -> JobEntry:
    kvs, _ = client.get_prefix(keys.root, revision=revision)
    state = None
    found = next((kv for kv in kvs if kv.key == keys.state_bytes), None)
    if found is not None:
        try:
            state = decode_state(keys, found.value)
        except RendezvousStateError:
            state = None
    nodes = sum(1 for kv in kvs if kv.key.decode(errors="replace").startswith(keys.nodes))
    size = sum(len(kv.key) + len(kv.value) for kv in kvs)
    stopped = None
    if state is not None and state.outcome(nodes) is JobOutcome.STOPPED:
        stopped = stopped_from(
            state, decode_events(kv for kv in kvs if kv.key.startswith(history_prefix(keys.root).encode()))
        )
    return JobEntry(keys.run_id, state, nodes, len(kvs), size, _expires_in(client, state), stopped)


def _expires_in(client: EtcdClient, state: JobState | None) -> int | None:
    if state is None or not state.keep.lease:
        return None
    try:
        ttl = client.lease_ttl(state.keep.lease)
    except RendezvousError:
        return None
    return max(ttl, 0)
