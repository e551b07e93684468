"""The launcher's errors and exit codes.

    LauncherError
    ├── UsageError          bad command line or settings          exit 2
    ├── WorkerFailedError   workers failed and no restart is left  exit 1
    │   └── ChildFailedError    the same, raised by launcher.api (torch's shape)
    ├── JobRendezvousError  the rendezvous could not be completed  exit 3
    ├── JobClosedError      an operator closed the job              exit 4
    └── AgentStopped        a signal of --signals-to-handle        exit 128 + signal
"""

from __future__ import annotations

import signal
from typing import Any, Sequence

__all__ = [
    "EXIT_OK", "EXIT_WORKER_FAILED", "EXIT_USAGE", "EXIT_RENDEZVOUS", "EXIT_CLOSED",
    "LauncherError", "UsageError", "WorkerFailedError", "ChildFailedError", "JobRendezvousError", "JobClosedError", "AgentStopped",
]

EXIT_OK = 0
EXIT_WORKER_FAILED = 1
EXIT_USAGE = 2
EXIT_RENDEZVOUS = 3
EXIT_CLOSED = 4


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
            how = f"killed by {failure.signal_name}" if failure.signal_name else f"exit code {failure.exitcode}"
            lines.append(f"  rank {rank} (local rank {failure.local_rank}) on {failure.host}: {how}; "
                         f"error_file: {failure.error_file if failure.error else '<N/A>'}")
            if failure.error is not None and failure.error.traceback:
                lines += ["    " + line for line in failure.error.traceback.rstrip().splitlines()]
        return "\n".join(lines)


class JobRendezvousError(LauncherError):
    exit_code = EXIT_RENDEZVOUS


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
        return 128 + self.signum
