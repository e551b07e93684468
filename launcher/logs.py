"""Worker output: ``[rankN]:`` prefixed console lines, per-rank log files, torchrun's -r / -t / filter.

``--redirects`` / ``--tee`` take torchrun's values: 0 (none), 1 (stdout), 2 (stderr), 3 (both), for
every local rank, or per local rank as ``0:1,1:2``. A redirected stream goes to its log file only;
a teed one to the console and its file. ``--local-ranks-filter 0,2`` shows only those local ranks
on the console (their files are unaffected).

Files: ``<log dir>/attempt_<n>/<local rank>/{stdout,stderr}.log`` next to the worker's ``error.json``.
One thread (``LogPump``) reads every worker pipe with a selector.
"""

from __future__ import annotations

import os
import selectors
import threading
from dataclasses import dataclass
from typing import BinaryIO

from .errors import UsageError

__all__ = ["Std", "parse_std", "parse_ranks_filter", "StreamPlan", "plan_stream", "LogPump"]

STDOUT, STDERR = 1, 2  # bit values, as torchrun's Std


class Std:
    NONE, OUT, ERR, ALL = 0, 1, 2, 3


def parse_std(value: str | int | None, option: str) -> dict[int, int] | int:
    """``3`` -> 3 for every rank; ``0:1,1:2`` -> {0: 1, 1: 2} (ranks not named: 0)."""
    if value is None or value == "":
        return Std.NONE
    text = str(value).strip()

    def level(item: str) -> int:
        if item.strip() not in {"0", "1", "2", "3"}:
            raise UsageError(f"{option} must be 0, 1, 2 or 3 (or LOCAL_RANK:LEVEL,...), not {text!r}")
        return int(item)

    if ":" not in text:
        return level(text)
    mapping: dict[int, int] = {}
    for part in text.split(","):
        rank, sep, lvl = part.partition(":")
        if not sep or not rank.strip().isdigit():
            raise UsageError(f"{option} must be 0, 1, 2 or 3 (or LOCAL_RANK:LEVEL,...), not {text!r}")
        mapping[int(rank)] = level(lvl)
    return mapping


def parse_ranks_filter(value: str | None) -> frozenset[int] | None:
    if value is None or value.strip() == "":
        return None
    ranks = set()
    for part in value.split(","):
        if not part.strip().isdigit():
            raise UsageError(f"--local-ranks-filter takes local ranks like 0,2, not {value!r}")
        ranks.add(int(part))
    return frozenset(ranks)


@dataclass(frozen=True)
class StreamPlan:
    console: bool  # shown on the agent's console, prefixed
    file: bool  # written to the rank's log file


def _level(setting: dict[int, int] | int, local_rank: int) -> int:
    return setting.get(local_rank, Std.NONE) if isinstance(setting, dict) else setting


def plan_stream(
    local_rank: int, stream: int, redirects: dict[int, int] | int, tee: dict[int, int] | int,
    ranks_filter: frozenset[int] | None,
) -> StreamPlan:
    """Where one worker stream goes. ``stream`` is STDOUT (1) or STDERR (2)."""
    redirected = bool(_level(redirects, local_rank) & stream)
    teed = bool(_level(tee, local_rank) & stream)
    shown = ranks_filter is None or local_rank in ranks_filter
    return StreamPlan(console=shown and not redirected, file=redirected or teed)


class _Source:
    def __init__(self, fd: int, prefix: bytes, console: BinaryIO | None, file: BinaryIO | None) -> None:
        self.fd = fd
        self.prefix = prefix
        self.console = console
        self.file = file
        self.partial = b""

    def feed(self, chunk: bytes) -> None:
        if self.file is not None:
            self.file.write(chunk)
            self.file.flush()
        if self.console is None:
            return
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if lines:
            self.console.write(b"".join(self.prefix + line + b"\n" for line in lines))
            self.console.flush()

    def finish(self) -> None:
        if self.console is not None and self.partial:
            self.console.write(self.prefix + self.partial + b"\n")
            self.console.flush()
        self.partial = b""
        if self.file is not None:
            self.file.close()
        os.close(self.fd)


class LogPump:
    """Copies worker pipes to the console (prefixed per rank) and to log files, in one thread."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pending: list[_Source] = []
        self._sources: dict[int, _Source] = {}
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="log-pump", daemon=True)
        self._thread.start()

    def add(self, fd: int, prefix: str, console: BinaryIO | None, file: BinaryIO | None) -> None:
        """Take over the read end ``fd`` of a worker pipe (it is closed at EOF)."""
        with self._lock:
            self._pending.append(_Source(fd, prefix.encode(), console, file))
        os.write(self._wake_w, b"x")

    def drain(self, timeout: float) -> bool:
        """Wait until every pipe added so far reached EOF; False if some are still open after ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending and not self._sources, timeout=timeout)

    def close(self, timeout: float = 1.0) -> None:
        self.drain(timeout)
        with self._lock:
            self._closed = True
        os.write(self._wake_w, b"x")
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
                    os.read(self._wake_r, 4096)
                    continue
                source: _Source = key.data
                try:
                    chunk = os.read(source.fd, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    try:
                        source.feed(chunk)
                    except OSError:
                        pass  # the console or disk is gone: keep draining so the worker never blocks
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
        os.close(self._wake_r)
        os.close(self._wake_w)
