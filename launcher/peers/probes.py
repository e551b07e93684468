"""This agent's probes, as the agent uses them: the responder for its life, a watch per round,
and the contact deadline handed to its fence."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rendezvous.errors import RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.endpoints import Endpoint
from rendezvous.job.history import HistoryWriter
from rendezvous.job.keys import JobKeys
from rendezvous.job.lostboard import Verdicts
from rendezvous.rounds.join import RendezvousInfo

if TYPE_CHECKING:
    from rendezvous.settings import RendezvousSettings

from .contact import ContactLog
from .responder import Responder
from .watcher import PeerWatch
from .wire import timing

__all__ = ["PeerTerms", "PeerProbes"]


@dataclass(frozen=True)
class PeerTerms:
    """What the probes need of the rendezvous settings (``PeerTerms.of``)."""

    keys: JobKeys  # the job's keys: where a watcher's suspicion goes
    window: float  # peer_window: seconds of silence that make a peer dead (its timing follows)
    lease_ttl: float  # a lost node's lease has expired by twice this
    port: int = 0  # probe_port: where this node answers (0: a free one)
    advertised: str = ""  # probe_addr: the host:port peers reach it at ("": this host and the port)

    @classmethod
    def of(cls, settings: RendezvousSettings) -> "PeerTerms":
        keys = JobKeys(settings.key_prefix, settings.run_id)
        return cls(keys, settings.peer_window, settings.lease_ttl, settings.probe_port, settings.probe_addr)


class PeerProbes:
    """Answers this node's watchers, watches its targets while a round runs, and keeps
    ``fence(deadline)`` (the agent's reaper) told when this node's workers must be gone by."""

    def __init__(
        self,
        terms: PeerTerms,
        client: EtcdClient,
        node: str,
        addr: str,
        fence: Callable[[float | None], None],
        history: HistoryWriter | None = None,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.timing = timing(terms.window)
        self._client, self._keys, self._node = client, terms.keys, node
        self._fence, self._history, self._say = fence, history, say
        self._log = ContactLog(self.timing.fence_after)
        self._running: int | None = None
        self._lock = threading.Lock()  # the running round and the deadline handed to the fence change together
        self._watch: PeerWatch | None = None
        self._lingering: PeerWatch | None = None  # the last round's watch, until the next round forms
        self._linger_for = 2 * terms.lease_ttl  # past its TTL a lost node's lease has expired anyway
        self._info: RendezvousInfo | None = None
        self.missed: float | None = None  # the last round ended past its contact deadline: seconds unheard then
        self._responder = Responder(self._log, "0.0.0.0", terms.port, on_contact=self._contact)
        self.endpoint = terms.advertised or Endpoint(addr, self._responder.port).target  # [v6]:port

    def start_round(self, info: RendezvousInfo, lease: Callable[[], int]) -> None:
        """Round ``info`` starts here: its contact deadline guards the workers, and its targets are watched."""
        self._log.forget_before(info.round)
        self._info, self.missed = info, None
        self._stop_lingering()
        with self._lock:
            self._running = info.round
            self._fence(self._log.deadline(info.round))
        if info.watch:
            verdicts = Verdicts(self._client, self._keys, self._node, lease, info.round, self._history)
            self._watch = PeerWatch(info.round, info.watch, self.timing, verdicts, self._say)

    def end_round(self) -> None:
        """This node's workers of the round are gone: no deadline from the peers until the next."""
        with self._lock:
            if self._running is not None:
                deadline, now = self._log.deadline(self._running), time.monotonic()
                missed = deadline is not None and now >= deadline
                self.missed = self._log.heard_for(self._running, now) if missed else None
            self._running = None
            self._fence(None)
        if self._watch is not None:  # its participants stay watched while the next round forms
            self._stop_lingering()
            self._watch.linger(self._linger_for)
            self._lingering, self._watch = self._watch, None

    def _stop_lingering(self) -> None:
        if self._lingering is not None:
            self._lingering.close()
            self._lingering = None

    def lost_with_failure(self, spent: bool) -> tuple[str, ...]:
        """The participants of the running round lost with a worker failure seen now (a membership
        change, not a failure). Every target is probed at once: when all answer, none is lost, and
        this returns after one round trip -- unless ``spent`` (no restart left) and some participant
        is no target of this node's: then it waits the peers' whole verdict time, as when a target
        does not answer (a verdict on any participant of the round ends the wait)."""
        watch, info = self._watch, self._info
        if watch is None or info is None:
            return ()
        failed_at = time.monotonic()
        until = failed_at + self.timing.timeout + 2 * self.timing.interval + 0.5
        everyone = len(info.watch) >= info.group_world_size - 1
        watch.nudge()
        while True:
            lost = self._gone(info)
            if lost or time.monotonic() >= until:
                return lost
            if watch.answered_since(failed_at) and not watch.lagging() and (everyone or not spent):
                return ()
            time.sleep(0.05)

    def _gone(self, info: RendezvousInfo) -> tuple[str, ...]:
        """The participants of the round its watchers found dead (theirs or this node's targets)."""
        prefix = self._keys.lost_in(info.round)
        try:
            kvs, _ = self._client.get_prefix(prefix)
        except RendezvousError:
            return ()
        return tuple(sorted(kv.key.decode(errors="replace")[len(prefix) :] for kv in kvs))

    def last_miss(self) -> tuple[float | None, float]:
        """(seconds this node's watchers had not heard it when its last round ended past its contact
        deadline -- None: it did not --, the fence time of the probes)."""
        return self.missed, self.timing.fence_after

    def close(self) -> None:
        self.end_round()
        self._stop_lingering()
        self._responder.close()

    def _contact(self, round_: int) -> None:
        with self._lock:
            if round_ == self._running:
                self._fence(self._log.deadline(round_))
