"""The launcher's errors and exit codes.

    LauncherError
    ├── UsageError          bad command line or settings          exit 2
    ├── WorkerFailedError   workers failed and no restart is left  exit 1
    ├── JobRendezvousError  the rendezvous could not be completed  exit 3
    ├── JobClosedError      an operator closed the job              exit 4
    └── AgentStopped        a signal of --signals-to-handle        exit 128 + signal
"""

from __future__ import annotations

import signal

__all__ = [
    "EXIT_OK", "EXIT_WORKER_FAILED", "EXIT_USAGE", "EXIT_RENDEZVOUS", "EXIT_CLOSED",
    "LauncherError", "UsageError", "WorkerFailedError", "JobRendezvousError", "JobClosedError", "AgentStopped",
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
    exit_code = EXIT_WORKER_FAILED


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
