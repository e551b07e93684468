"""The hang case protocol: how the nodes of a round agree on one verdict through etcd.

Per round (keys: ``rendezvous.job.hangboard``): a node with a worker past its timeout opens case N
(created once: its opener decides); on seeing case N every node takes the stacks of its stopped
ranks and writes one report of its ranks, with what each is doing (``blame``), and their stacks
beside it; the decider waits for every node's report (at most ``COLLECT`` seconds), applies
``verdict.decide``, adds the stacks the verdict shows and writes it (created once); every node
acts on it alike and prints the same lines. If no verdict stands
``TAKE_OVER`` seconds after that, any node decides instead. A "not hung" verdict (the oldest rank is
in a phase within its timeout) holds suspicion off until that timeout ends. Nothing is written while
no node suspects a hang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from rendezvous.job.hangboard import HangBoard

from .blame import Frame, doing, excerpt
from .hangrules import FLOOR, RankReport
from .verdict import TIE, Verdict, decide, stacks_wanted

__all__ = ["CaseFollower", "LOOK", "COLLECT", "TAKE_OVER"]

LOOK = 1.0  # seconds a node waits for its stopped ranks' stacks (a SIGSTOPped process never answers)
COLLECT = LOOK + 2.0  # seconds the decider waits for every node's report: its look, then its write
TAKE_OVER = 5.0  # seconds after COLLECT with no verdict when any node decides instead


@dataclass
class _Case:
    number: int
    opened: float  # monotonic, here
    deciding: bool
    reported: bool = False


class CaseFollower:
    """One node's side of one round's cases; ``follow(now)`` returns a hang verdict once one stands."""

    def __init__(
        self,
        board: Callable[[], HangBoard],
        reports: Callable[[float], list[RankReport]],
        answer: Callable[[float], dict],
        look: Callable[[set[int]], dict[int, list[Frame]]],
        *,
        node: str,
        nodes: int,
        wall: Callable[[], float],
    ) -> None:
        """``board``: opens the round's board on first use; ``reports(now)``: this node's ranks now;
        ``answer(now)``: what this node answers an ask for its heartbeats (``elastic-ctl status``);
        ``look(ranks)``: the main-thread frames of those local ranks, from a fresh stack dump."""
        self._board_factory = board
        self._board: HangBoard | None = None
        self._reports = reports
        self._node, self._nodes = node, nodes
        self._wall = wall
        self._answer = answer
        self._look = look
        self._case: _Case | None = None
        self._last_case = 0
        self._hold_until: float | None = None

    def follow(self, now: float, judging: bool = True) -> Verdict | None:
        """One look: answer asks for heartbeats; while ``judging`` (a worker uses the API), follow the cases."""
        board = self._ensure_board()
        for event in board.poll():
            if event.kind == "ask":
                board.answer(event, self._answer(now))
                continue
            if not judging:
                continue
            if event.case <= self._last_case and event.kind == "suspect":
                continue
            if event.kind == "suspect" and (self._case is None or event.case > self._case.number):
                self._case = _Case(event.case, now, deciding=event.data.get("node") == self._node)
            elif event.kind == "verdict":
                verdict = _verdict(event.data)
                if verdict is not None and self._close_case(event.case, verdict):
                    return verdict
        if not judging:
            return None
        if self._case is None:
            self._maybe_open(now)
        if self._case is not None:
            return self._advance(self._case, now)
        return None

    def settled(self) -> Verdict | None:
        """The open case's hang verdict if one stands now, read directly: the round is ending (another
        node's restart request can arrive before the verdict's event) and this node must act on the
        verdict that caused it, not on a bare membership change."""
        if self._case is None:
            return None
        found = self._ensure_board().verdict(self._case.number)
        verdict = _verdict(found) if found is not None else None
        if verdict is not None and self._close_case(self._case.number, verdict):
            return verdict
        return None

    def _maybe_open(self, now: float) -> None:
        if self._hold_until is not None and self._wall() < self._hold_until:
            return
        if not any(r.overdue for r in self._reports(now)):
            return
        number = self._last_case + 1
        opened = self._ensure_board().suspect(number, {"at": self._wall()})
        self._case = _Case(number, now, deciding=opened)

    def _advance(self, case: _Case, now: float) -> Verdict | None:
        board = self._ensure_board()
        if not case.reported:
            reports, stacks = self._with_stacks(now)
            board.report(case.number, {"node": self._node, "ranks": [r.as_dict() for r in reports]}, stacks)
            case.reported = True
        waited = now - case.opened
        if not case.deciding and waited < COLLECT + TAKE_OVER:
            return None
        raw = board.reports(case.number)
        if len({r.get("node") for r in raw}) < self._nodes and waited < COLLECT:
            return None
        reports = _collect(raw)
        verdict = decide(reports)
        if verdict is None:  # no rank is judged any more (those past their script's code are set aside)
            self._case, self._last_case = None, max(self._last_case, case.number)
            return None
        if verdict.hung:
            verdict = replace(verdict, stacks=_shown_stacks(board, case.number, verdict, reports))
        standing = board.settle(case.number, verdict.as_dict())
        verdict = _verdict(standing) if standing is not None else verdict
        if verdict is not None and self._close_case(case.number, verdict):
            return verdict
        return None

    def _with_stacks(self, now: float) -> tuple[list[RankReport], dict[str, str]]:
        """This node's reports with what each stopped rank is doing, and those ranks' stack excerpts.
        The silences are read after the stacks: a stopped process makes the look wait seconds, and
        a rank that stopped just after its peer may be past its timeout by then."""
        began = self._wall()
        frames = self._look(_stopped(self._reports(now)))
        reports = self._reports(now + max(0.0, self._wall() - began))
        found = [replace(r, doing=doing(frames[r.rank])) if r.rank in frames else r for r in reports]
        return found, {str(rank): excerpt(f) for rank, f in frames.items() if f}

    def _close_case(self, number: int, verdict: Verdict) -> bool:
        """The case is decided: True when it is a hang (the agent acts), else suspicion holds off."""
        self._case, self._last_case = None, max(self._last_case, number)
        if verdict.hung:
            return True
        self._hold_until = verdict.hold_until
        return False

    def _ensure_board(self) -> HangBoard:
        if self._board is None:
            self._board = self._board_factory()
        return self._board

    def close(self) -> None:
        if self._board is not None:
            self._board.close()


def _stopped(reports: list[RankReport]) -> set[int]:
    """The local ranks to look at: stuck behind a hang (silent past half their timeout, or half the
    shortest learned one: another node's rank may wait for them), or tied with this node's oldest --
    every rank tied across the job is tied with its own node's oldest."""
    judged = [r for r in reports if r.judged]
    if not judged:
        return set()
    oldest = min(r.progress for r in judged)
    return {
        r.rank
        for r in judged
        if r.silent > min(r.timeout, FLOOR) / 2 or (r.last is not None and r.progress - oldest <= TIE)
    }


def _shown_stacks(
    board: HangBoard, case: int, verdict: Verdict, reports: list[RankReport]
) -> tuple[tuple[int, str], ...]:
    """The stack excerpts the verdict carries, read from the nodes that wrote them."""
    node_of = {r.rank: r.node for r in reports}
    by_node: dict[str, dict[str, str]] = {}
    shown = []
    for rank in stacks_wanted(verdict):
        node = node_of.get(rank)
        if node is None:
            continue
        if node not in by_node:
            by_node[node] = board.stacks(case, node)
        if by_node[node].get(str(rank)):
            shown.append((rank, by_node[node][str(rank)]))
    return tuple(shown)


def _collect(raw: list[dict]) -> list[RankReport]:
    """Every rank of the nodes' reports; an entry that is not ours is left out."""
    reports = []
    for node_report in raw:
        entries = node_report.get("ranks")
        for entry in entries if isinstance(entries, list) else []:
            try:
                reports.append(RankReport.from_dict(entry))
            except ValueError:
                continue
    return reports


def _verdict(data: dict) -> Verdict | None:
    try:
        return Verdict.from_dict(data)
    except ValueError:
        return None
