"""The agent <-> reaper wire, imported by both ends: the agent's handle (``fence.ReaperProcess``) and
the reaper (``reaper.py``, run by path with ``python -I -S``, which loads this file by its path too).
The standard library only.

One line a message, its first character its kind. Agent -> reaper:

    +PGID / -PGID     a worker process group started / stopped            Started / Stopped
    D<seconds>        the fence deadline (CLOCK_MONOTONIC; empty: none)    Deadline
    L<lease id>       the agent's etcd lease (0: none to revoke)           Lease
    R<round>          the round the agent is in (its death's record)       Round
    C<json>           how to reach etcd and where to record the death      Config
    T<path> / T       a temporary directory of the agent's / forget them   Temporary

Reaper -> agent: ``F<deadline>``, the deadline passed and the workers were killed (Fenced).
A line that is none of these decodes to None."""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "Started", "Stopped", "Deadline", "Lease", "Round", "Config", "Temporary", "Fenced", "encode", "decode",
]  # fmt: skip


@dataclass(frozen=True)
class Started:
    pgid: int


@dataclass(frozen=True)
class Stopped:
    pgid: int


@dataclass(frozen=True)
class Deadline:
    at: float | None  # None: no deadline now


@dataclass(frozen=True)
class Lease:
    lease_id: int


@dataclass(frozen=True)
class Round:
    number: int


@dataclass(frozen=True)
class Config:
    """The etcd target's JSON (``EtcdTarget.to_json``), the agent's import path, and the history's
    place (``{"prefix", "node"}``, or None)."""

    target: str
    sys_path: tuple[str, ...]
    history: dict | None


@dataclass(frozen=True)
class Temporary:
    path: str  # "": forget every one (the agent exits well and removes its own)


@dataclass(frozen=True)
class Fenced:
    deadline: float


Message = Started | Stopped | Deadline | Lease | Round | Config | Temporary | Fenced


def encode(message: Message) -> bytes:
    return (_text(message) + "\n").encode()


def _text(message: Message) -> str:
    if isinstance(message, (Started, Stopped)):
        return f"{'+' if isinstance(message, Started) else '-'}{message.pgid}"
    if isinstance(message, Deadline):
        return "D" if message.at is None else f"D{message.at!r}"
    if isinstance(message, (Lease, Round)):
        return f"{'L' if isinstance(message, Lease) else 'R'}{_number(message)}"
    if isinstance(message, Config):
        return "C" + json.dumps(
            {"target": message.target, "sys_path": list(message.sys_path), "history": message.history}
        )
    if isinstance(message, Temporary):
        return f"T{message.path}"
    return f"F{message.deadline!r}"


def _number(message: Lease | Round) -> int:
    return message.lease_id if isinstance(message, Lease) else message.number


def decode(line: str) -> Message | None:
    kind, value = line[:1], line[1:].strip()
    if kind in ("+", "-", "L", "R"):
        if not value.isdigit():
            return None
        return {"+": Started, "-": Stopped, "L": Lease, "R": Round}[kind](int(value))
    if kind in ("D", "F"):
        return _timed(kind, value)
    if kind == "T":
        return Temporary(value)
    return _config(value) if kind == "C" else None


def _timed(kind: str, value: str) -> Deadline | Fenced | None:
    if kind == "D" and not value:
        return Deadline(None)
    try:
        at = float(value)
    except ValueError:
        return None
    return Deadline(at) if kind == "D" else Fenced(at)


def _config(value: str) -> Config | None:
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("target"), str):
        return None
    paths, history = data.get("sys_path") or [], data.get("history")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return None
    if history is not None and not (isinstance(history, dict) and {"prefix", "node"} <= history.keys()):
        return None
    return Config(data["target"], tuple(paths), history)
