"""The job's c10d store, hosted by the agent of group rank 0 (``TORCHELASTIC_USE_AGENT_STORE=True``,
as torchrun's agent hosts it): the workers' ``init_process_group`` finds it listening whatever
order they start in, instead of waiting for rank 0's worker to come up and open one.

Each round gets a store of its own on a port of its own: every time this node announces itself
for a round, ``StoreHost.port`` binds and listens on a new socket and that port goes into the
node's key; when the round forms, the node of group rank 0 serves the socket it announced
(connections that came early wait in its backlog) and every other socket is closed. A fresh store
per round means no key of an earlier round's workers is seen by the next round's, and a worker of
an old round that wakes up late finds its port closed. One thread serves one round's store with
``selectors``; the agent has no torch to import.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable

from launcher.selector.loop import SelectorThread

from .protocol import MAGIC, Op, ProtocolError, Table, parse

__all__ = ["StoreHost", "StoreServer"]

_READ = 1 << 16
_KEEP = 2  # announced sockets kept: the newest, and the one before in case a round froze with it


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.validated = False


class StoreServer(SelectorThread):
    """One round's store on a listening socket, served from a thread until ``close``."""

    def __init__(self, listener: socket.socket) -> None:
        self.port = listener.getsockname()[1]
        super().__init__(f"c10d-store-{self.port}")  # the serving thread closes every socket when it stops
        self.table = Table()
        self._listener = listener
        self._listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._conns: dict[socket.socket, _Conn] = {}
        self._start()

    def close(self) -> None:
        """Stop serving: the listener and every client connection are closed."""
        super().close(timeout=5.0)

    def _loop(self) -> None:
        conns = self._conns
        while not self.stopping:
            for key, events in self._events(None):
                if key.fileobj is self._listener:
                    self._accept(conns)
                elif key.fileobj in conns:
                    self._io(conns, conns[key.fileobj], events)

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(self._conns, conn)
        self._listener.close()

    def _accept(self, conns: dict[socket.socket, _Conn]) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns[sock] = _Conn(sock)
        self._selector.register(sock, selectors.EVENT_READ, "client")

    def _io(self, conns: dict[socket.socket, _Conn], conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(conns, conn)
        if not events & selectors.EVENT_READ or conn.sock not in conns:
            return
        try:
            data = conn.sock.recv(_READ)
            if not data:
                raise ConnectionResetError
            conn.inbox += data
            self._answer(conns, conn)
        except (OSError, ProtocolError):
            self._drop(conns, conn)

    def _answer(self, conns: dict[socket.socket, _Conn], conn: _Conn) -> None:
        """Every whole request ``conn`` has sent, in order, while it is still connected."""
        while conn.sock in conns and (found := parse(conn.inbox)) is not None:
            request, used = found
            del conn.inbox[:used]
            if not conn.validated:
                if request.op is not Op.VALIDATE or request.args[0] != MAGIC:
                    raise ProtocolError("the first request was not torch's VALIDATE")
                conn.validated = True
                continue
            for target, data in self.table.handle(conn, request):
                target.outbox += data
                self._flush(conns, target)

    def _flush(self, conns: dict[socket.socket, _Conn], conn: _Conn) -> None:
        """Send what ``conn`` is owed; what the socket cannot take now waits for it to be writable.
        A connection that fails to take it is dropped (not the one whose request woke it)."""
        try:
            if conn.outbox:
                try:
                    sent = conn.sock.send(conn.outbox)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                del conn.outbox[:sent]
            wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
            if self._selector.get_key(conn.sock).events != wanted:
                self._selector.modify(conn.sock, wanted, "client")
        except OSError:
            self._drop(conns, conn)

    def _drop(self, conns: dict[socket.socket, _Conn], conn: _Conn) -> None:
        if conns.pop(conn.sock, None) is None:
            return
        self.table.drop(conn)
        self._selector.unregister(conn.sock)
        conn.sock.close()


def listen(port: int = 0) -> socket.socket:
    """A socket listening on every address of this host (IPv6 and IPv4 where the host has both)."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024)
    return socket.create_server(("0.0.0.0", port), backlog=1024)


class StoreHost:
    """This node's side of the agent store: a listening socket per announcement, and the store of
    the round this node hosts (group rank 0)."""

    def __init__(self, fixed_port: int | None = None, say: Callable[[str], None] = lambda line: None) -> None:
        """``fixed_port``: the port to host on (--master-port), each round; where it is taken (by
        another agent on this host), a free one, said once."""
        self._fixed = fixed_port
        self._say = say
        self._announced: dict[int, socket.socket] = {}  # port -> its listener, not served yet
        self._lock = threading.Lock()  # announcements come from the join loop, serving from the agent
        self.server: StoreServer | None = None

    def port(self) -> int:
        """A listening socket's port, for this node's next announcement (a new socket, or the one
        already announced on the fixed port)."""
        with self._lock:
            if self._fixed in self._announced:
                return self._fixed
            sock = self._listen()
            self._announced[sock.getsockname()[1]] = sock
            while len(self._announced) > _KEEP:  # a spare re-announcing for round after round
                self._announced.pop(next(iter(self._announced))).close()
        return sock.getsockname()[1]

    def _listen(self) -> socket.socket:
        if self._fixed is None:
            return listen()
        try:
            return listen(self._fixed)
        except OSError as exc:
            self._say(f"the store cannot listen on port {self._fixed} ({exc.strerror}): it takes a free port")
            self._fixed = None
            return listen()

    def serve(self, port: int | None) -> None:
        """The round formed: serve a fresh store on the socket announced with ``port`` (None: this
        node does not host this round's store); every other announced socket is closed."""
        self.stop()
        with self._lock:
            announced, self._announced = self._announced, {}
        listener = announced.pop(port, None) if port is not None else None
        for sock in announced.values():
            sock.close()
        if listener is not None:
            self.server = StoreServer(listener)

    def stop(self) -> None:
        """The round's workers are gone: its store goes with them."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def close(self) -> None:
        self.serve(None)
