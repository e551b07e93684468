"""An operator's writes to a job, by compare-and-swap like every other write: close it, ask for a
new round, delete its keys. ``closed_by_operator`` and ``new_round`` are the pure transitions."""

from __future__ import annotations

import time
from dataclasses import replace

from rendezvous.errors import RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.job.catalog import list_jobs
from rendezvous.job.history import HistoryWriter, Kind
from rendezvous.job.keys import JobKeys
from rendezvous.job.state import CLOSED_BY_OPERATOR, JobState, JobStatus
from rendezvous.job.store import GaveUp, JobStateStore, StateUnchanged

from .decide import closed_state

__all__ = [
    "closed_by_operator",
    "new_round",
    "close_job",
    "request_round",
    "reset_job",
    "prune_jobs",
    "JobNotFound",
    "JobRefused",
]

_TRIES = 20  # CAS attempts before giving up on a job that keeps changing


class JobNotFound(RendezvousError):
    """The job has no state in etcd."""


class JobRefused(RendezvousError):
    """The job is not in a state that allows the operation (a reset while nodes live, a new round of a closed job)."""


def closed_by_operator(state: JobState, reason: str, when: float | None = None) -> JobState:
    """The job closed by an operator: every agent stops its workers and exits (exit code 4)."""
    return closed_state(state, reason, when=when, closed_by=CLOSED_BY_OPERATOR)


def new_round(state: JobState, reason: str) -> JobState:
    """A new round forming now, as if a node had asked for it: nobody's restart is used."""
    return replace(state, status=JobStatus.JOINING, round=state.round + 1, reason=reason, last_call_at=None)


def _change(client: EtcdClient, keys: JobKeys, change) -> tuple[JobState, JobState]:
    """Apply ``change(state) -> JobState | None`` by CAS; (before, after). None: nothing to write."""

    def existing(state: JobState | None) -> JobState:
        if state is None:
            raise JobNotFound(f"no job '{keys.run_id}' (under {keys.prefix})")
        after = change(state)
        if after is None:
            raise StateUnchanged
        return after

    try:
        return JobStateStore(client, keys).update(existing, tries=_TRIES, what="change")
    except GaveUp:
        raise RendezvousError(f"job '{keys.run_id}' kept changing: gave up after {_TRIES} tries") from None


def close_job(
    client: EtcdClient, keys: JobKeys, reason: str, history: HistoryWriter | None = None
) -> tuple[JobState, JobState]:
    before, after = _change(
        client, keys, lambda s: None if s.status is JobStatus.CLOSED else closed_by_operator(s, reason, time.time())
    )
    if after is not before:
        try:
            JobStateStore(client, keys).renew(after)  # its keys are kept for its retention from now
        except RendezvousError:
            pass
    if history is not None and after is not before:
        history.record(Kind.JOB_CLOSED, after.round, reason=reason, failed=False, by=CLOSED_BY_OPERATOR)
    return before, after


def request_round(
    client: EtcdClient, keys: JobKeys, reason: str, history: HistoryWriter | None = None
) -> tuple[JobState, JobState]:
    def change(state: JobState) -> JobState | None:
        if state.status is JobStatus.CLOSED:
            raise JobRefused(f"job '{keys.run_id}' is closed ({state.reason}): no new round")
        return None if state.status is JobStatus.JOINING else new_round(state, reason)

    before, after = _change(client, keys, change)
    if history is not None and after is not before:
        history.record(Kind.ROUND_REQUESTED, after.round, reason=reason, by=CLOSED_BY_OPERATOR)
    return before, after


def reset_job(client: EtcdClient, keys: JobKeys, *, force: bool = False) -> int:
    """Delete every key of the job; refused while nodes are alive unless ``force``. Returns how many went."""
    if client.get(keys.state) is None and client.count_prefix(keys.root) == 0:
        raise JobNotFound(f"no job '{keys.run_id}' (under {keys.prefix})")
    alive = client.count_prefix(keys.nodes)
    if alive and not force:
        raise JobRefused(
            f"job '{keys.run_id}' has {alive} live node{'s' if alive > 1 else ''}: "
            f"stop {'them' if alive > 1 else 'it'} "
            "first, or reset with --force"
        )
    state = _read(client, keys)
    deleted = client.delete(keys.root, prefix=True)
    if state is not None and state.keep.lease:
        client.revoke_lease(state.keep.lease)  # nothing is left on it: the keys went just now
    return deleted


def prune_jobs(client: EtcdClient, prefix: str, older_than: float, now: float) -> list[str]:
    """Delete every job closed more than ``older_than`` seconds before ``now`` (as ``reset_job``
    would, refusing none: a closed job's agents are gone); the run ids deleted."""
    pruned = []
    for job in list_jobs(client, prefix):
        closed = job.state.keep.closed_at if job.state is not None else None
        if job.state is None or job.state.status is not JobStatus.CLOSED or closed is None:
            continue
        if now - closed >= older_than:
            reset_job(client, JobKeys(prefix, job.run_id), force=True)
            pruned.append(job.run_id)
    return pruned


def _read(client: EtcdClient, keys: JobKeys) -> JobState | None:
    try:
        return JobStateStore(client, keys).read()[0]
    except RendezvousError:
        return None  # a state that is not ours: its keys go all the same
