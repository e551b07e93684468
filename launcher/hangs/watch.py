"""The agent's hang watch over one round: each monitor tick it reads its workers' heartbeat
records into the rules (``rules.RankWatch``), follows the round's hang cases (``cases``: the nodes
agree on one verdict through etcd), and, once a hang stands, reports it with the stacks (``stacks``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.workers.env import WorkerSpec
from rendezvous.errors import RendezvousError
from rendezvous.job.hangboard import HangBoard, HangChannel

from .cases import CaseFollower
from .record import BeatReader
from .rules import HangTimeouts, RankReport, RankWatch, Verdict
from .stacks import StackDump, dump_stacks, report_hang

__all__ = ["HangWatch", "WatchedWorker", "watch_round", "PUBLISH_EVERY"]

PUBLISH_EVERY = 5.0  # seconds between heartbeat summaries for elastic-ctl status (more for big jobs)


@dataclass(frozen=True)
class WatchedWorker:
    local_rank: int
    rank: int
    record: str  # its heartbeat record
    started: float  # monotonic


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
        self._node = node
        self._clock, self._wall = clock, wall
        self._cases = CaseFollower(board, self.reports, node=node, nodes=nodes, wall=wall)
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
            return self._cases.follow(now)
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
        """Every thread's stack of the given local ranks (what each wrote within ``wait`` seconds)."""
        workers = [(w.rank, w.record, r) for w, r in zip(self._workers, self._readers)]
        return dump_stacks(workers, ranks, wait, self._clock)

    def report_hang(self, verdict: Verdict, say: Callable[[str], None], record: Callable[..., None]) -> None:
        """The hang's lines and stacks on the console, and (on the culprit's node) its history record."""
        report_hang(verdict, self._node, self.reports(), self.dump_stacks, say, record)

    def close(self) -> None:
        self._cases.close()
        for reader in self._readers:
            reader.close()


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
