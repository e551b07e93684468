"""The agent's summaries: a failed group, a hang that ended the job, why a round changed. Pure formatting."""

from __future__ import annotations

import time

from launcher.workers.group import GroupStatus
from rendezvous.job.state import JobState, JobStatus
from rendezvous.rounds.monitor import JobMonitor

__all__ = ["failure_summary", "hang_summary", "change_line"]


def failure_summary(status: GroupStatus, run_id: str, restarts: int, max_restarts: int) -> str:
    first = status.first_failure
    if first is None:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(first.at))
    lines = [
        f"worker group of job '{run_id}' failed after {restarts} of {max_restarts} restarts",
        f"  first failure: rank {first.rank} (local rank {first.local_rank}) on {first.host}",
        f"  {first.describe()} at {when}",
    ]
    others = sorted(f.rank for f in status.failures if f is not first)
    if others:
        lines.append(f"  also failed: rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}")
    if first.error is not None:
        lines.append(f"  error: {first.error.message}")
        trace = first.error.traceback.rstrip()
        if trace:
            lines.append("  traceback (from the error file):")
            lines += ["    " + line for line in trace.splitlines()]
    else:
        lines.append(
            f"  no error file at {first.error_file}: decorate the worker's entry point with "
            f"@elastic.record (or torch's @record) to get its traceback here"
        )
    return "\n".join(lines)


def hang_summary(line: str, run_id: str, restarts: int, max_restarts: int) -> str:
    """The summary when a hang ends the job: the hang's line in the failure summary's shape."""
    return "\n".join(
        [
            f"worker group of job '{run_id}' failed after {restarts} of {max_restarts} restarts",
            f"  first failure: {line}",
            "  its stacks are above, and in `elastic-ctl history` (event worker_hung)",
        ]
    )


def change_line(
    state: JobState | None, monitor: JobMonitor | None, *, lease_lost: bool, restarts: int, budget: int
) -> str:
    """Why this node's workers stop for a new round, from what its monitor saw."""
    failures, lost, joining = (monitor.failures, monitor.lost, monitor.newcomers) if monitor else ([], [], [])
    if state is not None and state.status is JobStatus.CLOSED:
        return f"the job was closed ({state.reason})" if state.reason else "the job was closed"
    if state is not None and state.status is JobStatus.JOINING and state.reason:
        return f"{state.reason}: re-rendezvous"
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        if restarts < budget:
            return f"{failures[0]}{more}; restarting the workers ({restarts + 1}/{budget})"
        return f"{failures[0]}{more}; no restart left ({restarts}/{budget})"
    if lease_lost:
        return "this node's lease expired: re-rendezvous"
    if lost:
        return f"node{'s' if len(lost) > 1 else ''} {', '.join(lost)} left: re-rendezvous"
    if joining:
        return f"node{'s' if len(joining) > 1 else ''} {', '.join(joining)} joined: re-rendezvous"
    return "another node started a new round: re-rendezvous"
