"""The probes' wire format and timing (pure).

One line each way on a TCP connection from a watcher to the node it probes:

    ping <round> <ack>\\n     the watcher: its round, and the last answer it received (0: none yet)
    pong <round> <seq>\\n     the node: the same round, and this answer's number
    bye <round> 0\\n          the watcher: it no longer judges this node in that round (its
                             accusation, if any, is withdrawn), so the round's deadline is off
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["Timing", "timing", "ping", "pong", "bye", "ProbeKind", "Probe", "parse", "MAX_LINE"]

MAX_LINE = 64  # bytes: a longer line is not a probe, and its connection is closed


class Timing(NamedTuple):
    """The probes' clock: a watcher's verdict after ``timeout`` seconds of silence; a ping every
    ``interval``; a node kills its own workers ``fence_after`` seconds after the send time of its
    newest acknowledged answer, ``timeout - fence_after`` before any watcher can call it dead."""

    timeout: float
    interval: float
    fence_after: float

    @property
    def margin(self) -> float:
        return self.timeout - self.fence_after


def timing(timeout: float) -> Timing:
    """The probes' timing for a peer timeout: six pings a timeout, and a third of it as margin
    (for the fence to kill the workers) -- 1.5 s: a ping every 0.25 s, the node's fence at 1.0 s."""
    return Timing(timeout, timeout / 6, timeout - timeout / 3)


def ping(round_: int, ack: int) -> bytes:
    return b"ping %d %d\n" % (round_, ack)


def pong(round_: int, seq: int) -> bytes:
    return b"pong %d %d\n" % (round_, seq)


def bye(round_: int) -> bytes:
    return b"bye %d 0\n" % round_


class ProbeKind(str, enum.Enum):
    PING = "ping"
    PONG = "pong"
    BYE = "bye"


class Probe(NamedTuple):
    """One probe line: its kind, its round, and its number (a ping's ack, a pong's seq, a bye's 0)."""

    kind: ProbeKind
    round: int
    number: int


def parse(line: bytes) -> Probe | None:
    """One line without its newline; None when it is not a probe line."""
    parts = line.split()
    if len(parts) != 3 or parts[0] not in (b"ping", b"pong", b"bye") or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return Probe(ProbeKind(parts[0].decode()), int(parts[1]), int(parts[2]))
