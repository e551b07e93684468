"""The agent's side of ``elastic.inprocess``: workers that are kept across rounds.

A worker that calls ``elastic.inprocess`` connects to the agent's control socket (``ENV`` in its
environment) and says ``hello <pid>``. When a round ends for a reason that is not this worker's
own (another worker's failure, a node lost or joining, a hang blamed elsewhere), the agent says
``stop``; the worker leaves ``train`` and answers ``parked``. A parked worker is kept: the next
round gives it its environment (``go <json>``) instead of a new process. One that does not park
within the grace is stopped as any worker is.

A ``LineServer`` thread reads every connection; the agent's main thread asks and waits.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping

from launcher.selector.lineserver import Connection, LineServer

from . import wire
from .wire import ENV

__all__ = ["InprocessHost", "ENV"]


class InprocessHost:
    """The control socket in ``directory`` and the workers connected to it, by pid."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "inprocess.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)
        self._links: dict[int, Connection] = {}
        self._parked: set[int] = set()
        self._heard_from: set[int] = set()  # every worker that said hello: it runs under elastic.inprocess
        self._changed = threading.Condition()
        self._server = LineServer(listener, self._heard, self._gone, name="inprocess-host")

    def env(self) -> dict[str, str]:
        return {ENV: self.path}

    def connected(self, pid: int) -> bool:
        with self._changed:
            return pid in self._links

    def park(self, pids: Iterable[int], grace: float) -> set[int]:
        """Ask these workers to leave ``train``; the ones that did within ``grace`` seconds."""
        with self._changed:
            asked = [pid for pid in pids if pid in self._links and self._links[pid].send(wire.encode(wire.Stop()))]
            self._parked.difference_update(asked)
            deadline = time.monotonic() + grace
            while not self._parked.issuperset(asked) and time.monotonic() < deadline:
                self._changed.wait(timeout=min(0.05, max(deadline - time.monotonic(), 0)))
            return self._parked.intersection(asked)

    def resume(self, pid: int, env: Mapping[str, str]) -> bool:
        """Give a parked worker the new round's environment (False: it is gone)."""
        with self._changed:
            link = self._links.get(pid)
            self._parked.discard(pid)
            return link is not None and link.send(wire.encode(wire.Go(dict(env))))

    def heard_from(self, pids: Iterable[int]) -> bool:
        """Whether any of these workers runs under ``elastic.inprocess`` (said hello, alive or not)."""
        with self._changed:
            return not self._heard_from.isdisjoint(pids)

    def close(self) -> None:
        self._server.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _heard(self, connection: Connection, line: bytes) -> bool:
        message = wire.to_agent(line)
        with self._changed:
            if isinstance(message, wire.Hello):
                connection.pid = message.pid
                self._links[connection.pid] = connection
                self._heard_from.add(connection.pid)
            elif isinstance(message, wire.Parked) and connection.pid:
                self._parked.add(connection.pid)
            self._changed.notify_all()
        return True

    def _gone(self, connection: Connection) -> None:
        with self._changed:
            if self._links.get(connection.pid) is connection:
                del self._links[connection.pid]
            self._parked.discard(connection.pid)
            self._changed.notify_all()
