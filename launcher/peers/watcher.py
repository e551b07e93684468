"""The watcher: one thread per round that probes this node's targets (its next nodes in the
round's ring) and acts on their silence.

Every ``interval`` it pings each target on a connection of its own (connecting again when one
is closed), reads what they answered, and asks ``Silence`` who is dead to it. A dead target is
accused (``Verdicts``): the watcher that completes the set of accusations ends its lease. A target
that answers again is cleared before its answer is acknowledged.
"""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence

from launcher.selector.lineserver import read_lines
from launcher.selector.loop import SelectorThread
from rendezvous.etcd.endpoints import host_port
from rendezvous.job.lostboard import Verdicts
from rendezvous.job.ranktable import Target

from .contact import Silence
from .wire import MAX_LINE, ProbeKind, Timing, bye, parse, ping

__all__ = ["PeerWatch"]

UNREACHABLE_AFTER = 5.0  # seconds a target never answered before that is said once


class _Link:
    """One connection to one target."""

    def __init__(self, target: Target) -> None:
        self.target = target
        endpoint = host_port(target.probe)  # checked when the row was read
        self.address = (endpoint.host, endpoint.port)
        self.sock: socket.socket | None = None
        self.connected = False
        self.inbox = bytearray()
        self.received = 0  # the newest answer received
        self.acked = 0  # the answer the pings acknowledge (held back while an accusation stands)


class PeerWatch(SelectorThread):
    """Probes ``targets`` for round ``round_`` from a thread until ``close``."""

    def __init__(
        self,
        round_: int,
        targets: Sequence[Target],
        timing: Timing,
        verdicts: Verdicts,
        say: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(f"peer-watch-{round_}")  # the watching thread closes every link when it stops
        self.round = round_
        self.timing = timing
        self._verdicts = verdicts
        self._say = say
        self._clock = clock
        self._started = clock()
        self._links = {t.node: _Link(t) for t in targets}
        self._silence = Silence(self._links, timing, self._started)
        self._lock = threading.Lock()
        self._told: set[str] = set()
        self._nudged = False
        self._until: float | None = None  # lingering after the round: watch until then
        self._start()

    # -- what the agent asks -------------------------------------------------------------------
    def lagging(self) -> bool:
        """A target missed answers or closed its connection: a worker failure now may be its loss."""
        with self._lock:
            return self._silence.lagging(self._clock())

    def answered_since(self, when: float) -> bool:
        with self._lock:
            return self._silence.answered_since(when)

    def heard(self, node: str) -> bool:
        """``node`` answered in this round (only then can its silence make it dead to this watcher)."""
        with self._lock:
            return self._silence.ever_heard(node)

    def nudge(self) -> None:
        """Probe every target now, not at the next turn."""
        self._nudged = True
        self.wake()

    def linger(self, seconds: float) -> None:
        """The round ended here: go on watching its participants for at most ``seconds`` (until the
        next round forms and ``close`` is called), so that one lost meanwhile is found by its probes,
        not its lease. A verdict now ends the lease only (the round's failures are judged already)."""
        self._verdicts.after_round = True
        self._until = self._clock() + seconds

    def close(self) -> None:
        """Stop watching: accusations withdrawn, then each target told (``bye``), so that its
        deadline for the round is off while its workers stop at their pace."""
        super().close(timeout=5.0)

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        due = self._clock()
        while not self.stopping and (self._until is None or self._clock() < self._until):
            self._nudged = False
            self._turn()
            due += self.timing.interval
            due = max(due, self._clock())  # a late turn does not try to catch up
            self._read_until(due)

    def _shutdown(self) -> None:
        withdrawn = self._verdicts.close()
        for link in self._links.values():
            if withdrawn and link.connected:
                try:
                    link.sock.send(bye(self.round))
                except OSError:
                    pass
            self._drop(link)

    def _turn(self) -> None:
        now = self._clock()
        with self._lock:
            self._silence.tick(now)
            dead = self._silence.dead(now)
        for node, link in self._links.items():
            if node in dead:
                if node not in self._verdicts.ended:
                    self._verdicts.accuse(link.target, dead[node])
            elif self._verdicts.accusing(node) and not self._verdicts.withdraw(node):
                continue  # the accusation stands until etcd hears it withdrawn: no acknowledgment meanwhile
            else:
                link.acked = link.received
            self._send(link)
        self._report_unreachable(now)

    def _send(self, link: _Link) -> None:
        if link.sock is None:
            self._connect(link)
            return
        if not link.connected:
            return
        try:
            link.sock.send(ping(self.round, link.acked))
        except OSError:
            self._closed(link)

    def _connect(self, link: _Link) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex(link.address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self._closed(link)
            return
        link.sock, link.connected, link.inbox = sock, False, bytearray()
        self._selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, link)

    def _read_until(self, due: float) -> None:
        while not (self.stopping or self._nudged):
            left = due - self._clock()
            if left <= 0:
                return
            for key, events in self._events(min(left, 0.1)):
                link = key.data
                if not link.connected and events & selectors.EVENT_WRITE:
                    self._connected(link)
                elif events & selectors.EVENT_READ:
                    self._receive(link)

    def _connected(self, link: _Link) -> None:
        if link.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            self._closed(link)
            return
        link.connected = True
        self._selector.modify(link.sock, selectors.EVENT_READ, link)
        self._send(link)

    def _receive(self, link: _Link) -> None:
        lines = read_lines(link.sock, link.inbox)
        if lines is None:
            self._closed(link)
            return
        for line in lines:
            answer = parse(line)
            if answer is not None and answer.kind is ProbeKind.PONG and answer.round == self.round:
                link.received = answer.number
                with self._lock:
                    self._silence.heard(link.target.node, self._clock())
        if len(link.inbox) > MAX_LINE:
            self._closed(link)

    def _closed(self, link: _Link) -> None:
        """The target's machine closed the connection or refused one: its agent is gone (once it
        answered in this round; before that, it is tried again next turn)."""
        self._drop(link)
        with self._lock:
            self._silence.closed(link.target.node)

    def _drop(self, link: _Link) -> None:
        if link.sock is not None:
            try:
                self._selector.unregister(link.sock)
            except (KeyError, ValueError):
                pass
            link.sock.close()
        link.sock, link.connected = None, False

    def _report_unreachable(self, now: float) -> None:
        if now - self._started < UNREACHABLE_AFTER:
            return
        for node, link in self._links.items():
            if node not in self._told and not self._silence.ever_heard(node):
                self._told.add(node)
                self._say(
                    f"peer probes: node {node} never answered at {link.target.probe} in {UNREACHABLE_AFTER:g} s "
                    "(a firewall, or probe_addr wrong?); its death will be noticed by its lease only"
                )
