"""Restarts: the job's one restart count, and what every node says when its workers stop for a new round.

A restart, from start to end:

1. a worker fails (``workers.group``) or hangs (``hangs``) on some node: its round ends FAILED or
   HUNG (``launcher.runner``);
2. that node's agent decides here (``restart_or_close``): while the job's count is under its
   budget it asks the next round for a restart -- ``RendezvousHandler.request_restart``, which the
   node key of its next join carries (which round failed, and the line saying why); else it prints
   the failure summary, closes the job failed and exits 1;
3. the next round's coordinator counts it once, whichever and however many nodes asked
   (``rendezvous.rounds.decide.restart_count``); the count and the budget (the first agent's
   ``--max-restarts``) travel in the job state, so every worker of the round sees the same
   TORCHELASTIC_RESTART_COUNT;
4. the coordinator of the running round says in the state why it ended (its cause:
   ``rendezvous.rounds.monitor``), so every other node prints the same line (``change_line``), and the
   metrics count the restart by that cause.

A membership change (a node gone or arriving) or a fence re-rendezvouses without using a restart.
Everything here is pure formatting and decisions; the agent does the I/O.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.hangs.verdict import Verdict
from launcher.workers.group import GroupStatus
from rendezvous.job.progress import RoundProgress, Streak
from rendezvous.job.state import Cause, FailureKind, JobOutcome, JobState, JobStatus
from rendezvous.rounds.join import RendezvousInfo
from rendezvous.rounds.monitor import JobMonitor

__all__ = [
    "Departure",
    "Failure",
    "failure_of",
    "hang_of",
    "restart_line",
    "spent_reason",
    "crash_loop_reason",
    "crash_loop_summary",
    "failure_summary",
    "hang_summary",
    "change_line",
    "loss_line",
    "fence_reason",
    "renewal_line",
    "failure_records",
    "raise_site",
    "rejoin_after_finish",
    "finished_without",
    "barrier_line",
]


@dataclass
class Departure:
    """What this node's history and workers are told when the agent leaves."""

    reason: str = "the agent exited"
    signum: int = signal.SIGTERM  # the workers get the signal the agent got, as under torchrun


@dataclass(frozen=True)
class Failure:
    """What ended a round on this node, as a restart needs it said."""

    what: str  # one line: "rank 3 on node n1 failed (exit code 1)"
    summary: Callable[[], str]  # the whole summary, printed when no restart is left
    failures: tuple = ()  # this node's worker failures (for the error the agent raises)
    kind: FailureKind = FailureKind.WORKER
    how: str = ""  # how the first failed worker ended: "exit 1", "SIGKILL", "hang"
    rank: int = -1  # its global rank
    site: str = ""  # where it raised (its error file's innermost frame), "" when unknown

    def progress(self, beats: int, checkpoint: int, long: bool, ran: float) -> RoundProgress:
        """How far the round got and what failed, as the crash-loop breaker weighs it."""
        return RoundProgress(beats, checkpoint, long, self.how, self.rank, self.site, round(ran, 2))


def restart_line(what: str, restarts: int, budget: int, in_place: bool = False) -> str:
    """The line every node prints when a failure uses a restart, or finds none left (``in_place``:
    the workers run under elastic.inprocess, and the survivors are resumed, not restarted)."""
    if restarts < budget:
        action = "resuming the workers in place" if in_place else "restarting the workers"
        return f"{what}; {action} ({restarts + 1}/{budget})"
    return f"{what}; no restart left ({restarts}/{budget})"


def loss_line(lost: tuple[str, ...], restarts: int, budget: int) -> str:
    """The line every node prints when a participant's machine is lost while the round runs:
    a membership change, whatever failed with it."""
    names = f"node{'s' if len(lost) > 1 else ''} {', '.join(lost)}"
    return f"{names} left the round (agent gone or silent): re-rendezvous, no restart used ({restarts}/{budget})"


def fence_reason(
    peers_unheard: float | None, peers_deadline: float, lease_silent: float, renew_deadline: float
) -> tuple[str, str]:
    """Why this node stopped its own workers, and the deadline that passed: the peers' when it came
    first (``peers_unheard``: seconds since a watcher acknowledged it, else None), or the lease's."""
    if peers_unheard is not None:
        return f"no peer acknowledged this node's probe answers for {peers_unheard:.1f} s", (
            f"peers' deadline {peers_deadline:g} s"
        )
    return f"no lease renewal from etcd for {lease_silent:.1f} s", f"renew deadline {renew_deadline:g} s"


def renewal_line(round_: int, silent: float, renew_deadline: float) -> str:
    """What a node says when a round formed before etcd renewed its lease (just back from an outage)."""
    return (
        f"round {round_}: this node's lease was last renewed {silent:.1f} s ago: its workers start once "
        f"etcd renews it (waiting up to the renew deadline, {renew_deadline:g} s)"
    )


def crash_loop_reason(what: str, streak: Streak, limit: int) -> str:
    """Why the crash-loop breaker closed the job, as its state, its history and every node say it."""
    return f"{what}: a crash loop, {limit} restarts in a row made no progress ({streak.stalled + 1}/{limit})"


def crash_loop_summary(what: str, streak: Streak, limit: int, window: float) -> str:
    """What failed in each restart of the loop, the newest last, and why none was progress."""
    cycles = [*streak.failures[-(limit - 1) :], what] if limit > 1 else [what]
    lines = [
        f"crash loop: {limit} restarts in a row made no progress -- no worker beat more than "
        f"{streak.beats} heartbeats in a round, no elastic.checkpoint step after "
        f"{streak.checkpoint if streak.checkpoint >= 0 else 'none'}, no round ran {window:g} s "
        "(--crash-loop-restarts, --progress-window)"
    ]
    lines += [f"  restart {i + 1}: {line}" for i, line in enumerate(cycles)]
    return "\n".join(lines)


def spent_reason(what: str, restarts: int, budget: int) -> str:
    """Why the job is closed failed, as its state and history say it."""
    return f"{what} and no restart was left ({restarts}/{budget})"


def failure_of(status: GroupStatus, node: str, info: RendezvousInfo) -> Failure:
    first = status.first_failure
    what = f"rank {first.rank} on node {node} failed ({first.describe()})"
    how = first.signal_name or f"exit {first.exitcode}"
    site = raise_site(first.error.traceback) if first.error else ""
    summary = lambda: failure_summary(status, info.run_id, info.restart_count, info.max_restarts)  # noqa: E731
    return Failure(what, summary, status.failures, how=how, rank=first.rank, site=site)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def raise_site(traceback: str) -> str:
    """The innermost frame of a traceback, ``train.py:42 in step`` ("" when it names none)."""
    frames = _FRAME.findall(traceback)
    if not frames:
        return ""
    path, line, function = frames[-1]
    return f"{os.path.basename(path)}:{line} in {function}"[:300]


def hang_of(verdict: Verdict, info: RendezvousInfo, history_command: str = "") -> Failure:
    """The verdict's lines are printed already: the restart line says it in a few words."""
    line = verdict.line()
    return Failure(
        verdict.what(),
        lambda: hang_summary(line, info.run_id, info.restart_count, info.max_restarts, history_command),
        kind=FailureKind.HANG,
        how="hang",
        rank=verdict.culprit.rank,
    )


def failure_records(status: GroupStatus) -> list[dict]:
    """The ``worker_failed`` history records of a failed group: one per failed worker."""
    records = []
    for failure in status.failures:
        text = failure.error.message.strip() if failure.error else ""
        records.append(
            {
                "rank": failure.rank,
                "host": failure.host,
                "exit_code": None if failure.exitcode < 0 else failure.exitcode,
                "signal": failure.signal_name,
                "message": text.splitlines()[0] if text else None,
            }
        )
    return records


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
    elif first.signal_name:  # a signal ends a process before any handler could write a file
        lines.append(f"  rank {first.rank} was {first.describe()}: a signal leaves no error file nor traceback")
    else:
        lines.append(
            f"  rank {first.rank} wrote no error file: decorate the worker's entry point with "
            f"@elastic.record (or torch's @record) to get its traceback here"
        )
    return "\n".join(lines)


def hang_summary(line: str, run_id: str, restarts: int, max_restarts: int, history_command: str = "") -> str:
    """The summary when a hang ends the job: the hang's line in the failure summary's shape; where
    its record stays, when the job's etcd outlives the agent (not under --standalone)."""
    where = f", and in `{history_command}` (event: worker hung)" if history_command else ""
    return "\n".join(
        [
            f"worker group of job '{run_id}' failed after {restarts} of {max_restarts} restarts",
            f"  first failure: {line}",
            f"  its stack is above{where}",
        ]
    )


def change_line(
    state: JobState | None,
    monitor: JobMonitor | None,
    *,
    lease_lost: bool,
    restarts: int,
    budget: int,
    in_place: bool = False,
) -> str:
    """Why this node's workers stop for a new round, from what its monitor saw."""
    cause = monitor.cause if monitor else Cause()
    failures, lost, joining = cause.failures, cause.lost, cause.joining
    if state is not None and state.status is JobStatus.CLOSED:
        return f"the job was closed ({state.reason})" if state.reason else "the job was closed"
    if state is not None and state.status is JobStatus.JOINING and state.reason:
        return f"{state.reason}: re-rendezvous"
    if lost and not failures and not lease_lost:
        return loss_line(lost, restarts, budget)
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return restart_line(f"{failures[0]}{more}", restarts, budget, in_place)
    if lease_lost:
        return "this node's lease expired: re-rendezvous"
    if joining:
        return f"node{'s' if len(joining) > 1 else ''} {', '.join(joining)} joined: re-rendezvous"
    return "another node started a new round: re-rendezvous"


def finished_without(state: JobState | None, away: bool) -> str | None:
    """The job succeeded without this node (None: it did not): while it was out of the job (``away``:
    fenced, coming back) or waited for a place in it (a hot spare never needed). Said before the
    agent leaves; its history record says the same."""
    if state is None or state.outcome(live_nodes=0) is not JobOutcome.SUCCEEDED:
        return None
    where = "was out of it" if away else "waited for a place"
    return f"the job finished while this node {where} ({state.reason})"


def barrier_line(unfinished: Sequence[str], timeout: float) -> str:
    """The exit barrier timed out: which nodes still ran their workers, and that this one leaves."""
    names = ", ".join(unfinished) or "none that etcd names"
    return (
        f"the exit barrier timed out after {timeout:g} s: nodes still running their workers: {names}; "
        "this node's workers succeeded, and it exits (--exit-barrier-timeout)"
    )


def rejoin_after_finish(state: JobState | None) -> str | None:
    """This node's workers succeeded but the round did not finish: the line it says as it rejoins
    the job's next round, or None when it has nothing left to do (the job closed or went on without
    it, or etcd could not say). It rejoins when another node's worker failed or hung after its own
    finished (the job restarts), or when a newcomer came before the last workers ended and a
    participant's were stopped for it (the job goes on with the newcomer: the round cannot form
    without this node's ranks, as it could not had the newcomer come a moment earlier)."""
    if state is None or state.status is not JobStatus.JOINING:
        return None
    cause = state.cause
    if cause.failures:
        used = f" ({state.restarts + 1}/{state.max_restarts})" if state.restarts < state.max_restarts else ""
        return f"{cause.failures[0]} after this node's workers finished: the job restarts{used}; rejoining"
    if cause.waiting and not cause.lost:
        names = ", ".join(cause.joining) or f"{cause.waiting} node(s)"
        return f"{names} came to join before every node's workers finished: the job goes on with them; rejoining"
    return None
