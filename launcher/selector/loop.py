"""The skeleton of a thread that waits in ``selectors`` and is woken by other threads: the line
server, the c10d store and the peer watcher are each one.

The thread owns its selector, its wake pipe (``waker.Waker``) and every file it registers: it
closes them once, after its loop stopped -- never another thread, so that no descriptor is closed
twice or closed under a select. Other threads call ``wake()`` and ``close()`` only."""

from __future__ import annotations

import selectors
import threading

from .waker import Waker

__all__ = ["SelectorThread"]

_WAKE = object()  # the wake pipe's key data


class SelectorThread:
    """Subclasses give ``_loop()`` (until ``stopping``; ``_events()`` waits) and ``_shutdown()``
    (what the loop leaves to close: its sockets), and call ``_start()`` at the end of ``__init__``."""

    def __init__(self, name: str) -> None:
        self._selector = selectors.DefaultSelector()
        self._waker = Waker()
        self._selector.register(self._waker.fileno(), selectors.EVENT_READ, _WAKE)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wake(self) -> None:
        """Make the thread's current wait return (any thread, any time)."""
        self._waker.wake()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and wait up to ``timeout`` seconds for the thread to close everything."""
        self._stopping.set()
        self._waker.wake()
        self._thread.join(timeout=timeout)

    def _start(self) -> None:
        self._thread.start()

    def _events(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        """Wait up to ``timeout`` seconds (None: until something happens); the ready files, a wake-up
        drained and left out (it only ends the wait)."""
        ready = self._selector.select(timeout)
        if any(key.data is _WAKE for key, _ in ready):
            self._waker.drain()
        return [(key, events) for key, events in ready if key.data is not _WAKE]

    def _registered(self) -> list[selectors.SelectorKey]:
        """Every file the loop registered (not the wake pipe)."""
        return [key for key in self._selector.get_map().values() if key.data is not _WAKE]

    def _loop(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        """Close what the loop registered (in the thread, after the loop)."""

    def _main(self) -> None:
        try:
            self._loop()
        finally:
            try:
                self._shutdown()
            finally:
                self._selector.close()
                self._waker.close()
