"""The peers' watchers' verdict in etcd (the job-state side of ``launcher.peers``): each watcher
that finds a peer dead says so under ``suspects/<round>/<peer>/<watcher>`` (on its own lease), and
the one that sees every watcher of that peer there records it under ``lost/<round>/<peer>`` and
ends the peer's lease. Writes happen only at a fault; the accusations go when the round's watch
ends, the records at the next freeze (which counts no restart for a round with one), all with the
watcher's lease at the latest.

Order matters for safety: a watcher withdraws its suspicion (deletes its key) before it
acknowledges a new answer from that peer, so a set of keys seen complete means that the peer got
no acknowledgment since the first of them was written -- its own fence has fired.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from rendezvous.errors import RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.job.history import HistoryWriter, Kind
from rendezvous.job.keys import JobKeys
from rendezvous.job.ranktable import Target

__all__ = ["Verdicts"]


class Verdicts:
    """One round's suspicions by this watcher, and the leases it ended."""

    def __init__(
        self,
        client: EtcdClient,
        keys: JobKeys,
        node: str,
        lease: Callable[[], int],
        round_: int,
        history: HistoryWriter | None = None,
    ) -> None:
        self._client, self._keys, self._node, self._lease = client, keys, node, lease
        self.round = round_
        self._history = history
        self.after_round = False  # the round ended here: a verdict only ends the lease (no lost/ record)
        self._written: set[str] = set()  # peers this watcher's key accuses now
        self.ended: dict[str, str] = {}  # peer -> why: the peers whose verdict is in (lease ended, by any watcher)

    def accuse(self, target: Target, why: str) -> bool:
        """Say ``target`` is dead to this watcher (once), then end its lease if every watcher says
        so. True when its lease is gone (ended here or by another watcher). etcd errors: False,
        tried again at the next look."""
        try:
            if target.node not in self._written:
                value = json.dumps({"why": why}).encode()
                self._client.put(self._key(target.node), value, lease=self._lease())
                self._written.add(target.node)
            if self._client.count_prefix(self._keys.suspects(self.round, target.node)) < target.watchers:
                return False
            if not self.after_round:  # the round's worker failures are not charged (read at the next freeze)
                lost = json.dumps({"why": why, "by": self._node}).encode()
                self._client.put(self._keys.lost_in(self.round, target.node), lost, lease=self._lease())
            ended = self._client.revoke_lease(target.lease)
        except RendezvousError:
            return False
        self.ended[target.node] = why  # settled: not accused again
        if ended and self._history is not None:  # the one that ended it says so
            self._history.record(Kind.NODE_LOST, self.round, node=target.node, reason=why, by=self._node)
        return True

    def accusing(self, node: str) -> bool:
        return node in self._written

    def withdraw(self, node: str) -> bool:
        """The peer answered again: this watcher's key goes (True once it is gone)."""
        if node not in self._written:
            return True
        try:
            self._client.delete(self._key(node))
        except RendezvousError:
            return False
        self._written.discard(node)
        return True

    def close(self) -> bool:
        """Every accusation withdrawn (True), or some left in etcd (etcd out of reach)."""
        tried = [self.withdraw(node) for node in list(self._written)]  # each one, whatever the others did
        return all(tried)

    def _key(self, peer: str) -> str:
        return self._keys.suspects(self.round, peer) + self._node
