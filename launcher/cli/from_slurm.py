"""elastic-run's defaults under SLURM (``launcher.slurm`` reads the allocation): the options a user
did not give -- neither as a flag nor as ``PET_*`` -- are taken from the job. Said in one line."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from launcher.errors import UsageError
from launcher.output.console import say
from launcher.slurm import AllocationEtcd, SlurmJob, etcd_layout, member_count, node_addresses, node_names, slurm_job

__all__ = ["from_slurm", "SlurmPlan"]


@dataclass(frozen=True)
class SlurmPlan:
    job: SlurmJob
    etcd: AllocationEtcd | None  # None: --rdzv-endpoint was given


def from_slurm(opts: Any) -> tuple[Any, SlurmPlan | None]:
    """The options (``plan.RunOptions``) with SLURM's defaults in (a task of an ``srun`` step, not
    --standalone, from the CLI)."""
    job = slurm_job(os.environ)
    if job is None or opts.standalone or opts.given is None:
        return opts, None
    given = opts.given
    changes: dict[str, object] = {}
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
    return replace(opts, **changes), SlurmPlan(job, etcd)
