"""Copying worker pipes: one thread (``LogPump``) reads every worker pipe that needs copying, with a
selector, and writes raw bytes to the log file and whole prefixed lines to the console and to the
duplicate-filter file.

Descriptors: a worker pipe's read end belongs to the pump from ``add`` on (its thread closes it at
EOF, or when the pump closes); the wake pipe belongs to the pump thread, which closes it after its
loop stopped (``launcher.selector.waker``). ``close`` only asks the thread to stop and waits for it."""

from __future__ import annotations

import os
import selectors
import threading
from typing import BinaryIO

from launcher.selector.waker import Waker

__all__ = ["LogPump"]


class _Source:
    """One worker pipe: raw bytes to its log file; whole lines, prefixed, to the console and to the
    duplicate file when they contain one of its needles."""

    def __init__(
        self,
        fd: int,
        prefix: bytes,
        console: BinaryIO | None,
        file: BinaryIO | None,
        duplicate: tuple[BinaryIO, tuple[bytes, ...]] | None = None,
    ) -> None:
        self.fd = fd
        self.prefix = prefix
        self.console = console
        self.file = file
        self.duplicate = duplicate
        self.partial = b""

    def feed(self, chunk: bytes) -> None:
        if self.file is not None:
            self.file.write(chunk)
            self.file.flush()
        if self.console is None and self.duplicate is None:
            return
        if not self.prefix and self.duplicate is None:  # verbatim: pass partial lines on as they come
            self.console.write(chunk)
            self.console.flush()
            return
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        self._lines(lines)

    def _lines(self, lines: list[bytes]) -> None:
        if not lines:
            return
        if self.console is not None:
            self.console.write(b"".join(self.prefix + line + b"\n" for line in lines))
            self.console.flush()
        if self.duplicate is not None:
            target, needles = self.duplicate
            kept = [self.prefix + line + b"\n" for line in lines if any(n in line for n in needles)]
            if kept:
                target.write(b"".join(kept))
                target.flush()

    def finish(self) -> None:
        if self.partial:
            self._lines([self.partial])
        self.partial = b""
        if self.file is not None:
            self.file.close()
        os.close(self.fd)


class LogPump:
    """Copies worker pipes to the console (teed streams prefixed), to log files and to the duplicate
    files, in one thread."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._waker = Waker()  # owned by the pump thread: it closes it, and every worker pipe, when it stops
        self._selector.register(self._waker.fileno(), selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pending: list[_Source] = []
        self._sources: dict[int, _Source] = {}
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="log-pump", daemon=True)
        self._thread.start()

    def add(
        self,
        fd: int,
        prefix: str,
        console: BinaryIO | None,
        file: BinaryIO | None,
        duplicate: tuple[BinaryIO, tuple[str, ...]] | None = None,
    ) -> None:
        """Take over the read end ``fd`` of a worker pipe (it is closed at EOF). ``duplicate``: a file
        and the needles whose lines are copied to it."""
        dup = (duplicate[0], tuple(n.encode() for n in duplicate[1])) if duplicate else None
        source = _Source(fd, prefix.encode(), console, file, dup)
        with self._lock:
            if self._closed:  # nobody will read it: this call's owner closes it
                source.finish()
                return
            self._pending.append(source)
        self._waker.wake()

    def drain(self, timeout: float) -> bool:
        """Wait until every pipe added so far reached EOF; False if some are still open after ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending and not self._sources, timeout=timeout)

    def close(self, timeout: float = 1.0) -> None:
        self.drain(timeout)
        with self._lock:
            self._closed = True
        self._waker.wake()  # a no-op if the thread stopped already
        self._thread.join(timeout=timeout + 1)

    def _run(self) -> None:
        while True:
            with self._lock:
                for source in self._pending:
                    self._sources[source.fd] = source
                    self._selector.register(source.fd, selectors.EVENT_READ, source)
                self._pending.clear()
                if self._closed:
                    break
            for key, _ in self._selector.select(timeout=1.0):
                if key.data is None:
                    self._waker.drain()
                    continue
                source: _Source = key.data
                try:
                    chunk = os.read(source.fd, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    try:
                        source.feed(chunk)
                    except (OSError, ValueError):
                        pass  # the console or disk is gone, or a file closed: keep draining so the worker never blocks
                    continue
                self._selector.unregister(source.fd)
                source.finish()
                with self._idle:
                    del self._sources[source.fd]
                    self._idle.notify_all()
        for source in list(self._sources.values()):  # closed with pipes still open (grandchildren)
            self._selector.unregister(source.fd)
            source.finish()
        self._sources.clear()
        self._selector.close()
        self._waker.close()
