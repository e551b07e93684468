"""The lighthouse's state in etcd: who forms the quorums (an election on the replicas' leases), where
each replica listens, and the last quorum issued (one record, written only when its id changes).

Keys, under ``<key_prefix>-lighthouse/<id>/``:

    leader            the replica that forms quorums (JSON: name, address), on its lease
    replicas/<name>   each replica's address, on its lease
    quorum            the last issued quorum (JSON: id, members), on a retention lease

Safety. The record is written by compare-and-swap on its own mod_revision, and only while the
writer's claim on ``leader`` is the one it made (its create_revision): one quorum per id, an id
that never goes back. A quorum issued under the same id (the same members) is not written; the
leader's claim is checked by the same kind of transaction, with no write. A leader whose lease
ended cannot issue anything.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from rendezvous.errors import RendezvousError, RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.recipes import Election, Held
from rendezvous.etcd.session import refresh_lease
from rendezvous.etcd.txn import compare_created, compare_mod_revision, op_put

from . import wire

__all__ = ["LighthouseKeys", "Issued", "QuorumBook", "Fenced", "encode_issued", "decode_issued"]

_MEMBER_FIELDS = (
    "replica_id",
    "address",
    "store_address",
    "step",
    "world_size",
    "shrink_only",
    "data",
    "commit_failures",
)


class Fenced(RendezvousError):
    """This replica no longer forms quorums (another holds the claim, or its lease ended)."""


@dataclass(frozen=True)
class LighthouseKeys:
    prefix: str  # the job key prefix (``--rdzv-conf key_prefix``)
    lighthouse_id: str

    @property
    def root(self) -> str:
        return f"{self.prefix.rstrip('/')}-lighthouse/{self.lighthouse_id}/"

    @property
    def leader(self) -> str:
        return self.root + "leader"

    @property
    def quorum(self) -> str:
        return self.root + "quorum"

    @property
    def replicas(self) -> str:
        return self.root + "replicas/"


@dataclass(frozen=True)
class Issued:
    """A quorum as issued: its id, its members (torchft's QuorumMember messages) and when."""

    quorum_id: int
    members: tuple = ()
    created: float = 0.0

    @property
    def replica_ids(self) -> tuple[str, ...]:
        return tuple(m.replica_id for m in self.members)

    def to_proto(self) -> object:
        quorum = wire.Quorum(quorum_id=self.quorum_id, participants=list(self.members))
        quorum.created.FromNanoseconds(int(self.created * 1e9))
        return quorum


def encode_issued(issued: Issued, lease: int) -> bytes:
    members = [{name: getattr(m, name) for name in _MEMBER_FIELDS} for m in issued.members]
    return json.dumps(
        {"quorum_id": issued.quorum_id, "members": members, "created": issued.created, "lease": lease}
    ).encode()


def decode_issued(raw: bytes, where: str) -> tuple[Issued, int]:
    """The record and its retention lease; RendezvousStateError naming ``where`` if it is not one."""
    try:
        data = json.loads(raw)
        quorum_id, lease = data["quorum_id"], data.get("lease", 0)
        if type(quorum_id) is not int or quorum_id < 0 or type(lease) is not int:
            raise ValueError("quorum_id and lease must be ints")
        members = tuple(wire.QuorumMember(**{k: m[k] for k in _MEMBER_FIELDS if k in m}) for m in data["members"])
        return Issued(quorum_id, members, float(data.get("created", 0.0))), lease
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RendezvousStateError(f"{where} is not a lighthouse quorum record ({exc})") from None


@dataclass
class QuorumBook:
    """The leader's hold on the record: read when it took over, guarded by its claim's revision."""

    client: EtcdClient
    keys: LighthouseKeys
    claim: int  # the create_revision of this replica's ``leader`` key
    retention: int
    issued: Issued | None = None
    revision: int = 0  # the record's mod_revision as last read or written (0: none)
    lease: int = 0
    _renewed: float = 0.0

    @classmethod
    def open(cls, client: EtcdClient, keys: LighthouseKeys, claim: int, retention: int) -> "QuorumBook":
        book = cls(client, keys, claim, retention)
        kv = client.get(keys.quorum)
        if kv is not None:
            book.issued, book.lease = decode_issued(kv.value, keys.quorum)
            book.revision = kv.mod_revision
        return book

    def confirm(self) -> None:
        """Still the leader, and the record is the one read (a transaction with no write): or Fenced."""
        self._keep()
        self._guarded([])

    def write(self, issued: Issued) -> None:
        """Write a quorum with a new id, guarded by the claim and the record's revision: or Fenced."""
        self._keep()
        put = op_put(self.keys.quorum, encode_issued(issued, self.lease), lease=self.lease)
        self.issued, self.revision = issued, self._guarded([put])

    def _guarded(self, writes: list) -> int:
        """One transaction: ``writes`` if this replica's claim stands and nobody wrote the record since
        it was read (a record that does not exist has mod_revision 0); the store's revision after it."""
        guards = [compare_created(self.keys.leader, self.claim), compare_mod_revision(self.keys.quorum, self.revision)]
        response = self.client.txn(guards, writes, [])
        if not response.succeeded:
            raise Fenced(f"{self.keys.leader} is no longer this replica's claim (or the record moved)")
        return response.header.revision

    def _keep(self) -> None:
        """The record's retention lease: granted once, renewed at most every third of it."""
        if not self.retention:
            return
        now = time.monotonic()
        if self.lease and now - self._renewed < self.retention / 3:
            return
        if not self.lease or refresh_lease(self.client, self.lease) <= 0:
            self.lease = self.client.grant_lease(self.retention)
        self._renewed = now


def campaign(client: EtcdClient, keys: LighthouseKeys, name: str, address: str, lease: int) -> tuple[Held, str | None]:
    """Claim ``leader`` unless someone holds it: the election's answer and the leader's address."""
    held = Election(keys.leader).campaign(client, json.dumps({"name": name, "address": address}), lease)
    return held, leader_address(held.holder)


def leader_address(holder: str | None) -> str | None:
    if holder is None:
        return None
    try:
        return str(json.loads(holder)["address"])
    except (ValueError, KeyError, TypeError):
        return None
