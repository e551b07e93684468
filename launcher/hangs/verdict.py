"""Which rank of the job to blame for a hang, and the lines every node prints (pure).

When one rank hangs, its peers block in the next collective and fall silent a moment later, on
every node. So the rank to blame is the one whose last sign of progress is the oldest across the
job; it is a hang only if it is past its own timeout -- a peer silent behind a rank in a long
checkpoint phase is not. When the oldest heartbeats are within ``TIE`` of each other (every rank
beat right after the same collective), their stacks decide (``blame``): the rank outside any
torch.distributed call is the one the others wait for; if every one of them waits in such a call,
nobody is late -- a deadlock, or ranks in different collectives -- and the verdict says so, naming
each call.

The verdict is written once to etcd and acted on by every node alike, with the culprit's stack
excerpt, so every node prints the same lines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .blame import ELSEWHERE, MAYBE_WAITING, UNKNOWN, WAITING, Doing
from .hangrules import RankReport, seconds

__all__ = ["Verdict", "decide", "ranks_text", "TIE", "SHOWN_STACKS", "SHOWN_CALLS"]

TIE = 0.05  # seconds: ranks whose last heartbeats are this close stopped "together"
SHOWN_STACKS = 3  # a deadlock's verdict carries the stacks of at most this many ranks
SHOWN_CALLS = 8  # ... and at most this many distinct calls
_SCORE = {ELSEWHERE: 0, UNKNOWN: 0, MAYBE_WAITING: 1, WAITING: 2}  # lower: more likely the one waited for
_NO_STACK = Doing(UNKNOWN, "", "")


@dataclass(frozen=True)
class Verdict:
    """What the job decided about a suspected hang."""

    hung: bool
    culprit: RankReport  # in a deadlock: the first of the ranks in it
    blocked: int  # other ranks silent for more than half their timeout: stuck behind it
    tied: tuple[int, ...]  # other ranks whose last heartbeat is within TIE of the culprit's
    hold_until: float | None = None  # not hung: the wall time the culprit's own timeout ends
    deadlock: bool = False  # every rank that stopped together waits in a torch.distributed call
    calls: tuple[tuple[str, str], ...] = ()  # tied: (ranks, what they do), as ``blame.Doing.said``
    stacks: tuple[tuple[int, str], ...] = ()  # (rank, its main thread's excerpt), the culprit's first
    waiters: tuple[int, ...] = ()  # ranks that beat before the culprit, then waited for it in a collective

    @property
    def culprit_label(self) -> str:
        """The metrics' label: the culprit's rank, or "deadlock"."""
        return "deadlock" if self.deadlock else str(self.culprit.rank)

    def what(self) -> str:
        """The verdict in a few words, for the restart line that follows its lines."""
        if self.deadlock:
            return f"ranks {ranks_text((self.culprit.rank, *self.tied))} hung in a deadlock"
        return f"rank {self.culprit.rank} on node {self.culprit.node} hung"

    def line(self) -> str:
        """``rank 1 on node n-b hung: no heartbeat for 61 s (last in phase "step", ...)``."""
        c = self.culprit
        silence = f"{'no first heartbeat' if c.last is None else 'no heartbeat'} for {seconds(c.silent)}"
        if c.last is None:
            silence += " since it started"
        if self.deadlock:
            everyone = ranks_text((c.rank, *self.tied))
            return (
                f"ranks {everyone} hung in a deadlock: {silence} (timeout {seconds(c.timeout)}), and each "
                f"waits in a torch.distributed call{self._mismatch()}: {self._calls()}"
            )
        details = [f'last in phase "{c.phase}"', f"timeout {seconds(c.timeout)}"]
        if self.blocked:
            details.append(f"{self.blocked} rank{'s' if self.blocked > 1 else ''} blocked behind it")
        if self.tied:
            details.append(self._why_of_tie())
        if self.waiters:
            details.append(self._why_of_waiters())
        return f"rank {c.rank} on node {c.node} hung: {silence} ({'; '.join(details)})"

    def lines(self) -> list[str]:
        """The verdict's line, then each stack it carries: what every node prints."""
        shown = [self.line()]
        for rank, text in self.stacks:
            shown.append(f"stack of rank {rank} (main thread, most recent call first):\n{text}")
        if not self.stacks and self.hung:
            shown.append(f"rank {self.culprit.rank}: no stack came (its process did not answer the dump signal)")
        return shown

    def _why_of_tie(self) -> str:
        others = ranks_text(self.tied)
        plural = len(self.tied) > 1
        stopped = f"rank{'s' if plural else ''} {others} stopped within {TIE * 1000:.0f} ms of it"
        if self.waiters:
            return stopped  # the waiters' line shows the calls
        if all(said == _NO_STACK.said() for _, said in self.calls):
            return f"{stopped} and no stack came to tell which one the others wait for"
        return f"{stopped}; by the stacks, it is the one the others wait for: {self._calls()}"

    def _why_of_waiters(self) -> str:
        plural = len(self.waiters) > 1
        who = f"rank{'s' if plural else ''} {ranks_text(self.waiters)}"
        return f"{who} beat earlier, but {'they wait' if plural else 'it waits'} for it: {self._calls()}"

    def _calls(self) -> str:
        return "; ".join(f"rank{'' if ranks.isdigit() else 's'} {ranks} {said}" for ranks, said in self.calls)

    def _mismatch(self) -> str:
        kinds = {said.split(" at ")[0] for _, said in self.calls}
        return " -- different calls, so ranks that called different collectives" if len(kinds) > 1 else ""

    def record(self) -> dict:
        """The ``worker_hung`` history record's details."""
        c = self.culprit
        return {
            "rank": c.rank,
            "node": c.node,
            "silent": round(c.silent, 1),
            "timeout": round(c.timeout, 1),
            "phase": c.phase,
            "blocked": self.blocked,
            "tied": ranks_text(self.tied),
            "waiters": ranks_text(self.waiters),
            "deadlock": self.deadlock,
            "why": self.line(),
            "stack": "\n\n".join(text for _, text in self.stacks[:1]),
        }

    def as_dict(self) -> dict:
        return {
            "hung": self.hung,
            "culprit": self.culprit.as_dict(),
            "blocked": self.blocked,
            "tied": list(self.tied),
            "hold_until": self.hold_until,
            "deadlock": self.deadlock,
            "calls": [list(pair) for pair in self.calls],
            "stacks": [list(pair) for pair in self.stacks],
            "waiters": list(self.waiters),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        """Validated (it is read from etcd); ValueError names what is wrong."""
        try:
            return cls(
                bool(data["hung"]),
                RankReport.from_dict(data["culprit"]),
                int(data["blocked"]),
                tuple(int(r) for r in data["tied"]),
                None if data["hold_until"] is None else float(data["hold_until"]),
                bool(data.get("deadlock", False)),
                tuple((_text(r, 4096), _text(s, 1024)) for r, s in data.get("calls", ())[:SHOWN_CALLS]),
                tuple((int(r), _text(s, 8192)) for r, s in data.get("stacks", ())[:SHOWN_STACKS]),
                tuple(int(r) for r in data.get("waiters", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a hang verdict is malformed ({exc!r})") from None


def decide(reports: list[RankReport]) -> Verdict | None:
    """Blame the judged rank whose last sign of progress is the oldest -- or, among ranks that stopped
    within TIE of it, the one the others wait for; or, when that rank waits in a collective, the
    stalled rank that does not (it stopped a little later, and the oldest waits for it). None when
    no rank is judged."""
    judged = [r for r in reports if r.judged]
    if not judged:
        return None
    oldest = min(judged, key=lambda r: (r.progress, r.rank))
    beaten = [r for r in judged if r.last is not None and oldest.last is not None]
    together = [r for r in beaten if r.progress - oldest.progress <= TIE]
    culprit, deadlock = _break_tie(together) if len(together) > 1 else (oldest, False)
    awaited = [] if deadlock else _awaited(culprit, judged)
    waiters: list[RankReport] = []
    if awaited:
        waiters = [r for r in together if (r.doing or _NO_STACK).waits]
        culprit = min(awaited, key=lambda r: (r.progress, r.rank))
        together = [r for r in awaited if r.progress - culprit.progress <= TIE]
    tied = tuple(sorted(r.rank for r in together if r is not culprit))
    blocked = sum(1 for r in judged if r is not culprit and r.stalled)
    shown = [*waiters, *together]
    calls = _calls(shown) if len(shown) > 1 else ()
    verdict = Verdict(
        False, culprit, blocked, tied, deadlock=deadlock, calls=calls, waiters=tuple(sorted(r.rank for r in waiters))
    )
    if culprit.overdue or (deadlock and any(r.overdue for r in together)):
        return replace(verdict, hung=True)
    return replace(verdict, hold_until=culprit.progress + culprit.timeout)


def stacks_wanted(verdict: Verdict) -> list[int]:
    """The ranks whose stacks the verdict should carry: the culprit, or the first ranks of a deadlock."""
    if not verdict.deadlock:
        return [verdict.culprit.rank]
    return sorted((verdict.culprit.rank, *verdict.tied))[:SHOWN_STACKS]


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    """``0-3, 5, 7, 8``: ranks, with runs of three or more written as ranges."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(f"{a}-{b}" if b - a >= 2 else ", ".join(map(str, range(a, b + 1))) for a, b in runs)


def _break_tie(together: list[RankReport]) -> tuple[RankReport, bool]:
    """The rank the others wait for (the least surely waiting, then the oldest), and whether it is a
    deadlock: every one of them surely waits, or all of them are in calls that may wait (backward)."""
    score = {r.rank: _SCORE[(r.doing or _NO_STACK).kind] for r in together}
    least = min(score.values())
    culprit = min((r for r in together if score[r.rank] == least), key=lambda r: (r.progress, r.rank))
    return culprit, least == _SCORE[WAITING] or (least > 0 and len(set(score.values())) == 1)


def _awaited(culprit: RankReport, judged: list[RankReport]) -> list[RankReport]:
    """When the rank with the oldest heartbeat waits for its peers (its stack is in a collective, or
    in backward), the ranks silent past half its timeout (or their own) whose stacks are not in
    one (learned timeouts differ from rank to rank): the one it waits for beat a little later
    and then stopped outside any collective (a rank SIGSTOPped, or one that beat just before
    hanging in its data loader while its peer was already on its way into the collective)."""
    if culprit.doing is None or not culprit.doing.waits:
        return []
    return [
        r
        for r in judged
        if r is not culprit
        and r.silent > min(r.timeout, culprit.timeout) / 2  # stalled, by its timeout or the waiter's
        and r.doing is not None
        and not r.doing.waits
    ]


def _calls(together: list[RankReport]) -> tuple[tuple[str, str], ...]:
    """What the ranks that stopped together are doing, grouped by what: (ranks, what), at most SHOWN_CALLS."""
    groups: dict[str, list[int]] = {}
    for r in sorted(together, key=lambda r: r.rank):
        groups.setdefault((r.doing or _NO_STACK).said(), []).append(r.rank)
    ordered = sorted(groups.items(), key=lambda item: item[1][0])
    return tuple((ranks_text(ranks), said) for said, ranks in ordered[:SHOWN_CALLS])


def _text(value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not text")
    return value[:limit]
