"""The agent <-> warm interpreter wire, imported by both ends: the agent's ``warm.WarmStarter`` and
the interpreter (``zygote.py``, run by path, which loads this file by its path). The standard
library only. One JSON object a SOCK_SEQPACKET message, its ``kind`` saying which:

    agent -> interpreter   Request  the worker's argv, environment and working directory (its
                                    stdout and stderr go beside it as two descriptors)
                           Priority the CPU priority (a nice value) of the imports while they run
                                    (a hot spare's are lowered; the forking thread never is)
    interpreter -> agent   Ready    once, after the imports: the modules loaded, those that failed
                                    (name -> error) and why forking is unsafe ("" when it is not)
                           Forked   per request: the worker's pid
                           Exited   when a worker ends: its pid and wait status

A message that is none of these decodes to None."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["Request", "Priority", "Ready", "Forked", "Exited", "encode", "to_interpreter", "to_agent"]


@dataclass(frozen=True)
class Request:
    argv: list[str]
    env: dict[str, str]
    cwd: str


@dataclass(frozen=True)
class Priority:
    nice: int


@dataclass(frozen=True)
class Ready:
    loaded: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unsafe: str = ""


@dataclass(frozen=True)
class Forked:
    pid: int


@dataclass(frozen=True)
class Exited:
    pid: int
    status: int


_KINDS = {"request": Request, "priority": Priority, "ready": Ready, "forked": Forked, "exited": Exited}
Message = Request | Priority | Ready | Forked | Exited


def encode(message: Message) -> bytes:
    kind = next(name for name, cls in _KINDS.items() if isinstance(message, cls))
    return json.dumps({"kind": kind, **asdict(message)}).encode()


def _decode(data: bytes, kinds: tuple[str, ...]) -> Message | None:
    try:
        fields = json.loads(data)
    except ValueError:
        return None
    if not isinstance(fields, dict) or fields.get("kind") not in kinds:
        return None
    cls = _KINDS[fields.pop("kind")]
    try:
        message = cls(**fields)
    except TypeError:
        return None
    return message if _well_typed(message) else None


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _mapping(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _well_typed(message: Message) -> bool:
    if isinstance(message, Priority):
        return isinstance(message.nice, int) and not isinstance(message.nice, bool) and -20 <= message.nice <= 19
    if isinstance(message, Request):
        return _strings(message.argv) and bool(message.argv) and _mapping(message.env) and isinstance(message.cwd, str)
    if isinstance(message, Ready):
        return _strings(message.loaded) and _mapping(message.failed) and isinstance(message.unsafe, str)
    numbers = (message.pid,) if isinstance(message, Forked) else (message.pid, message.status)
    return all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)


def to_interpreter(data: bytes) -> Request | Priority | None:
    """The agent's message, as the interpreter reads it."""
    return _decode(data, ("request", "priority"))  # type: ignore[return-value]


def to_agent(data: bytes) -> Ready | Forked | Exited | None:
    """The interpreter's message, as the agent reads it."""
    return _decode(data, ("ready", "forked", "exited"))  # type: ignore[return-value]
