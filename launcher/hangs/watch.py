"""The agent's hang watch over one round: reads its workers' heartbeat records each monitor tick,
agrees with the other nodes through etcd on which rank to blame (``rendezvous.job.hangboard``), and
dumps the hung ranks' Python stacks before the agent stops the group.

The case protocol, per round: a node with a worker past its timeout opens case N (created once;
the opener decides); on seeing case N every node writes one report of its ranks; the decider waits
for every node's report (at most ``COLLECT`` seconds), applies ``hangs.decide`` and writes the
verdict (created once). A hang verdict is acted on by every node alike. A "not hung" verdict (the
oldest rank is in a phase within its timeout) holds suspicion off until that timeout ends.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.workers.env import WorkerSpec
from rendezvous.errors import RendezvousError
from rendezvous.job.hangboard import HangBoard, HangChannel

from .record import BeatReader, stacks_path
from .rules import HangTimeouts, RankReport, RankWatch, Verdict, blocked_at, decide, main_thread

__all__ = ["HangWatch", "WatchedWorker", "StackDump", "watch_round", "COLLECT"]

COLLECT = 2.0  # seconds the decider waits for every node's report
TAKE_OVER = 5.0  # seconds after COLLECT with no verdict when any node decides instead
PUBLISH_EVERY = 5.0  # seconds between heartbeat summaries for elastic-ctl status (more for big jobs)


@dataclass(frozen=True)
class WatchedWorker:
    local_rank: int
    rank: int
    record: str  # its heartbeat record
    started: float  # monotonic


@dataclass(frozen=True)
class StackDump:
    rank: int
    text: str  # faulthandler's dump of every thread ("" when none came)


@dataclass
class _Case:
    number: int
    opened: float  # monotonic, here
    deciding: bool
    reported: bool = False


class HangWatch:
    """One round's watch; ``tick()`` from the agent's monitor loop returns a hang verdict once there is one."""

    def __init__(
        self,
        workers: Sequence[WatchedWorker],
        timeouts: HangTimeouts,
        board: Callable[[], HangBoard],
        *,
        node: str,
        nodes: int,
        judge_first: bool,
        publish: Callable[[dict], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._workers = list(workers)
        self._readers = [BeatReader(w.record) for w in self._workers]
        self._watches = [RankWatch(w.rank, w.started, timeouts, judge_first=judge_first) for w in self._workers]
        self._board_factory = board
        self._board: HangBoard | None = None
        self._node, self._nodes = node, nodes
        self._clock, self._wall = clock, wall
        self._case: _Case | None = None
        self._last_case = 0
        self._hold_until: float | None = None
        self.used = False  # a worker of this round called the API
        self._publish = publish
        self._published = 0.0
        self._every = max(PUBLISH_EVERY, nodes / 50)  # a big job's summaries stay under ~50 writes/s
        self._publisher: threading.Thread | None = None
        self._exited: set[int] = set()
        self._finishing = False

    # -- each tick --------------------------------------------------------------------------------
    def tick(
        self, exited: frozenset[int] = frozenset(), finishing: Callable[[], bool] = lambda: False
    ) -> Verdict | None:
        """``exited``: local ranks that exited 0 (no longer judged); ``finishing()``: a node of the
        round finished. Either means the job is past its last step: the long timeout applies."""
        now = self._clock()
        self._exited = {w.rank for w in self._workers if w.local_rank in exited}
        self._finishing = bool(exited) or (self.used and finishing())
        for reader, watch in zip(self._readers, self._watches):
            watch.feed(reader.read())
        if not self.used:
            self.used = any(w.beat is not None for w in self._watches)
            if not self.used and not any(w.judge_first for w in self._watches):
                return None  # nobody uses the API: nothing to judge, nothing written to etcd
        self._maybe_publish(now)
        try:
            return self._follow_cases(now)
        except RendezvousError:
            return None  # etcd away: the fence deals with that; look again next tick

    def reports(self, now: float | None = None) -> list[RankReport]:
        now = self._clock() if now is None else now
        wall = self._wall()
        return [
            w.report(self._node, now, wall, finishing=self._finishing)
            for w in self._watches
            if w.rank not in self._exited
        ]

    def _follow_cases(self, now: float) -> Verdict | None:
        board = self._ensure_board()
        for event in board.poll():
            if event.case <= self._last_case and event.kind == "suspect":
                continue
            if event.kind == "suspect" and (self._case is None or event.case > self._case.number):
                self._case = _Case(event.case, now, deciding=event.data.get("node") == self._node)
            elif event.kind == "verdict":
                verdict = self._verdict(event.data)
                if verdict is not None and self._close_case(event.case, verdict):
                    return verdict
        if self._case is None:
            self._maybe_open(now)
        if self._case is not None:
            return self._advance(self._case, now)
        return None

    def _maybe_open(self, now: float) -> None:
        if self._hold_until is not None and self._wall() < self._hold_until:
            return
        if not any(r.overdue for r in self.reports(now)):
            return
        number = self._last_case + 1
        opened = self._ensure_board().suspect(number, {"at": self._wall()})
        self._case = _Case(number, now, deciding=opened)

    def _advance(self, case: _Case, now: float) -> Verdict | None:
        board = self._ensure_board()
        if not case.reported:
            board.report(case.number, {"node": self._node, "ranks": [r.as_dict() for r in self.reports(now)]})
            case.reported = True
        waited = now - case.opened
        if not case.deciding and waited < COLLECT + TAKE_OVER:
            return None
        reports = self._collect(board.reports(case.number))
        if len({r.node for r in reports}) < self._nodes and waited < COLLECT:
            return None
        verdict = decide(reports)
        if verdict is None:
            return None
        standing = board.settle(case.number, verdict.as_dict())
        verdict = self._verdict(standing) if standing is not None else verdict
        if verdict is not None and self._close_case(case.number, verdict):
            return verdict
        return None

    def _close_case(self, number: int, verdict: Verdict) -> bool:
        """The case is decided: True when it is a hang (the agent acts), else suspicion holds off."""
        self._case, self._last_case = None, max(self._last_case, number)
        if verdict.hung:
            return True
        self._hold_until = verdict.hold_until
        return False

    @staticmethod
    def _collect(raw: list[dict]) -> list[RankReport]:
        reports = []
        for node_report in raw:
            entries = node_report.get("ranks")
            for entry in entries if isinstance(entries, list) else []:
                try:
                    reports.append(RankReport.from_dict(entry))
                except ValueError:
                    continue  # not ours: left out
        return reports

    @staticmethod
    def _verdict(data: dict) -> Verdict | None:
        try:
            return Verdict.from_dict(data)
        except ValueError:
            return None

    def _ensure_board(self) -> HangBoard:
        if self._board is None:
            self._board = self._board_factory()
        return self._board

    # -- heartbeat summary for elastic-ctl status ------------------------------------------------------
    def _maybe_publish(self, now: float) -> None:
        if self._publish is None or now - self._published < self._every:
            return
        if self._publisher is not None and self._publisher.is_alive():
            return  # the last one is still on its way (etcd slow): skip, never block the loop
        self._published = now
        beaten = [r for r in self.reports(now) if r.last is not None]
        if not beaten:
            return
        oldest = min(beaten, key=lambda r: r.last)
        summary = {
            "oldest": oldest.last,
            "rank": oldest.rank,
            "phase": oldest.phase,
            "timeout": oldest.as_dict()["timeout"],
        }
        self._publisher = threading.Thread(target=self._put_summary, args=(summary,), name="beats", daemon=True)
        self._publisher.start()

    def _put_summary(self, summary: dict) -> None:
        try:
            self._publish(summary)
        except RendezvousError:
            pass

    # -- stacks -------------------------------------------------------------------------------------
    def dump_stacks(self, ranks: set[int], wait: float = 2.0) -> list[StackDump]:
        """Ask the given local ranks for every thread's stack (faulthandler, on their registered
        signal); what each wrote within ``wait`` seconds."""
        asked = []
        for worker, reader in zip(self._workers, self._readers):
            beat = reader.read()
            if worker.rank not in ranks or not beat.stack_signal or not beat.pid:
                continue
            path = stacks_path(worker.record)
            size = os.path.getsize(path)
            try:
                os.kill(beat.pid, beat.stack_signal)
            except (ProcessLookupError, PermissionError):
                continue
            asked.append((worker.rank, path, size))
        deadline = self._clock() + wait
        dumps = []
        for rank, path, size in asked:
            text = _read_settled(path, size, deadline, self._clock)
            dumps.append(StackDump(rank, text))
        return dumps

    def report_hang(self, verdict: Verdict, say: Callable[[str], None], record: Callable[..., None]) -> None:
        """Before the group stops: the culprit's stacks (every thread) and the top frame of each
        local rank stuck behind it go to the console; the culprit's node records the hang in the
        job's history with the culprit's main-thread stack."""
        culprit = verdict.culprit
        here = culprit.node == self._node
        stuck = {r.rank for r in self.reports() if r.judged and r.silent > r.timeout / 2}
        full = ({culprit.rank} if here else set()) | set(verdict.tied)
        dumps = self.dump_stacks(full | stuck)
        short = ""
        for dump in sorted(dumps, key=lambda d: (d.rank not in full, d.rank)):
            if not dump.text.strip():
                say(f"rank {dump.rank}: no stack came (its process did not answer the dump signal)")
            elif dump.rank in full:
                say(
                    f"stacks of {'hung ' if dump.rank == culprit.rank else ''}rank {dump.rank} "
                    f"(every thread, most recent call first):\n{dump.text.rstrip()}"
                )
                if dump.rank == culprit.rank:
                    short = "\n".join(main_thread(dump.text)[:12])
            else:
                say(f"rank {dump.rank} is blocked at: {blocked_at(main_thread(dump.text))}")
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

    def close(self) -> None:
        if self._board is not None:
            self._board.close()
        for reader in self._readers:
            reader.close()


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


def watch_round(
    channel: HangChannel | None,
    specs: Sequence[WorkerSpec],
    timeouts: HangTimeouts,
    *,
    node: str,
    round_: int,
    lease_id: int,
    nodes: int,
    judge_first: bool,
) -> HangWatch | None:
    """The watch over a round's workers, just started (None: no etcd side, no watch)."""
    if channel is None:
        return None
    started = time.monotonic()
    workers = [WatchedWorker(s.local_rank, s.rank, s.heartbeat_file, started) for s in specs]
    return HangWatch(
        workers,
        timeouts,
        lambda: channel.board(round_, lease_id),
        node=node,
        nodes=nodes,
        judge_first=judge_first,
        publish=lambda summary: channel.publish(lease_id, summary),
    )
