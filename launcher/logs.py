"""Worker output, as torchrun: verbatim console lines, per-rank log files, -r / -t / filters.

``--redirects`` / ``--tee`` take torchrun's values: 0 (none), 1 (stdout), 2 (stderr), 3 (both), for
every local rank, or per local rank as ``0:1,1:2``. As in torch:

- a stream neither redirected nor teed goes to the console unchanged (the worker writes to the
  agent's own stdout / stderr);
- a redirected stream goes to its log file only;
- a teed stream goes to its log file *and* to the console, whatever ``--redirects`` says, each line
  prefixed ``[<role><local rank>]:`` or by ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``
  (``${role_name}``, ``${rank}``, ``${local_rank}``);
- ``--local-ranks-filter 0,2`` shows only those local ranks on the console (files unaffected);
- ``--duplicate-stdout-filters a,b`` copies the teed stdout lines that contain ``a`` or ``b``, with
  their prefix, to ``attempt_<n>/filtered_stdout.log`` (one file for all ranks); stderr likewise.

Files: ``<log dir>/attempt_<n>/<local rank>/{stdout,stderr}.log`` next to the worker's ``error.json``.
One thread (``LogPump``) reads every worker pipe that needs copying, with a selector.
"""

from __future__ import annotations

import os
import selectors
import threading
from dataclasses import dataclass
from string import Template
from typing import Any, BinaryIO

from .errors import UsageError

__all__ = [
    "Std", "parse_std", "parse_ranks_filter", "parse_filters", "StreamPlan", "plan_stream", "line_prefix",
    "RankLogs", "Layout", "LogSettings", "attempt_dir", "LogPump",
]

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
    console: bool  # shown on the agent's console
    prefixed: bool  # shown with the rank's prefix (a teed stream), else verbatim
    file: str | None  # the log file it is written to


def _level(setting: dict[int, int] | int, local_rank: int) -> int:
    return setting.get(local_rank, Std.NONE) if isinstance(setting, dict) else setting


def plan_stream(
    local_rank: int, stream: int, redirects: dict[int, int] | int, tee: dict[int, int] | int,
    ranks_filter: frozenset[int] | None, path: str | None = None,
) -> StreamPlan:
    """Where one worker stream goes (torch's DefaultLogsSpecs). ``stream`` is STDOUT (1) or STDERR (2);
    ``path`` is its log file."""
    redirected = bool(_level(redirects, local_rank) & stream)
    teed = bool(_level(tee, local_rank) & stream)
    shown = ranks_filter is None or local_rank in ranks_filter
    file = path if (redirected or teed) else None
    if teed:
        return StreamPlan(console=shown, prefixed=True, file=file)
    return StreamPlan(console=shown and not redirected, prefixed=False, file=file)


def line_prefix(template: str | None, role: str, rank: int, local_rank: int) -> str:
    """The prefix of a teed worker's console lines: torch's ``[<role><local rank>]:``, or the template."""
    if template:
        return Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)
    return f"[{role}{local_rank}]:"


def parse_filters(value: str | None) -> tuple[str, ...]:
    """torchrun's comma-separated filter list; ``,,`` is a literal comma. Empty: no filter."""
    if not value:
        return ()
    marker = "\x00"
    return tuple(item.replace(marker, ",") for item in value.replace(",,", marker).split(","))


@dataclass(frozen=True)
class RankLogs:
    """One worker's output plan for one attempt."""

    stdout: StreamPlan
    stderr: StreamPlan
    error_file: str
    prefix: str


@dataclass(frozen=True)
class Layout:
    """One attempt's output plan: each local rank's, and the duplicate files (None: no filters)."""

    ranks: dict[int, RankLogs]
    filtered_stdout: str | None = None
    filtered_stderr: str | None = None
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogSettings:
    """elastic-run's output options for a node."""

    root: str  # per-job log directory; attempt_<n>/<local rank>/ under it
    redirects: dict[int, int] | int = Std.NONE
    tee: dict[int, int] | int = Std.NONE
    ranks_filter: frozenset[int] | None = None
    prefix_template: str | None = None  # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()
    custom: Any = None  # a LogsSpecs named by --logs-specs (launcher/logs_specs.py), else torch's default rules

    def layout(self, attempt: int, *, role: str, base_rank: int, nproc: int, run_id: str, restart_count: int) -> Layout:
        """Where each local rank's output goes in this attempt (directories made here)."""
        if self.custom is not None:
            from .logs_specs import custom_layout

            return custom_layout(self, attempt, role=role, base_rank=base_rank, nproc=nproc, run_id=run_id,
                                 restart_count=restart_count)
        ranks = {}
        for local_rank in range(nproc):
            directory = attempt_dir(self.root, attempt, local_rank)
            os.makedirs(directory, exist_ok=True)
            plans = [
                plan_stream(local_rank, which, self.redirects, self.tee, self.ranks_filter, os.path.join(directory, name))
                for which, name in ((STDOUT, "stdout.log"), (STDERR, "stderr.log"))
            ]
            ranks[local_rank] = RankLogs(
                plans[0], plans[1], os.path.join(directory, "error.json"),
                line_prefix(self.prefix_template, role, base_rank + local_rank, local_rank),
            )
        top = os.path.join(self.root, f"attempt_{attempt}")
        return Layout(
            ranks,
            os.path.join(top, "filtered_stdout.log") if self.stdout_filters else None,
            os.path.join(top, "filtered_stderr.log") if self.stderr_filters else None,
            self.stdout_filters, self.stderr_filters,
        )


def attempt_dir(root: str, attempt: int, local_rank: int) -> str:
    return os.path.join(root, f"attempt_{attempt}", str(local_rank))


class _Source:
    """One worker pipe: raw bytes to its log file; whole lines, prefixed, to the console and to the
    duplicate file when they contain one of its needles."""

    def __init__(self, fd: int, prefix: bytes, console: BinaryIO | None, file: BinaryIO | None,
                 duplicate: tuple[BinaryIO, tuple[bytes, ...]] | None = None) -> None:
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
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pending: list[_Source] = []
        self._sources: dict[int, _Source] = {}
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="log-pump", daemon=True)
        self._thread.start()

    def add(self, fd: int, prefix: str, console: BinaryIO | None, file: BinaryIO | None,
            duplicate: tuple[BinaryIO, tuple[str, ...]] | None = None) -> None:
        """Take over the read end ``fd`` of a worker pipe (it is closed at EOF). ``duplicate``: a file
        and the needles whose lines are copied to it."""
        dup = (duplicate[0], tuple(n.encode() for n in duplicate[1])) if duplicate else None
        with self._lock:
            self._pending.append(_Source(fd, prefix.encode(), console, file, dup))
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
        os.close(self._wake_r)
        os.close(self._wake_w)
