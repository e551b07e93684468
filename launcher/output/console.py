"""What the agent says: its own lines on stderr (``elastic-run: ...`` or JSON with ``--log-format
json``), the rendezvous progress line, and torch's console event records
(``--event-log-handler console``). Workers' lines never pass through here."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rendezvous.errors import RendezvousError
from rendezvous.job.history import Event
from rendezvous.rounds.join import Progress, RendezvousInfo

__all__ = [
    "say",
    "console_closed",
    "set_log_format",
    "progress_line",
    "round_line",
    "report_progress",
    "progress_lines",
    "should_say",
    "console_event",
    "PROGRESS_EVERY",
]

LOG_FORMATS = ("text", "json")
PROGRESS_EVERY = 10.0  # seconds between progress lines while nothing changes


class _Console:
    """The process's one console: the format its lines take."""

    def __init__(self) -> None:
        self.format = "text"


_console = _Console()


def set_log_format(name: str) -> None:
    """``text``: ``elastic-run: ...`` lines; ``json``: one JSON object a message, for log shippers."""
    if name not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {name!r}")
    _console.format = name


def say(message: str, level: str = "info") -> None:
    """Print an agent message on stderr: each line prefixed ``elastic-run:``, or one JSON object
    (``{"time", "level", "source", "message"}``) with ``--log-format json``. Workers' lines are not touched."""
    if _console.format == "json":
        record = {"time": round(time.time(), 3), "level": level, "source": "elastic-run", "message": message}
        text = json.dumps(record) + "\n"
    else:
        text = "".join(f"elastic-run: {line}\n" for line in message.splitlines() or [""])
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        console_closed()


def console_closed() -> None:
    """The console went away (``elastic-run ... | head -1``, a closed terminal): what the agent says
    from now on goes nowhere, and what it does and records, and its exit code, stay as they were."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            pass
    os.close(devnull)


def round_line(info: RendezvousInfo, nproc: int) -> str:
    """``round 2: group rank 0 of 2 nodes, global ranks 0..1 of 4, master 10.0.0.1:29500``."""
    last = info.base_global_rank + nproc - 1
    return (
        f"round {info.round}: group rank {info.group_rank} of {info.group_world_size} nodes, global ranks "
        f"{info.base_global_rank}..{last} of {info.world_size}, master {info.master_addr}:{info.master_port}"
    )


def progress_line(progress: Progress) -> str:
    """``round 1: 2/4 nodes joined (min 3, max 4), last call in 4 s``"""
    if progress.running is not None:
        waiting = _silent_text(progress) if progress.silent else "the coordinator" if progress.stayer else "a place"
        return (
            f"round {progress.round}: waiting for {waiting}; round {progress.round - 1} "
            f"{'ran' if progress.stayer else 'runs'} with {progress.running}/{progress.max_nodes} nodes "
            f"(min {progress.min_nodes}, max {progress.max_nodes})"
        )
    line = (
        f"round {progress.round}: {progress.nodes_joined}/{progress.max_nodes} nodes joined "
        f"(min {progress.min_nodes}, max {progress.max_nodes})"
    )
    if progress.silent:
        line += ", waiting for " + _silent_text(progress)
    stopping = [node for node in progress.stopping if node not in progress.silent_nodes]
    if stopping:
        line += f", waiting for {', '.join(stopping)} to stop the workers of the round before"
    elif progress.last_call_in is not None:
        line += f", last call in {progress.last_call_in:.0f} s"
    elif progress.nodes_joined < progress.min_nodes:
        line += f", waiting for {progress.min_nodes - progress.nodes_joined} more"
        if progress.timeout_in is not None:
            line += f", join timeout in {progress.timeout_in:.0f} s"
    return line


def _silent_text(progress: Progress) -> str:
    """``n3 (silent: its lease runs out in 12 s)``, for each node the round waits for in vain."""
    role = {progress.coordinator: "the coordinator, "} if progress.coordinator else {}
    return ", ".join(
        f"{node} ({role.get(node, '')}silent: its lease runs out in {left:.0f} s)" for node, left in progress.silent
    )


def console_event(event: Event) -> None:
    """One event as torch's console event handler prints it: a JSON object on stderr."""
    record = {
        "name": f"elastic.{event.kind}",
        "source": "AGENT",
        "timestamp": int(event.time * 1000),
        "metadata": {"run_round": event.round, "node": event.node, **event.details},
    }
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()


def report_progress(
    progress: Callable[[], Progress | None], report: Callable[[str], None], done: threading.Event
) -> None:
    """A progress line while nodes are missing (until ``done``): when the count of nodes changes or
    the last call begins, else every ``PROGRESS_EVERY`` seconds (looks at etcd once a second)."""
    shown: tuple | None = None
    said_at = -math.inf
    while not done.wait(1.0):
        try:
            now = progress()
        except RendezvousError:
            continue
        full = now is not None and now.nodes_joined >= now.max_nodes and not now.stopping
        if now is None or full or done.is_set():
            continue
        if should_say(now, shown, time.monotonic() - said_at):
            report(progress_line(now))
            shown, said_at = now.key, time.monotonic()


@contextmanager
def progress_lines(progress: Callable[[], Progress | None], report: Callable[[str], None]) -> Iterator[None]:
    """``report_progress`` on a thread of its own while the block runs (a node joining a round)."""
    done = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(progress, report, done), name="progress", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join(timeout=2)


def should_say(now: Progress, shown: tuple | None, since: float) -> bool:
    """Pure: a new progress line when the count of nodes changed, the last call began, the nodes
    waited for changed, or ``PROGRESS_EVERY`` seconds passed since the last line (``shown``: the
    ``Progress.key`` of the last line)."""
    return shown != now.key or since >= PROGRESS_EVERY
