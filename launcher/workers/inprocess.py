"""The agent's side of ``elastic.inprocess``: workers that are kept across rounds.

A worker that calls ``elastic.inprocess`` connects to the agent's control socket (``ENV`` in its
environment) and says ``hello <pid>``. When a round ends for a reason that is not this worker's
own (another worker's failure, a node lost or joining, a hang blamed elsewhere), the agent says
``stop``; the worker leaves ``train`` and answers ``parked``. A parked worker is kept: the next
round gives it its environment (``go <json>``) instead of a new process. One that does not park
within the grace is stopped as any worker is.

One thread serves every connection (``selectors``); the agent's main thread asks and waits.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Iterable, Mapping

__all__ = ["InprocessHost", "ENV"]

ENV = "ELASTIC_INPROCESS"


class _Link:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.pid = 0
        self.parked = False


class InprocessHost:
    """The control socket in ``directory`` and the workers connected to it, by pid."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "inprocess.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._links: dict[int, _Link] = {}
        self._changed = threading.Condition()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="inprocess-host", daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        return {ENV: self.path}

    def connected(self, pid: int) -> bool:
        with self._changed:
            return pid in self._links

    def park(self, pids: Iterable[int], grace: float) -> set[int]:
        """Ask these workers to leave ``train``; the ones that did within ``grace`` seconds."""
        asked = []
        with self._changed:
            for pid in pids:
                link = self._links.get(pid)
                if link is not None and self._say(link, "stop"):
                    link.parked = False
                    asked.append(pid)
            deadline = time.monotonic() + grace
            while not all(self._parked(pid) for pid in asked) and time.monotonic() < deadline:
                self._changed.wait(timeout=min(0.05, max(deadline - time.monotonic(), 0)))
            return {pid for pid in asked if self._parked(pid)}

    def resume(self, pid: int, env: Mapping[str, str]) -> bool:
        """Give a parked worker the new round's environment (False: it is gone)."""
        with self._changed:
            link = self._links.get(pid)
            return link is not None and self._say(link, "go " + json.dumps(dict(env)))

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=2.0)
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _parked(self, pid: int) -> bool:
        link = self._links.get(pid)
        return link is not None and link.parked

    def _say(self, link: _Link, line: str) -> bool:
        data = line.encode() + b"\n"
        try:
            return link.sock.send(data) == len(data)  # a short line: a socket's buffer takes it whole
        except OSError:
            return False

    def _serve(self) -> None:
        try:
            while not self._closing:
                for key, _ in self._selector.select(timeout=0.2):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()
            self._selector.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, _Link(sock))

    def _read(self, link: _Link) -> None:
        try:
            data = link.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        with self._changed:
            if not data:
                self._selector.unregister(link.sock)
                link.sock.close()
                if self._links.get(link.pid) is link:
                    del self._links[link.pid]
                self._changed.notify_all()
                return
            link.inbox += data
            while b"\n" in link.inbox:
                line, _, rest = bytes(link.inbox).partition(b"\n")
                link.inbox[:] = rest
                verb, _, value = line.decode(errors="replace").partition(" ")
                if verb == "hello" and value.isdigit():
                    link.pid = int(value)
                    self._links[link.pid] = link
                elif verb == "parked":
                    link.parked = True
            self._changed.notify_all()
