"""The Python stacks of a round's workers, asked for when a hang is decided: each worker registered
faulthandler on a signal of its own (``elastic.heartbeat``) and appends every thread's stack to a
file beside its heartbeat record (``record.stacks_path``). What the console and the history show of
them: the culprit's every thread, and one line for each local rank blocked behind it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .record import BeatReader, stacks_path
from .rules import RankReport, Verdict, blocked_at, main_thread

__all__ = ["StackDump", "dump_stacks", "report_hang"]


@dataclass(frozen=True)
class StackDump:
    rank: int
    text: str  # faulthandler's dump of every thread ("" when none came)


def dump_stacks(
    workers: Sequence[tuple[int, str, BeatReader]],
    ranks: set[int],
    wait: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> list[StackDump]:
    """Ask the given ranks (of ``workers``: rank, heartbeat record, its reader) for every thread's
    stack, on their registered signal; what each wrote within ``wait`` seconds."""
    asked = []
    for rank, record, reader in workers:
        beat = reader.read()
        if rank not in ranks or not beat.stack_signal or not beat.pid:
            continue
        path = stacks_path(record)
        size = os.path.getsize(path)
        try:
            os.kill(beat.pid, beat.stack_signal)
        except (ProcessLookupError, PermissionError):
            continue
        asked.append((rank, path, size))
    deadline = clock() + wait
    return [StackDump(rank, _read_settled(path, size, deadline, clock)) for rank, path, size in asked]


def report_hang(
    verdict: Verdict,
    node: str,
    reports: list[RankReport],
    dump: Callable[[set[int]], list[StackDump]],
    say: Callable[[str], None],
    record: Callable[..., None],
) -> None:
    """Before the group stops: the culprit's stacks (every thread) and the top frame of each local rank
    stuck behind it go to the console; the culprit's node records the hang in the job's history with
    the culprit's main-thread stack."""
    culprit = verdict.culprit
    here = culprit.node == node
    stuck = {r.rank for r in reports if r.judged and r.silent > r.timeout / 2}
    full = ({culprit.rank} if here else set()) | set(verdict.tied)
    short = ""
    for each in sorted(dump(full | stuck), key=lambda d: (d.rank not in full, d.rank)):
        if not each.text.strip():
            say(f"rank {each.rank}: no stack came (its process did not answer the dump signal)")
        elif each.rank in full:
            say(
                f"stacks of {'hung ' if each.rank == culprit.rank else ''}rank {each.rank} "
                f"(every thread, most recent call first):\n{each.text.rstrip()}"
            )
            if each.rank == culprit.rank:
                short = "\n".join(main_thread(each.text)[:12])
        else:
            say(f"rank {each.rank} is blocked at: {blocked_at(main_thread(each.text))}")
    if here:
        record(
            "worker_hung",
            rank=culprit.rank,
            silent=round(culprit.silent, 1),
            timeout=round(culprit.timeout, 1),
            phase=culprit.phase,
            blocked=verdict.blocked,
            tied=list(verdict.tied),
            stack=short,
        )


def _read_settled(path: str, offset: int, deadline: float, clock: Callable[[], float]) -> str:
    """What was appended to ``path`` after ``offset``, once it stopped growing (or at the deadline)."""
    seen, stable = -1, 0
    while clock() < deadline:
        size = os.path.getsize(path)
        stable = stable + 1 if size == seen and size > offset else 0
        if stable >= 2:
            break
        seen = size
        time.sleep(0.05)
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", "replace")
