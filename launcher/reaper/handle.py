"""The agent's two fences: ``ReaperProcess``, its handle on the reaper (``reaper.py``, a helper
process that enforces the renew deadline from outside, for an agent that is hung or dead, and kills
the workers when the agent dies); and ``FenceGuard``, a thread that kills this node's workers the
moment the renew deadline is past.

The guard is for an agent that was stopped with its machine (SIGSTOP, a paused VM, a swap
storm) and wakes past the deadline: whatever its main thread was doing when it stopped (an etcd
call, a watch, stopping the workers with a grace period), the workers get SIGKILL before anything
else happens, since the lease may have expired and the others may already run the same ranks.

Its wait is against the deadline itself (``threading.Condition.wait`` is an absolute wait on
CLOCK_MONOTONIC on Linux; each wait is also cut to ``SLICE``), and the deadline is looked at again
after every wake-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import wire
from .reaper import kill_groups

if TYPE_CHECKING:
    from rendezvous.etcd.target import EtcdTarget

__all__ = ["FenceGuard", "ReaperProcess", "reaper_sys_path"]

_REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")


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


def reaper_sys_path() -> list[str]:
    """Where the reaper imports the etcd client from if it has to revoke the lease: the directory of
    the ``rendezvous`` package, then this process's own path (the reaper starts with ``python -I -S``,
    without site-packages or PYTHONPATH, so that starting it costs the agent nothing more)."""
    import rendezvous

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(rendezvous.__file__))), *sys.path]
    return list(dict.fromkeys(p for p in paths if p))


class ReaperProcess:
    """The helper process that kills registered process groups when this process exits, or when
    the fence deadline passes without a newer one (``launcher/reaper/reaper.py``); and the same
    deadline enforced inside this process too (``FenceGuard``), for an agent that wakes past it."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", _REAPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        os.set_blocking(self._process.stdout.fileno(), False)
        self._lock = threading.Lock()
        self._fired = False
        self._lease: tuple[int, float] | None = None  # (lease id, its renew deadline)
        self._peers: float | None = None  # the peers' contact deadline (``launcher.peers``), while a round runs
        self._arming = threading.Lock()  # the lease's renewals and the peers' answers arm it from two threads
        self._handled: float | None = None  # the last deadline a ``clear`` dealt with
        self._guard = FenceGuard()

    def _send(self, *messages: wire.Message) -> None:
        stdin = self._process.stdin
        if stdin is None:
            return
        with self._lock:
            try:
                stdin.write(b"".join(wire.encode(message) for message in messages))
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass

    def register(self, pgid: int) -> None:
        self._guard.register(pgid)
        self._send(wire.Started(pgid))

    def unregister(self, pgid: int) -> None:
        self._guard.unregister(pgid)
        self._send(wire.Stopped(pgid))

    def configure(self, target: EtcdTarget, sys_path: Sequence[str], history: dict | None = None) -> None:
        """How to reach etcd (an ``EtcdTarget``) to revoke the lease once this process is gone (and
        where to record that)."""
        self._send(wire.Config(target.to_json(), tuple(sys_path), history))

    def remove_at_exit(self, path: str) -> None:
        """A temporary ``elastic-*`` directory the reaper removes if this process dies (not on ``close``)."""
        self._send(wire.Temporary(path))

    def note_round(self, round_: int) -> None:
        self._send(wire.Round(round_))

    def arm(self, lease_id: int, deadline: float) -> None:
        """The lease to revoke after this process dies, and the time its workers must be gone by."""
        with self._arming:
            self._lease = (lease_id, deadline)
            self._rearm()

    def contact(self, deadline: float | None) -> None:
        """The time the peers' probes give this node's workers (None: none now); the earlier of it
        and the lease's renew deadline is the one enforced."""
        with self._arming:
            self._peers = deadline
            self._rearm()

    def _rearm(self) -> None:
        lease_id, deadline = self._lease or (0, None)
        if self._peers is not None:
            deadline = self._peers if deadline is None else min(deadline, self._peers)
        self._guard.arm(deadline)
        self._send(wire.Lease(lease_id), wire.Deadline(deadline))

    def fired(self) -> bool:
        """The deadline passed and the reaper (or this process's guard) killed the workers (sticky until ``clear``)."""
        if not self._fired and self._guard.fired():
            self._fired = True
        if not self._fired and self._process.stdout is not None:
            try:
                data = os.read(self._process.stdout.fileno(), 4096)
            except (BlockingIOError, OSError):
                data = b""
            self._fired = any(self._news(line) for line in data.split(b"\n") if line.startswith(b"F"))
        return self._fired

    def _news(self, line: bytes) -> bool:
        """An ``F<deadline>`` line from the reaper is news unless a ``clear`` already dealt with that
        deadline (the guard in this process may have killed the workers first)."""
        fenced = wire.decode(line.decode(errors="replace"))
        if not isinstance(fenced, wire.Fenced):
            return True
        return self._handled is None or fenced.deadline > self._handled

    def clear(self) -> None:
        """The fence was dealt with (or a round starts): forget it, and a late word from the reaper
        about any deadline already past -- the workers it was for are gone (a peers' deadline that
        passed while a round's workers stopped may be reported after the next round began)."""
        self.fired()
        self._handled = max(self._handled or float("-inf"), time.monotonic())
        self._guard.clear()
        self._fired = False

    def close(self) -> None:
        """Stop it after a clean exit: the workers are already stopped, and the lease is not its to revoke."""
        self._guard.arm(None)
        self._guard.close()
        self._send(wire.Lease(0), wire.Deadline(None), wire.Temporary(""))
        if self._process.stdin is not None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
        if self._process.stdout is not None:
            self._process.stdout.close()
