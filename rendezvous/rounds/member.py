"""This node as a member of a job: its identity, its lease (``etcd.session.Session``), and its node key.

The node key (``nodes/<node>``, a ``NodeInfo`` on the lease) is all a node ever writes of a forming
round: which round it asks for, its address and workers, that it finished, or that its workers of
a round failed (a restart request: see ``launcher/restart.py`` for the whole path). It vanishes
with the lease, so everyone watching hears a node go at once.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from rendezvous.errors import LeaseNotFoundError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.ports import free_port
from rendezvous.etcd.session import Session
from rendezvous.etcd.txn import op_put
from rendezvous.job.keys import JobKeys
from rendezvous.job.progress import RoundProgress
from rendezvous.job.state import FailureKind, NodeInfo
from rendezvous.settings import RendezvousSettings

from .snapshot import Snapshot, read_round

__all__ = ["Member", "Identity", "LeaseStatus", "default_node_id"]


def default_node_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class LeaseStatus:
    """This node's lease as the fence sees it, whatever session holds it now (before the first round:
    no lease, nothing overdue). One view for the node's life: the agent's parts are handed it once."""

    def __init__(self, session: Callable[[], Session | None]) -> None:
        """``session()``: the session that holds this node's lease now (None: none yet)."""
        self._session = session

    def overdue(self) -> bool:
        """No renewal past the renew deadline (now, or since ``handled``): the workers must stop,
        since the lease may expire and the others may start a round without this node."""
        session = self._session()
        return session is not None and session.overdue()

    def handled(self) -> None:
        """The fence was carried out: that missed deadline is forgotten."""
        session = self._session()
        if session is not None:
            session.clear_overdue()

    def silent_for(self) -> float:
        """Seconds since the last acknowledged renewal was sent."""
        session = self._session()
        return session.silent_for() if session is not None else 0.0

    def wait_ahead(self, seconds: float, timeout: float, waiting: Callable[[float], None]) -> bool:
        """Whether the renew deadline is at least ``seconds`` ahead, waiting up to ``timeout`` for a
        renewal to move it there; ``waiting(silent_for)`` is told once when it has to wait. Workers
        start only so: a round can form just after etcd came back, before the keep-alive has
        renewed the lease (its last deadline past, and handled by the fence that stopped the workers)."""
        session = self._session()
        if session is None or session.wait_ahead(seconds, 0.0):
            return True
        waiting(session.silent_for())
        return session.wait_ahead(seconds, timeout)

    @property
    def lease_id(self) -> int:
        """The lease this node's keys live on (0 before the first round)."""
        session = self._session()
        return session.lease_id if session is not None else 0

    def lost(self) -> bool:
        """etcd said the lease is gone (unreachable past the TTL): this node is no longer a member."""
        session = self._session()
        return session is not None and session.lost.is_set()


@dataclass(frozen=True)
class _Request:
    """A restart this node asks the next round for: which round failed, what failed, how far it got."""

    round: int
    failure: str
    kind: FailureKind | None
    progress: RoundProgress | None


@dataclass(frozen=True)
class Identity:
    """Who this node is to the others: its id, the address its workers are reached at, its workers."""

    node_id: str
    addr: str
    local_world_size: int
    probe: str = ""  # host:port its agent answers peer probes on ("": none)


class Member:
    """This node's lease and node key."""

    def __init__(
        self,
        client: EtcdClient,
        settings: RendezvousSettings,
        keys: JobKeys,
        identity: Identity,
        on_renew: Callable[[int, float], None] | None = None,
        master_port: Callable[[], int] | None = None,
    ) -> None:
        """``on_renew(lease id, fence deadline)``: after every acknowledged renewal, from the stream
        loop's thread (the agent hands it to the process that enforces the deadline).
        ``master_port()``: the port this node offers for its round's store, asked at every
        announcement (default: a free port, for a worker to host the store on)."""
        self._client, self._settings, self._keys = client, settings, keys
        self.identity = identity
        self._on_renew = on_renew
        self._master_port = master_port or (lambda: free_port("0.0.0.0"))
        self._session: Session | None = None
        self._lease = LeaseStatus(lambda: self._session)
        self._request: _Request | None = None  # ask the next round for a restart

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def alive(self) -> bool:
        return self._session is not None and self._session.alive

    @property
    def lease(self) -> LeaseStatus:
        return self._lease

    def lease_ended(self) -> None:
        """etcd answered that this node's lease is gone (it expired while this node could not renew
        it): this node is no longer a member; its next announcement takes a new lease."""
        if self._session is not None:
            self._session.lose()

    def claim(self) -> tuple[str, int] | None:
        """Who becomes the coordinator if nobody is: this node, on its lease (None: no live lease)."""
        return (self.node_id, self._session.lease_id) if self.alive else None

    def request_restart(
        self, round_: int, failure: str, kind: FailureKind = FailureKind.WORKER, progress: RoundProgress | None = None
    ) -> None:
        """This node's workers of ``round_`` failed (or hung), having got as far as ``progress``: its
        next announcement asks for a restart."""
        self._request = _Request(round_, failure, kind, progress)

    def placed(self) -> None:
        """A round took this node in: a restart it asked for is counted (or was not needed)."""
        self._request = None

    def announce(self, round_: int, *, finished: bool = False, quiet: bool = False) -> Snapshot:
        """Write (or rewrite) this node's key asking for ``round_``, on a live lease (a new one if
        the last ended); returns what the same transaction read: the state and the coordinator."""
        if not self.alive:
            if self._session is not None:
                self._session.close(timeout=0.5)
            self._session = Session(
                self._client,
                self._settings.lease_ttl,
                renew_deadline=self._settings.fence_after,
                interval=self._settings.renew_every,
                on_renew=self._renewed,
            )
        request = self._request or _Request(0, "", None, None)
        info = NodeInfo(
            node=self.node_id,
            round=round_,
            addr=self.identity.addr,
            local_world_size=self.identity.local_world_size,
            master_port=self._master_port(),
            finished=finished,
            failed_round=request.round,
            failure=request.failure,
            failure_kind=request.kind,
            probe=self.identity.probe,
            progress=request.progress,
            quiet=quiet,
        )
        put = op_put(self._keys.node(self.node_id), info.encode(), lease=self._session.lease_id)
        try:
            return read_round(self._client, self._keys, all_nodes=False, put=put, claim=self.claim())
        except LeaseNotFoundError:
            self._session.lose()
            return self.announce(round_, finished=finished, quiet=quiet)

    def leave(self) -> None:
        """Revoke the lease: the node key goes, and the others hear it at once."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def _renewed(self, lease_id: int, deadline: float) -> None:
        if self._on_renew is not None:
            self._on_renew(lease_id, deadline)
