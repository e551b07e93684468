"""The agent's hang watch over one round: each monitor tick it reads its workers' heartbeat
records into the rules (``hangrules.RankWatch``), follows the round's hang cases (``cases``: the nodes
agree on one verdict through etcd), and, once a hang stands, reports it with the stacks (``stacks``).
"""

from __future__ import annotations

import linecache
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from launcher.hangs.steptimes import StepTimes
from rendezvous.errors import RendezvousError
from rendezvous.job.hangboard import HangBoard, HangChannel

from .beatfile import BeatReader
from .blame import Frame, at_top_level, main_frames, with_source
from .cases import LOOK, CaseFollower
from .hangrules import HangTimeouts, RankReport, RankWatch
from .native import left_script, native_stack
from .procstat import Idleness, Starvation
from .stacks import dump_stacks, report_hang
from .verdict import Verdict

__all__ = ["RoundWork", "HangWatch", "WatchedWorker", "watch_round"]


@dataclass(frozen=True)
class RoundWork:
    """What a round's local workers did, as their heartbeat records tell it (``HangWatch.work``): read by
    the crash-loop breaker (``beats``), the round's length (``first``) and the ``round_ended`` record."""

    first: float | None = None  # when every local worker that beat had beaten once (monotonic; None: none beat)
    last: float | None = None  # the last heartbeat
    beats: int = 0  # the most heartbeats one local worker beat
    healthy: float | None = None  # their plain steps' mean without their stalls (``StepTimes.healthy``)
    own: float = 0.0  # the most seconds of own work one local worker timed (``elastic.section``, ``watch_ddp``)

    def marks(self) -> dict[str, float | int | None]:
        """``RoundMarks``' fields of the workers' doing, by name."""
        return {"first": self.first, "last": self.last, "steps": self.beats, "healthy": self.healthy, "own": self.own}


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
        starvation: Starvation | None = None,
        idleness: Idleness | None = None,
        past_script: Callable[[int], bool] = lambda local_rank: False,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``past_script(local_rank)``: whether that worker's native stack is past its script's code
        (``native.left_script``), asked of a rank whose Python stack is at a module's top level."""
        self._workers = list(workers)
        self._past_script = past_script
        self._past: dict[int, int] = {}  # ranks past their script's code: their heartbeats then (``note_stacks``)
        self._starvation, self._idleness = starvation, idleness
        self._readers = [BeatReader(w.record) for w in self._workers]
        self._watches = [RankWatch(w.rank, w.started, timeouts, judge_first=judge_first) for w in self._workers]
        self._node = node
        self._clock, self._wall = clock, wall
        self._cases = CaseFollower(board, self.reports, self.summary, self.look, node=node, nodes=nodes, wall=wall)
        self.used = False  # a worker of this round called the API
        self._exited: set[int] = set()
        self._finishing = False
        self.tail = 0.0  # the longest a local worker took from its last heartbeat to its exit 0
        self._dumps: dict[int, str] = {}  # the last stacks taken, by rank

    # -- each tick --------------------------------------------------------------------------------
    def tick(
        self, exited: frozenset[int] = frozenset(), finishing: Callable[[], bool] = lambda: False
    ) -> Verdict | None:
        """``exited``: local ranks that exited 0 (no longer judged); ``finishing()``: a node of the
        round finished. Either means the job is past its last step: the long timeout applies."""
        now = self._clock()
        self._read()
        if self._starvation is not None:
            credits = self._starvation.since_last_look([w.local_rank for w in self._workers])
            for worker, watch in zip(self._workers, self._watches):
                watch.starve(credits.get(worker.local_rank, 0.0))
        for worker, watch in zip(self._workers, self._watches):
            if worker.local_rank in exited and worker.rank not in self._exited and watch.beat is not None:
                self.tail = max(self.tail, now - watch.beat.last)
        self._exited = {w.rank for w in self._workers if w.local_rank in exited}
        self._finishing = bool(exited) or bool(self._past) or (self.used and finishing())
        self._listen(now)
        if not self.used:
            self.used = any(w.beat is not None for w in self._watches)
        judging = self.used or any(w.judge_first for w in self._watches)  # else: nothing to judge
        try:
            return self._cases.follow(now, judging)
        except RendezvousError:
            return None  # etcd away: the fence deals with that; look again next tick
        finally:
            if self._starvation is not None:
                self._starvation.looked()

    def _listen(self, now: float) -> None:
        """How long each silent worker's processes have done nothing (not read past the last step)."""
        if self._idleness is None:
            return
        for worker, watch in zip(self._workers, self._watches):
            silent = 0.0 if self._finishing else watch.silence(now)
            watch.idle(self._idleness.idle_for(worker.local_rank, silent))

    def settled(self) -> Verdict | None:
        """A hang verdict of the open case that stands now (the round is ending for another reason)."""
        try:
            return self._cases.settled()
        except RendezvousError:
            return None

    def most_beats(self) -> int:
        """The most heartbeats one local worker beat this round (each round's record starts at 0),
        read now: a worker that failed may have beaten after the last tick looked."""
        self._read()
        return max((w.beat.count for w in self._watches if w.beat is not None), default=0)

    def _read(self) -> None:
        """Each worker's heartbeat record, read now; a rank set aside that beats again is back."""
        for reader, watch in zip(self._readers, self._watches):
            watch.feed(reader.read())
        self._past = {r: n for r, n in self._past.items() if self._beats(r) == n}

    def work(self) -> RoundWork:
        """What the local workers did this round, read now (``most_beats``)."""
        beats = self.most_beats()
        firsts = [w.first for w in self._watches if w.first is not None]
        lasts = [w.beat.last for w in self._watches if w.beat is not None]
        healthy = StepTimes.combined(w.times for w in self._watches).healthy()
        own = max((w.beat.work for w in self._watches if w.beat is not None), default=0.0)
        return RoundWork(max(firsts) if firsts else None, max(lasts) if lasts else None, beats, healthy, own)

    def reports(self, now: float | None = None) -> list[RankReport]:
        now = self._clock() if now is None else now
        wall = self._wall()
        return [
            w.report(self._node, now, wall, finishing=self._finishing, tail=self.tail)
            for w in self._watches
            if w.rank not in self._exited and w.rank not in self._past
        ]

    def summary(self, now: float) -> dict:
        """This node's answer to ``elastic-ctl status``: its oldest last heartbeat (none: no worker beat)."""
        beaten = [r for r in self.reports(now) if r.last is not None]
        if not beaten:
            return {"node": self._node}
        oldest = min(beaten, key=lambda r: r.last)
        return {
            "node": self._node,
            "oldest": oldest.last,
            "rank": oldest.rank,
            "phase": oldest.phase,
            "timeout": oldest.as_dict()["timeout"],
        }

    # -- stacks -------------------------------------------------------------------------------------
    def look(self, ranks: set[int], wait: float = LOOK) -> dict[int, list[Frame]]:
        """The main-thread frames (with their source lines) of the given local ranks, from a fresh
        dump of every thread's stack (what each wrote within ``wait`` seconds; [] when none came)."""
        workers = [(w.rank, w.record, r) for w, r in zip(self._workers, self._readers)]
        self._dumps.update(dump_stacks(workers, ranks, wait, self._clock))
        if self._idleness is not None:  # writing its stacks is not a sign of life
            self._idleness.excuse([w.local_rank for w in self._workers if w.rank in ranks])
        frames = {rank: with_source(main_frames(self._dumps.get(rank, "")), linecache.getline) for rank in ranks}
        self.note_stacks(frames)
        return frames

    def note_stacks(self, frames: dict[int, list[Frame]]) -> None:
        """Ranks whose main thread is past their script's code -- freeing ``main()``'s locals at the
        module's top level, by their Python stack and then their native one -- are set aside as if they
        had exited 0: their training is done, and a rank stuck there is the exit watch's to judge
        (``exitstuck``), never a hang to restart for. Their peers are past their last step too."""
        local_of = {w.rank: w.local_rank for w in self._workers}
        for rank, main in frames.items():
            aside = rank in local_of and rank not in self._past and at_top_level(main)
            if aside and self._past_script(local_of[rank]):
                self._past[rank] = self._beats(rank)
                self._finishing = True

    def _beats(self, rank: int) -> int:
        watch = next(w for w in self._watches if w.rank == rank)
        return watch.beat.count if watch.beat is not None else 0

    def report_hang(self, verdict: Verdict, say: Callable[[str], None], record: Callable[..., None]) -> None:
        """The verdict's lines on the console, what is local, and (on the culprit's node) its history record."""
        reports = self.reports()
        stuck = {r.rank for r in reports if r.stalled} - set(self._dumps)
        if verdict.culprit.node == self._node and verdict.culprit.rank not in self._dumps:
            stuck.add(verdict.culprit.rank)
        if stuck:  # this node took no stacks for the case (the verdict came before it reported)
            self.look(stuck)
        report_hang(verdict, self._node, reports, self._dumps, say, record)

    def close(self) -> None:
        self._cases.close()
        for reader in self._readers:
            reader.close()


class Watched(Protocol):
    """What the watch needs of a worker's spec (``launcher.workers.env.WorkerSpec``)."""

    local_rank: int
    rank: int
    heartbeat_file: str


def watch_round(
    channel: HangChannel | None,
    specs: Sequence[Watched],
    timeouts: HangTimeouts,
    *,
    node: str,
    round_: int,
    lease_id: int,
    nodes: int,
    judge_first: bool,
    pid_of: Callable[[int], int | None],
    interval: float,
) -> HangWatch | None:
    """The watch over a round's workers, just started (None: no etcd side, no watch). ``pid_of``: a
    local rank's worker process; ``interval``: how often the agent's loop looks."""
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
        starvation=Starvation(pid_of, interval, time.monotonic),
        idleness=Idleness(pid_of, time.monotonic),
        past_script=lambda local_rank: _past_script(pid_of(local_rank)),
    )


def _past_script(pid: int | None) -> bool:
    return pid is not None and left_script(*native_stack(pid))
