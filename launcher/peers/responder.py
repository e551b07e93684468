"""The probed side: a thread that answers every ping at once, for as long as the agent lives.

It listens from the agent's start (before its first announcement), so a watcher that connects
finds it whatever round this node is in. Each ping's acknowledgment goes into the ``ContactLog``;
``on_contact(round)`` hears when a round's contact deadline moved (the agent re-arms its fence).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from launcher.selector.lineserver import Connection, LineServer

from .contact import ContactLog
from .wire import MAX_LINE, ProbeKind, parse, pong

__all__ = ["Responder"]


class Responder:
    """Answers probes on ``host:port`` (0: any free port) from a thread until ``close``."""

    def __init__(
        self,
        log: ContactLog,
        host: str = "0.0.0.0",
        port: int = 0,
        on_contact: Callable[[int], None] = lambda round_: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self._on_contact = on_contact
        self._clock = clock
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
        except OSError:
            listener.close()
            raise
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._server = LineServer(listener, self._answer, name=f"probe-responder-{self.port}", max_line=MAX_LINE)

    def close(self) -> None:
        self._server.close()

    def _answer(self, connection: Connection, line: bytes) -> bool:
        """Answer one ping, or take a watcher's goodbye (False: drop the connection)."""
        probe = parse(line)
        if probe is None or probe.kind is ProbeKind.PONG:
            return False
        round_, ack = probe.round, probe.number
        if probe.kind is ProbeKind.BYE:
            self.log.release(round_)
            self._on_contact(round_)
            return False  # the watcher closes its side
        moved = (ack > 0 and self.log.acknowledged(round_, ack)) or self.log.deadline(round_) is None
        seq = self.log.answer(round_, self._clock())
        if not connection.send(pong(round_, seq)):
            return False
        if moved:
            self._on_contact(round_)
        return True
