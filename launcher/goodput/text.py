"""A job's account as ``elastic-ctl report`` prints it: the goodput, the lost time by cause, the
costliest incidents, and what the account could not tell."""

from __future__ import annotations

from .account import TITLES, Account

__all__ = ["report_lines", "describe_seconds"]


def describe_seconds(seconds: float) -> str:
    """``0.42 s``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def report_lines(account: Account, run_id: str, *, top: int = 10) -> list[str]:
    state = "closed" if account.closed else "running (counted to the start of its current round)"
    lines = [
        f"job {run_id}: {describe_seconds(account.wall)} from {_began(account)}, {account.rounds} "
        f"round{'s' if account.rounds != 1 else ''}, {state}",
        f"goodput {account.goodput * 100:.1f} % ({describe_seconds(account.productive)} of training)",
        "",
    ]
    rows = [("WHERE THE TIME WENT", "SECONDS", "SHARE")]
    rows.append(("training", f"{account.productive:.2f}", _share(account.productive, account.wall)))
    for cause, seconds in account.lost.items():
        rows.append((TITLES[cause], f"{seconds:.2f}", _share(seconds, account.wall)))
    lines += _table(rows)
    if account.incidents:
        lines += ["", "COSTLIEST FIRST"]
        for i, incident in enumerate(account.incidents[:top], 1):
            parts = ", ".join(f"{TITLES[cause]} {seconds:.2f}" for cause, seconds in incident.parts)
            lines.append(f"{i:>3}. {describe_seconds(incident.seconds):>9}  {incident.what} ({parts})")
    lines += [f"note: {note}" for note in account.notes]
    return lines


def _share(seconds: float, wall: float) -> str:
    return f"{seconds / wall * 100:.1f} %" if wall > 0 else "-"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]


def _began(account: Account) -> str:
    return "its first agent's start" if account.from_start else "the first node's arrival"
