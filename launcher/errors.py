"""The launcher's errors and exit codes.

    LauncherError
    ├── UsageError          bad command line or settings          exit 2
    ├── WorkerFailedError   workers failed and no restart is left  exit 1
    ├── JobRendezvousError  the rendezvous could not be completed  exit 3
    └── AgentStopped        SIGTERM / SIGINT / SIGHUP              exit 128 + signal
"""

from __future__ import annotations

import signal

__all__ = [
    "EXIT_OK", "EXIT_WORKER_FAILED", "EXIT_USAGE", "EXIT_RENDEZVOUS",
    "LauncherError", "UsageError", "WorkerFailedError", "JobRendezvousError", "AgentStopped",
]

EXIT_OK = 0
EXIT_WORKER_FAILED = 1
EXIT_USAGE = 2
EXIT_RENDEZVOUS = 3


class LauncherError(Exception):
    exit_code = EXIT_WORKER_FAILED


class UsageError(LauncherError, ValueError):
    exit_code = EXIT_USAGE


class WorkerFailedError(LauncherError):
    exit_code = EXIT_WORKER_FAILED


class JobRendezvousError(LauncherError):
    exit_code = EXIT_RENDEZVOUS


class AgentStopped(LauncherError):
    """The agent was told to stop by a signal; its workers are stopped, the job stays open."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return 128 + self.signum
