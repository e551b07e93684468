"""The self-pipe that wakes a selector thread, with one owner.

A thread that waits in ``selectors`` on sockets or pipes is woken by other threads through a pipe
it also selects on. Who closes that pipe, and when, decides whether a late wake-up is harmless or
writes into whatever file has since been given the same descriptor number. The rule here (asyncio's
self-pipe rule): the selecting thread owns the pipe -- it registers ``fileno()``, drains it, and
closes it once, after its loop stopped. ``wake()`` may come from any thread at any time, before or
after that: it writes under a lock that ``close()`` takes too, and after ``close()`` it does nothing.
"""

from __future__ import annotations

import os
import threading

__all__ = ["Waker"]


class Waker:
    """A non-blocking pipe: other threads ``wake()`` the selecting thread, which ``drain()``s it and
    ``close()``s it when its loop has stopped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        self._read_end: int | None = read_end
        self._write_end: int | None = write_end

    def fileno(self) -> int:
        """The end to select on (for the owning thread; -1 once closed)."""
        return self._read_end if self._read_end is not None else -1

    @property
    def closed(self) -> bool:
        return self._write_end is None

    def wake(self) -> None:
        """Wake the selecting thread; a no-op once it closed the pipe (or while a wake is pending)."""
        with self._lock:
            if self._write_end is None:
                return
            try:
                os.write(self._write_end, b"x")
            except BlockingIOError:
                pass  # the pipe is full: the thread has wake-ups to read already

    def drain(self) -> None:
        """Read the pending wake-ups (the owning thread, when the selector says the pipe is readable)."""
        while self._read_end is not None:
            try:
                if not os.read(self._read_end, 4096):
                    return
            except (BlockingIOError, InterruptedError):
                return

    def close(self) -> None:
        """Close both ends, once (the owning thread, after its loop stopped); later calls do nothing."""
        with self._lock:
            ends, self._read_end, self._write_end = (self._read_end, self._write_end), None, None
        for end in ends:
            if end is not None:
                os.close(end)
