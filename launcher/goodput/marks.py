"""What a node measured of one round of its workers, as the ``round_ended`` history record: the
round's coordinator writes it, and group rank 1 too (the account takes the lowest rank's, so the
record survives one of the two machines dying). A few hundred bytes a round, written once, when the
round's workers are stopped.

Times are seconds from the workers' start (the record's own time is when it was written, once the
workers were stopped): ``ran`` to the round's end, ``stop`` from there to the workers gone,
``first_exit`` when the first local worker exited 0 (a round that ended with its workers' success;
the account's end of training for workers that call no ``elastic.heartbeat()``),
``first_step``/``last_step`` the first and last heartbeat (every local worker had beaten once by the
first), ``steps`` the most heartbeats a local worker beat, ``healthy_step`` the mean of their steps
without its stalls (``launcher.hangs.steptimes``; absent before a third heartbeat; an older
agent wrote ``median_step``, the median, instead), ``saved`` the newest
``elastic.checkpoint`` save made in the round and ``step`` the newest step saved so far (-1: none
ever); ``kept`` when the workers run under ``elastic.inprocess`` (a fault's survivors keep their
process and their steps).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoundMarks", "WRITERS", "round_details"]

WRITERS = 2  # group ranks 0 and 1 record their round


@dataclass(frozen=True)
class RoundMarks:
    """One round on one node, on the agent's monotonic clock (``started`` the workers' start)."""

    started: float
    ended: float  # the round ended here: the workers are told to stop
    stopped: float  # the workers are gone
    first: float | None = None  # first heartbeat of every local worker (None: none beat)
    last: float | None = None  # last heartbeat
    steps: int = 0
    healthy: float | None = None  # its plain steps' mean without its stalls (the round's healthy step)
    own: float = 0.0  # the most seconds of own work one local worker timed (0.0: none timed)
    save: tuple[int, float] | None = None  # the newest save: (step, seconds since the epoch)
    kept: bool = False  # the workers run under elastic.inprocess: a fault's survivors keep their steps
    exited: float | None = None  # the first local worker's exit 0 (None: none exited 0)


def round_details(marks: RoundMarks, *, outcome: str, group_rank: int, now_wall: float, now: float) -> dict:
    """The ``round_ended`` record's details; ``now_wall``/``now``: the same instant on the wall
    clock and the monotonic one (a save's time is a file's, on the wall clock)."""
    started_wall = now_wall - (now - marks.started)
    details = {
        "outcome": outcome,
        "group_rank": group_rank,
        "ran": _s(marks.ended - marks.started),
        "stop": _s(marks.stopped - marks.ended),
        "steps": marks.steps,
        "step": marks.save[0] if marks.save is not None else -1,
    }
    if marks.healthy is not None:
        details["healthy_step"] = round(marks.healthy, 6)
    if marks.own > 0.0:
        details["own_work"] = _s(marks.own)
    if marks.first is not None:
        details["first_step"] = _s(max(marks.first - marks.started, 0.0))
    if marks.last is not None:
        details["last_step"] = _s(max(marks.last - marks.started, 0.0))
    if marks.save is not None and marks.save[1] >= started_wall:
        details["saved"] = _s(marks.save[1] - started_wall)
    if marks.kept:
        details["kept"] = True
    if marks.exited is not None:
        details["first_exit"] = _s(max(marks.exited - marks.started, 0.0))
    return details


def _s(seconds: float) -> float:
    return round(seconds, 3)
