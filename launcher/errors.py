"""The launcher's errors and its exit codes: the one table a scheduler acts on (README "Exit codes").

    LauncherError
    ├── UsageError            bad command line, settings or credentials      exit 2
    ├── WorkerFailedError     workers failed (or hung), no restart is left    exit 1
    │   ├── ChildFailedError      the same, raised by launcher.api (torch's shape)
    │   └── CrashLoopError        restarts in a row made no progress              exit 5
    ├── JobRendezvousError    the job cannot be joined (closed, not ours)    exit 3
    ├── JobClosedError        an operator closed the job                     exit 4
    ├── InfrastructureError   etcd, the rendezvous or the lease failed       exit 200
    └── AgentStopped          a signal of --signals-to-handle                exit 128 + signal

Codes 1-127 mean "do not retry the pod" (the code, the input or an operator said so) and 128-255
"retry" (a signal: preemption, eviction; or the infrastructure), as Kubeflow's ExitCode restart
policy reads them; ``podFailurePolicy`` rules list them explicitly (examples/kubernetes/).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousCredentialsError,
    RendezvousNoSpaceError,
    RendezvousTimeoutError,
)

__all__ = [
    "EXIT_OK",
    "EXIT_WORKER_FAILED",
    "EXIT_USAGE",
    "EXIT_RENDEZVOUS",
    "EXIT_CLOSED",
    "EXIT_CRASH_LOOP",
    "EXIT_INFRA",
    "EXIT_SIGNAL_BASE",
    "EXIT_CODES",
    "ExitCode",
    "describe_code",
    "rendezvous_failure",
    "LauncherError",
    "UsageError",
    "WorkerFailedError",
    "ChildFailedError",
    "CrashLoopError",
    "JobRendezvousError",
    "JobClosedError",
    "InfrastructureError",
    "AgentStopped",
]

EXIT_OK = 0
EXIT_WORKER_FAILED = 1
EXIT_USAGE = 2
EXIT_RENDEZVOUS = 3
EXIT_CLOSED = 4
EXIT_CRASH_LOOP = 5
EXIT_INFRA = 200
EXIT_SIGNAL_BASE = 128


@dataclass(frozen=True)
class ExitCode:
    code: str  # "0", or "128+N"
    meaning: str
    retry: bool  # worth retrying the pod / the batch job


EXIT_CODES = (
    ExitCode("0", "the job succeeded (also on a node that was fenced or a spare while the others finished it)", False),
    ExitCode(
        "1",
        "the training code failed: a worker exited non-zero or hung, and no restart was left (torchrun's code)",
        False,
    ),
    ExitCode("2", "bad usage: an option, a setting or the etcd credentials (one line says which)", False),
    ExitCode(
        "3",
        "the job cannot be joined: its id closed (finished or failed) after this agent was launched (a late node "
        "of that run; a later launch runs it again), or its state in etcd is not ours",
        False,
    ),
    ExitCode(
        "4",
        "an operator closed the job (elastic-ctl close); a new launch of its id too, until elastic-ctl reset",
        False,
    ),
    ExitCode(
        "5",
        "crash loop: --crash-loop-restarts restarts in a row made no progress (no new heartbeat or checkpoint "
        "step, each round under --progress-window); a requeue would fail the same way",
        False,
    ),
    ExitCode(
        "128+N",
        "stopped by signal N (143: SIGTERM, as on preemption, eviction or pod deletion); the job stays open",
        True,
    ),
    ExitCode(
        "200",
        "the infrastructure failed: etcd unreachable past connect_timeout, etcd out of space (NOSPACE), "
        "no round within join_timeout, or the lease lost with no way back",
        True,
    ),
)


def describe_code(code: int) -> ExitCode | None:
    """The row of the table for an exit code."""
    key = "128+N" if code > EXIT_SIGNAL_BASE and code != EXIT_INFRA else str(code)
    return next((row for row in EXIT_CODES if row.code == key), None)


class LauncherError(Exception):
    exit_code = EXIT_WORKER_FAILED


class UsageError(LauncherError, ValueError):
    exit_code = EXIT_USAGE


class WorkerFailedError(LauncherError):
    """Workers failed with no restart left; ``failures`` are this node's (empty when another node's failed)."""

    exit_code = EXIT_WORKER_FAILED

    def __init__(self, message: str, failures: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.failures = tuple(failures)


class ChildFailedError(WorkerFailedError):
    """torch's ChildFailedError shape: ``name`` (the entrypoint) and ``failures`` by global rank, each
    with its exit code, error file and the traceback from it; ``format_msg()`` prints them."""

    def __init__(self, name: str, failures: Sequence[Any], reason: str = "") -> None:
        self.name = name
        self.reason = reason
        by_rank = {f.rank: f for f in failures}
        super().__init__(self._format(name, by_rank, reason), failures)
        self.failures = by_rank  # type: ignore[assignment]

    def get_first_failure(self) -> tuple[int, Any] | None:
        if not self.failures:
            return None
        rank = min(self.failures, key=lambda r: (self.failures[r].at, r))
        return rank, self.failures[rank]

    def format_msg(self) -> str:
        return str(self)

    @staticmethod
    def _format(name: str, failures: dict[int, Any], reason: str) -> str:
        lines = [f"{name} FAILED" + (f": {reason}" if reason else "")]
        for rank in sorted(failures):
            failure = failures[rank]
            lines.append(
                f"  rank {rank} (local rank {failure.local_rank}) on {failure.host}: {failure.describe()}; "
                f"error_file: {_error_file(failure)}"
            )
            if failure.error is not None and failure.error.traceback:
                lines += ["    " + line for line in failure.error.traceback.rstrip().splitlines()]
        return "\n".join(lines)


class CrashLoopError(WorkerFailedError):
    """The job failed the same way restart after restart, getting no further (``rendezvous.job.progress``)."""

    exit_code = EXIT_CRASH_LOOP


def _error_file(failure: Any) -> str:
    """torch's ``error_file:`` field, naming only a file that is still there (a temporary log
    directory is gone once the launch returns; the traceback is printed below it either way)."""
    if failure.error is None:
        return "<N/A>"
    return failure.error_file if os.path.exists(failure.error_file) else "<removed with the run's log directory>"


class JobRendezvousError(LauncherError):
    exit_code = EXIT_RENDEZVOUS


class InfrastructureError(LauncherError):
    """etcd or the rendezvous failed under the job (unreachable, timed out, lease lost): worth a retry."""

    exit_code = EXIT_INFRA


class JobClosedError(LauncherError):
    """An operator closed the job (``elastic-ctl close``): the workers were stopped gracefully."""

    exit_code = EXIT_CLOSED


class AgentStopped(LauncherError):
    """The agent was told to stop by a signal; its workers are stopped, the job stays open."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return EXIT_SIGNAL_BASE + self.signum


def rendezvous_failure(exc: Exception) -> LauncherError:
    """A rendezvous error as the exit-code table classes it."""
    if isinstance(exc, RendezvousCredentialsError):
        return UsageError(str(exc))
    if isinstance(exc, (RendezvousTimeoutError, RendezvousConnectionError, RendezvousNoSpaceError)):
        return InfrastructureError(str(exc))
    return JobRendezvousError(str(exc))
