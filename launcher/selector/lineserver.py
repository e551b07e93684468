"""A thread serving line-based connections on a listening socket, with ``selectors``: the peers'
probe responder (``launcher.peers``) and the control socket of ``elastic.inprocess``
(``launcher.inprocess.host``) both read one short line at a time and answer at once."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Callable

from launcher.selector.loop import SelectorThread

__all__ = ["LineServer", "Connection", "read_lines"]


def read_lines(sock: socket.socket, inbox: bytearray) -> list[bytes] | None:
    """The complete lines (without their newline) a readable socket brought, the rest left in
    ``inbox``; None when the peer closed the connection or it broke."""
    try:
        data = sock.recv(4096)
    except (BlockingIOError, InterruptedError):
        return []
    except OSError:
        return None
    if not data:
        return None
    inbox += data
    lines = []
    while b"\n" in inbox:
        line, _, rest = bytes(inbox).partition(b"\n")
        inbox[:] = rest
        lines.append(line)
    return lines


class Connection:
    """One accepted connection: its socket, its unread bytes, and what its owner keeps about it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.pid = 0  # who is at the other end, when its owner learns it

    def send(self, data: bytes) -> bool:
        """Send a short line (a socket's buffer takes it whole); False when the peer is gone."""
        try:
            return self.sock.send(data) == len(data)
        except OSError:
            return False


class LineServer(SelectorThread):
    """Accepts connections on ``listener`` and gives each complete line (without its newline) to
    ``on_line(connection, line)`` from one thread, until ``close``. ``on_line`` returning False,
    a line longer than ``max_line`` or the peer closing ends the connection; ``on_closed`` hears it."""

    def __init__(
        self,
        listener: socket.socket,
        on_line: Callable[[Connection, bytes], bool],
        on_closed: Callable[[Connection], None] = lambda connection: None,
        *,
        name: str,
        max_line: int = 4096,
    ) -> None:
        super().__init__(name)  # the serving thread closes the listener and every connection when it stops
        self._listener, self._on_line, self._on_closed, self._max_line = listener, on_line, on_closed, max_line
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._start()

    def close(self) -> None:
        """Stop serving: the listener and every connection are closed."""
        super().close(timeout=2.0)

    def _loop(self) -> None:
        while not self.stopping:
            for key, _ in self._events(1.0):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)

    def _shutdown(self) -> None:
        for key in self._registered():
            key.fileobj.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._selector.register(sock, selectors.EVENT_READ, Connection(sock))

    def _read(self, connection: Connection) -> None:
        lines = read_lines(connection.sock, connection.inbox)
        ended = lines is None or not all(self._on_line(connection, line) for line in lines)
        if ended or len(connection.inbox) > self._max_line:
            self._selector.unregister(connection.sock)
            connection.sock.close()
            self._on_closed(connection)
