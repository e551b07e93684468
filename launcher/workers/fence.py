"""The agent's own fence: a thread that kills this node's workers the moment the renew deadline is past.

The reaper (``reaper.py``) enforces the same deadline from outside, for an agent that is hung or
dead. This guard is for an agent that was stopped with its machine (SIGSTOP, a paused VM, a swap
storm) and wakes past the deadline: whatever its main thread was doing when it stopped (an etcd
call, a watch, stopping the workers with a grace period), the workers get SIGKILL before anything
else happens, since the lease may have expired and the others may already run the same ranks.

Its wait is against the deadline itself (``threading.Condition.wait`` is an absolute wait on
CLOCK_MONOTONIC on Linux; each wait is also cut to ``SLICE``), and the deadline is looked at again
after every wake-up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .reaper import kill_groups

__all__ = ["FenceGuard"]


class FenceGuard:
    """SIGKILL to every registered worker process group once ``deadline`` is past (sticky until ``clear``)."""

    SLICE = 1.0  # seconds: the longest one wait lasts before the clock is read again

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._changed = threading.Condition()
        self._groups: set[int] = set()
        self._deadline: float | None = None
        self._fired = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fence", daemon=True)
        self._thread.start()

    def register(self, pgid: int) -> None:
        with self._changed:
            self._groups.add(pgid)

    def unregister(self, pgid: int) -> None:
        with self._changed:
            self._groups.discard(pgid)

    def arm(self, deadline: float | None) -> None:
        """The time the workers must be gone by (None: no deadline, as after a clean exit)."""
        with self._changed:
            self._deadline = deadline
            self._changed.notify()

    def fired(self) -> bool:
        """The deadline passed with workers registered, and they were killed."""
        return self._fired

    def clear(self) -> None:
        self._fired = False

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                if self._deadline is not None and self._clock() >= self._deadline:
                    self._fence()
                    continue
                wait = None if self._deadline is None else min(max(self._deadline - self._clock(), 0.0), self.SLICE)
                self._changed.wait(wait)

    def _fence(self) -> None:
        """Kill every registered group (the lock is held: nothing is registered meanwhile)."""
        self._fired = kill_groups(self._groups) > 0 or self._fired
        self._groups.clear()
        self._deadline = None
