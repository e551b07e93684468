"""One ``elastic-lighthouse`` replica: it holds a lease, campaigns to lead, and either forms the
quorums (leader) or hands its requests to the one that does (follower).

- Leading: the quorum record is read when the claim is won, so ids go on from the last one issued
  by anyone; every quorum is made official through the claim (``QuorumBook``), and the leader stops
  the moment its lease's renew deadline passes, before etcd can have given the claim to another.
- Following: quorum requests are forwarded to the leader, heartbeats relayed every tick; when the
  leader's key goes, every replica campaigns again and the requests in flight go to the winner.
- A replica whose lease ended (a long partition, SIGSTOP) starts a new one and follows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rendezvous.errors import RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.recipes import Election
from rendezvous.etcd.session import Session
from rendezvous.etcd.watch import EventType, Watch

from .book import Fenced, Issued, LighthouseKeys, QuorumBook, campaign, decode_issued
from .forming import Forming, Withdrawn
from .quorum import Rules, healthy
from .relay import LeaderGone, Relay

__all__ = ["Replica", "NotLeader"]

log = logging.getLogger("elastic.lighthouse")


class NotLeader(Exception):
    """A forwarded request reached a replica that does not lead."""


@dataclass(frozen=True)
class _Role:
    forming: Forming | None = None  # leading
    leader: str | None = None  # following: the leader's address
    generation: int = 0


def _renewed(session: Session) -> bool:
    """The lease is alive and its renew deadline has not passed: this replica may still lead."""
    return session.alive and time.monotonic() < session.deadline


class Replica:
    def __init__(
        self,
        client: EtcdClient,
        keys: LighthouseKeys,
        rules: Rules,
        *,
        address: str,
        name: str,
        lease_ttl: int = 5,
        retention: int = 0,
    ) -> None:
        self.client, self.keys, self.rules = client, keys, rules
        self.address, self.name = address, name
        self.lease_ttl, self.retention = lease_ttl, retention
        self._role = _Role()
        self._changed = threading.Condition()
        self._heard: dict[str, float] = {}  # groups heard here (monotonic)
        self._heard_lock = threading.Lock()
        self._relay = Relay()
        self._stop = threading.Event()
        self._session: Session | None = None
        self._threads: list[threading.Thread] = []

    # -- life ---------------------------------------------------------------------------------------
    def start(self) -> None:
        for target in (self._campaigns, self._ticks):
            thread = threading.Thread(target=target, name=f"lighthouse-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._set_role(_Role())
        for thread in self._threads:
            thread.join(timeout=5)
        if self._session is not None:
            self._session.close()
        self._relay.close()

    def role(self) -> _Role:
        with self._changed:
            return self._role

    def _set_role(self, role: _Role) -> None:
        with self._changed:
            old = self._role
            if old.forming is not None and old.forming is not role.forming:
                old.forming.stop(Fenced("this replica stopped leading"))
            self._role = _Role(role.forming, role.leader, old.generation + 1)
            self._changed.notify_all()

    def _wait_change(self, generation: int, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._role.generation != generation or self._stop.is_set(), timeout)

    # -- the election ------------------------------------------------------------------------------
    def _lease(self) -> Session:
        if self._session is None or not self._session.alive:
            if self._session is not None:
                log.warning("lighthouse %s: its lease ended; starting a new one and following", self.name)
            self._session = Session(self.client, self.lease_ttl)
            self.client.put(self.keys.replicas + self.name, self.address.encode(), lease=self._session.lease_id)
        return self._session

    def _campaigns(self) -> None:
        while not self._stop.is_set():
            try:
                session = self._lease()
                held, address = campaign(self.client, self.keys, self.name, self.address, session.lease_id)
                claim = self._claim(session) if address == self.address else 0
                if claim:
                    self._lead(session, claim)
                else:
                    self._follow(session, address, held.revision)
            except RendezvousError as exc:
                log.warning("lighthouse %s: etcd: %s; trying again", self.name, exc)
                self._set_role(_Role())
                self._stop.wait(0.5)

    def _claim(self, session: Session) -> int:
        """The create_revision of this replica's claim on the leader key (0: it holds none), read
        back: a claim made before (stepping down keeps the key) is as good as a new one."""
        kv = self.client.get(self.keys.leader)
        return kv.create_revision if kv is not None and kv.lease == session.lease_id else 0

    def _lead(self, session: Session, claim: int) -> None:
        book = QuorumBook.open(self.client, self.keys, claim, self.retention)
        others = self.client.count_prefix(self.keys.replicas) - 1
        settle = time.monotonic() + 2 * self.rules.quorum_tick + 0.1 if others > 0 else 0.0

        def issue(issued: Issued, new_id: bool) -> None:
            if not _renewed(session):
                raise Fenced(f"lighthouse {self.name}: its lease's renew deadline passed")
            book.write(issued) if new_id else book.confirm()

        forming = Forming(self.rules, book.issued, issue, settle_until=settle)
        with self._heard_lock:
            for rid, at in self._heard.items():
                forming.heard(rid, at)
        last = book.issued.quorum_id if book.issued else 0
        log.info("lighthouse %s leads (quorum id so far: %d)", self.name, last)
        self._set_role(_Role(forming=forming))
        while not self._stop.wait(self.rules.quorum_tick):
            if not _renewed(session) or forming.stopped:
                log.warning("lighthouse %s stops leading: %s", self.name, forming.stopped or "its lease is not renewed")
                break
        self._set_role(_Role())

    def _follow(self, session: Session, address: str | None, revision: int) -> None:
        self._set_role(_Role(leader=address))
        log.info("lighthouse %s follows %s", self.name, address)
        with Watch(self.client, Election(self.keys.leader).vacated(), start_revision=revision + 1) as watch:
            while not self._stop.is_set() and session.alive:
                event = watch.get(0.5)
                if event is not None and event.type in (EventType.DELETE, EventType.RESYNC):
                    return

    def _ticks(self) -> None:
        """The leader's quorum tick; a follower's heartbeat relay."""
        while not self._stop.wait(self.rules.quorum_tick):
            role = self.role()
            try:
                if role.forming is not None:
                    role.forming.tick()
                elif role.leader is not None and role.leader != self.address:
                    ages = self._ages()
                    if ages:
                        self._relay.send_heartbeats(role.leader, ages, timeout=1.0)
            except RendezvousError as exc:
                log.warning("lighthouse %s: %s", self.name, exc)

    # -- what the service asks ---------------------------------------------------------------------
    def heartbeat(self, replica_id: str, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        with self._heard_lock:
            self._heard[replica_id] = max(at, self._heard.get(replica_id, at))
        forming = self.role().forming
        if forming is not None:
            forming.heard(replica_id, at)

    def relayed(self, ages: dict[str, float]) -> None:
        """Heartbeats another replica heard: a table of seconds since each."""
        now = time.monotonic()
        forming = self.role().forming
        if forming is None:
            raise NotLeader(f"lighthouse {self.name} does not lead")
        for rid, age in ages.items():
            forming.heard(rid, now - age)

    def _ages(self) -> dict[str, float]:
        now = time.monotonic()
        with self._heard_lock:
            live = healthy(self._heard, now, self.rules.heartbeat_timeout)
            return {rid: now - self._heard[rid] for rid in live}

    def quorum(self, member: object, raw: bytes, deadline: float, *, forwarded: bool, gone: threading.Event) -> object:
        """The quorum (a torchft Quorum) that includes ``member``: formed here when this replica
        leads, else by the leader. TimeoutError at ``deadline``; NotLeader for a ``forwarded``
        request reaching a replica that does not lead; Withdrawn once ``gone`` is set (the caller
        went away: the service then calls ``withdraw``)."""
        self.heartbeat(member.replica_id)
        while True:
            if gone.is_set():
                raise Withdrawn(f"the request of {member.replica_id} was cancelled")
            role = self.role()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no quorum including {member.replica_id} was formed in time")
            if role.forming is not None:
                try:
                    return role.forming.quorum(member, deadline, gone).to_proto()
                except Fenced:
                    self._wait_change(role.generation, min(left, 1.0))
                    continue
            if forwarded:
                raise NotLeader(f"lighthouse {self.name} does not lead")
            if role.leader is None or role.leader == self.address:
                self._wait_change(role.generation, min(left, 0.1))
                continue
            try:
                return self._relay.forward(role.leader, raw, left, self._moved_since(role.generation, gone))
            except LeaderGone:
                self._wait_change(role.generation, min(left, 0.1))

    def withdraw(self, member: object) -> None:
        """``member``'s request ended (its caller went away): the leader forgets it asked. On a
        follower, cancelling the forwarded call (``gone``) has the leader do the same."""
        forming = self.role().forming
        if forming is not None:
            forming.withdraw(member)

    def _recorded(self) -> Issued | None:
        """The last quorum written to etcd (a follower's view; None when there is none or etcd is away)."""
        try:
            kv = self.client.get(self.keys.quorum)
            return decode_issued(kv.value, self.keys.quorum)[0] if kv is not None else None
        except RendezvousError:
            return None

    def _moved_since(self, generation: int, gone: threading.Event) -> Callable[[], bool]:
        """Whether the leadership changed since ``generation`` or the caller went away (polled while
        a request is forwarded: either cancels the forwarded call)."""
        return lambda: self.role().generation != generation or gone.is_set()

    def status(self) -> dict:
        role = self.role()
        if role.forming is not None:
            reason, issued = role.forming.status()
            heard = role.forming.heartbeats()
        else:
            reason, issued = f"formed by the leader at {role.leader}", self._recorded()
            with self._heard_lock:
                heard = dict(self._heard)
        now = time.monotonic()
        return {
            "name": self.name,
            "address": self.address,
            "leads": role.forming is not None,
            "leader": self.address if role.forming is not None else role.leader,
            "quorum_status": reason,
            "quorum": issued,
            "heartbeats": {rid: now - at for rid, at in sorted(heard.items())},
            "heartbeat_timeout": self.rules.heartbeat_timeout,
        }
