"""``elastic-ctl history``'s rows in words: each record's kind as an event a reader knows, and its
details as a sentence with units, not the record's field names (``--json`` keeps the records as
stored). Pure: a record in, text out; a kind or a field it does not know is still shown, its name's
underscores read as spaces."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rendezvous.job.history import Kind

__all__ = ["event_words", "details_text"]

_EVENTS = {
    Kind.ROUND_FROZEN: "round formed",
    Kind.ROUND_ENDED: "round ended",
    Kind.ROUND_REQUESTED: "new round asked",
    Kind.GROUP_RESTARTED: "workers restarted",
    Kind.WORKER_FAILED: "worker failed",
    Kind.WORKER_HUNG: "worker hung",
    Kind.WORKER_STUCK_AT_EXIT: "worker stuck at exit",
    Kind.NODE_LEFT: "node left",
    Kind.NODE_LOST: "node lost",
    Kind.NODE_UNHEALTHY: "node unhealthy",
    Kind.NODE_HEALTHY: "node healthy again",
    Kind.PREFLIGHT: "pre-flight check",
    Kind.STRAGGLER: Kind.STRAGGLER,
    Kind.STRAGGLER_RECOVERED: "straggler recovered",
    Kind.JOB_CLOSED: "job closed",
    Kind.JOB_RERUN: "job run again",
}


def event_words(kind: str) -> str:
    return _EVENTS.get(kind, kind.replace("_", " "))


def _names(names: Any, count: Any) -> str:
    shown = ", ".join(map(str, names)) if isinstance(names, list) else str(names)
    more = count - len(names) if isinstance(count, int) and isinstance(names, list) else 0
    return shown + (f" and {more} more" if more > 0 else "")


def _seconds(value: Any) -> str:
    return f"{value:g} s" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _formed(d: Mapping[str, Any]) -> str:
    nodes = d.get("nodes")
    text = f"{d.get('world_size', '?')} workers on {nodes} node{'' if nodes == 1 else 's'}"
    text += f", formed in {_seconds(d['formed_in'])}" if "formed_in" in d else ""
    text += f", {_seconds(d['up'])} after its agent started" if "up" in d else ""
    for key, verb in (("joined", "joined"), ("left", "left")):
        if d.get(key):
            text += f"; {verb}: {_names(d[key], d.get(f'{key}_count'))}"
    return text


def _failed(d: Mapping[str, Any]) -> str:
    how = f"signal {d['signal']}" if d.get("signal") else f"exit code {d.get('exit_code', '?')}"
    text = f"rank {d.get('rank', '?')} on {d.get('host', '?')}: {how}"
    return text + (f": {d['message']}" if d.get("message") else "")


def _restarted(d: Mapping[str, Any]) -> str:
    return f"restart {d.get('restart_count', '?')} of {d.get('max_restarts', '?')}"


def _closed(d: Mapping[str, Any]) -> str:
    text = ("failed: " if d.get("failed") else "") + str(d.get("reason", ""))
    return text + (f" (by {d['by']})" if d.get("by") not in (None, "", "agent") else "")


def _why(d: Mapping[str, Any]) -> str:
    text = f"{d['node']}: " if d.get("node") else ""
    text += str(d.get("reason", ""))
    return text + (f" (said by {d['by']})" if d.get("by") else "")


def _hung(d: Mapping[str, Any]) -> str:
    text = f"rank {d.get('rank', '?')} on {d.get('node', '?')}: no heartbeat for {_seconds(d.get('silent'))}"
    text += f" (its timeout {_seconds(d['timeout'])})" if "timeout" in d else ""
    text += f", blocked in {d['blocked']}" if d.get("blocked") else ""
    return text + ("; a deadlock" if d.get("deadlock") else "")


def _rerun(d: Mapping[str, Any]) -> str:
    return f"the run before closed: {d.get('closed', '?')}"


_DETAILS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    Kind.ROUND_FROZEN: _formed,
    Kind.WORKER_FAILED: _failed,
    Kind.GROUP_RESTARTED: _restarted,
    Kind.JOB_CLOSED: _closed,
    Kind.NODE_LEFT: _why,
    Kind.NODE_LOST: _why,
    Kind.ROUND_REQUESTED: _why,
    Kind.JOB_RERUN: _rerun,
    Kind.WORKER_HUNG: _hung,
}


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def details_text(kind: str, details: Mapping[str, Any]) -> str:
    """The details of a ``kind`` record in words (a kind without its own wording: each field's name
    in words and its value, in the record's order)."""
    words = _DETAILS.get(kind)
    if words is not None:
        return words(details)
    return "; ".join(f"{key.replace('_', ' ')} {_value(value)}" for key, value in details.items())
