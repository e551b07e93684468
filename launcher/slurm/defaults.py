"""elastic-run's defaults under SLURM (``launcher.slurm.job`` reads the allocation): the options a user
did not give -- neither as a flag nor as ``PET_*`` -- are taken from the job. Said in one line."""

from __future__ import annotations

import os
from dataclasses import dataclass

from launcher.errors import UsageError
from launcher.output.console import say

from .job import AllocationEtcd, SlurmJob, etcd_layout, member_count, node_addresses, node_names, slurm_job

__all__ = ["slurm_defaults", "SlurmPlan"]


@dataclass(frozen=True)
class SlurmPlan:
    job: SlurmJob
    etcd: AllocationEtcd | None  # None: --rdzv-endpoint was given


def slurm_defaults(given: frozenset[str] | None, standalone: bool) -> tuple[dict[str, str], SlurmPlan | None]:
    """The options SLURM's job gives (option name -> its text) where the user gave none of ``given``,
    and the job's plan: nothing outside a task of an ``srun`` step, for --standalone, or for the
    Python API (``given`` None)."""
    job = slurm_job(os.environ)
    if job is None or standalone or given is None:
        return {}, None
    changes: dict[str, str] = {}
    if "nnodes" not in given:
        changes["nnodes"] = f"1:{job.nodes}"
    if "rdzv_id" not in given:
        changes["rdzv_id"] = job.rdzv_id
    etcd = None
    try:
        members = node_names(job)[: member_count(job.nodes)] if "rdzv_endpoint" not in given else []
        mine = [job.node_name] if "local_addr" not in given and job.node_name not in members else []
        addresses = dict(node_addresses(members + mine)) if members or mine else {}  # one call to slurmctld
    except RuntimeError as exc:
        raise UsageError(f"SLURM job {job.job_id}: {exc}; give --rdzv-endpoint and --local-addr") from None
    if members:
        etcd = etcd_layout(job, [(name, addresses[name]) for name in members])
        changes["rdzv_endpoint"] = etcd.endpoints
    if "local_addr" not in given:
        changes["local_addr"] = addresses[job.node_name]
    said = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in changes.items())
    say(f"SLURM job {job.job_id}, node {job.node_name} ({job.node_index + 1} of {job.nodes}): {said}")
    return changes, SlurmPlan(job, etcd)
