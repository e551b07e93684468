"""The in-process control channel's wire, imported by both ends (``elastic.inprocess`` in the worker,
``launcher.inprocess.host`` in the agent); the standard library only.

One line a message over the Unix socket named by ``ENV``. The worker says ``hello <pid>`` when it
connects and ``parked`` once it has left ``train``; the agent says ``stop`` (leave ``train``: the
round ended) and ``go <json>`` (the next round's environment, an object of strings). A line that is
none of these decodes to None and is ignored: it comes from another version or from nowhere."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

__all__ = ["ENV", "Hello", "Parked", "Stop", "Go", "encode", "to_agent", "to_worker"]

ENV = "ELASTIC_INPROCESS"  # the agent's control socket (a Unix socket path), in the worker's environment


@dataclass(frozen=True)
class Hello:
    """Worker -> agent: this process runs under ``elastic.inprocess``."""

    pid: int


@dataclass(frozen=True)
class Parked:
    """Worker -> agent: the worker left ``train`` and waits for the next round."""


@dataclass(frozen=True)
class Stop:
    """Agent -> worker: the round ended; leave ``train``."""


@dataclass(frozen=True)
class Go:
    """Agent -> worker: the next round's environment."""

    env: dict[str, str] = field(default_factory=dict)


def encode(message: Hello | Parked | Stop | Go) -> bytes:
    if isinstance(message, Hello):
        return f"hello {message.pid}\n".encode()
    if isinstance(message, Go):
        return b"go " + json.dumps(message.env).encode() + b"\n"
    return b"parked\n" if isinstance(message, Parked) else b"stop\n"


def _split(line: bytes) -> tuple[str, str]:
    verb, _, rest = line.decode(errors="replace").strip().partition(" ")
    return verb, rest


def to_agent(line: bytes) -> Hello | Parked | None:
    """A worker's line, as the agent reads it."""
    verb, rest = _split(line)
    if verb == "hello" and rest.isdigit():
        return Hello(int(rest))
    return Parked() if verb == "parked" and not rest else None


def to_worker(line: bytes) -> Stop | Go | None:
    """The agent's line, as the worker reads it."""
    verb, rest = _split(line)
    if verb == "stop" and not rest:
        return Stop()
    if verb != "go":
        return None
    try:
        env = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return Go(env)
