"""The Python stacks of a round's workers, taken when a hang is suspected: each worker registered
faulthandler on a signal of its own (``elastic.heartbeat``) and appends every thread's stack to a
file beside its heartbeat record (``beatfile.stacks_path``). They decide ties (``blame``); what the
console and the history show of them: the verdict's lines and stacks, the same on every node, one
line for each local rank blocked behind the culprit, and the culprit's other threads on its node."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from rendezvous.job.history import Kind

from .beatfile import BeatReader, stacks_path
from .blame import blocked_at, excerpt, main_frames, main_thread_of, parse_threads
from .hangrules import RankReport
from .procstat import is_stopped
from .verdict import Verdict

__all__ = ["dump_stacks", "report_hang"]


def dump_stacks(
    workers: Sequence[tuple[int, str, BeatReader]],
    ranks: set[int],
    wait: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> dict[int, str]:
    """Ask the given ranks (of ``workers``: rank, heartbeat record, its reader) for every thread's
    stack, on their registered signal; what each wrote within ``wait`` seconds, by rank ("": nothing
    came). faulthandler writes from its signal handler, without waiting for the interpreter; a
    stopped process (SIGSTOP, a tracer's stop) cannot, and is not waited for."""
    asked, stopped = [], {}
    for rank, record, reader in workers:
        beat = reader.read()
        if rank not in ranks or not beat.stack_signal or not beat.pid:
            continue
        if is_stopped(beat.pid):
            stopped[rank] = ""
            continue
        path = stacks_path(record)
        size = os.path.getsize(path)
        try:
            os.kill(beat.pid, beat.stack_signal)
        except (ProcessLookupError, PermissionError):
            continue
        asked.append((rank, path, size))
    deadline = clock() + wait
    return stopped | {rank: _read_settled(path, size, deadline, clock) for rank, path, size in asked}


def report_hang(
    verdict: Verdict,
    node: str,
    reports: list[RankReport],
    dumps: dict[int, str],
    say: Callable[[str], None],
    record: Callable[..., None],
) -> None:
    """Before the group stops: the verdict's lines (the same on every node: the culprit, why, its
    stack); then what is local -- where each rank of this node stuck behind it blocks, and on the
    culprit's node its other threads; the culprit's node records the hang in the job's history."""
    for line in verdict.lines():
        say(line)
    shown = {rank for rank, _ in verdict.stacks}
    here = verdict.culprit.node == node
    for report in sorted(reports, key=lambda r: r.rank):
        text = dumps.get(report.rank, "")
        if report.rank in shown or not text.strip() or not report.stalled:
            continue
        say(f"rank {report.rank} is blocked at: {blocked_at(main_frames(text))}")
    threads = parse_threads(dumps.get(verdict.culprit.rank, "")) if here else []
    if len(threads) > 1:
        main = main_thread_of(threads)
        others = [t for t in threads if t is not main]
        say(
            f"other threads of rank {verdict.culprit.rank} ({len(others)}, most recent call first):\n"
            + "\n\n".join(excerpt(t) for t in others)
        )
    if here:
        record(Kind.WORKER_HUNG, **verdict.record())


def _read_settled(path: str, offset: int, deadline: float, clock: Callable[[], float]) -> str:
    """What was appended to ``path`` after ``offset``, once it stopped growing (or at the deadline)."""
    seen, stable = -1, 0
    while clock() < deadline:
        size = os.path.getsize(path)
        stable = stable + 1 if size == seen and size > offset else 0
        if stable >= 3:
            break
        seen = size
        time.sleep(0.01)
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", "replace")
