"""The probed side: a thread that answers every ping at once, for as long as the agent lives.

It listens from the agent's start (before its first announcement), so a watcher that connects
finds it whatever round this node is in. Each ping's acknowledgment goes into the ``ContactLog``;
``on_contact(round)`` hears when a round's contact deadline moved (the agent re-arms its fence).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable

from .contact import ContactLog
from .wire import MAX_LINE, parse, pong

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
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
        except OSError:
            self._listener.close()
            raise
        self._listener.listen(64)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name=f"probe-responder-{self.port}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=2.0)

    def _serve(self) -> None:
        try:
            while not self._closing:
                for key, _ in self._selector.select(timeout=1.0):
                    if key.data == "wake":
                        continue
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.fileobj, key.data)
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()
            self._selector.close()
            self._wake_w.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._selector.register(sock, selectors.EVENT_READ, bytearray())

    def _read(self, sock: socket.socket, inbox: bytearray) -> None:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        inbox += data
        while data and b"\n" in inbox:
            line, _, rest = bytes(inbox).partition(b"\n")
            inbox[:] = rest
            if not self._answer(sock, line):
                data = b""
        if not data or len(inbox) > MAX_LINE:
            self._selector.unregister(sock)
            sock.close()

    def _answer(self, sock: socket.socket, line: bytes) -> bool:
        """Answer one ping (False: not a ping, or the answer cannot be sent: drop the connection)."""
        probe = parse(line)
        if probe is None or probe[0] == "pong":
            return False
        kind, round_, ack = probe
        if kind == "bye":
            self.log.release(round_)
            self._on_contact(round_)
            return False  # the watcher closes its side
        moved = (ack > 0 and self.log.acknowledged(round_, ack)) or self.log.deadline(round_) is None
        seq = self.log.answer(round_, self._clock())
        try:
            sock.send(pong(round_, seq))  # a dozen bytes: a socket's buffer never refuses them
        except OSError:
            return False
        if moved:
            self._on_contact(round_)
        return True
