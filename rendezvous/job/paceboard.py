"""The nodes' own-work paces in etcd (straggler scores), the keys and their JSON; what they mean is
``launcher.pace``:

    <job>/pace/<node>   {"round": 7, "fastest": 0.112, "slowest": 0.118, "rank": 3}

One key per node, on its agent's lease (gone with the node), overwritten in each round it runs: the
node's fastest and slowest local rank's pace (seconds of own work a step) and the slowest's rank.
A node writes only when its figures moved by more than 10 % (``scores.worth_writing``), so a job at
a steady pace writes nothing; every node follows the others' by one watch, and nobody polls. What
this module reads is JSON, checked on decode: a value that is not ours is ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from rendezvous.errors import RendezvousError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.watch import EventType, KeyRange, Watch

from .keys import JobKeys

__all__ = ["NodePace", "PaceBoard", "read_paces"]


@dataclass(frozen=True)
class NodePace:
    node: str
    round: int
    fastest: float  # seconds: its fastest local rank's pace
    slowest: float  # and its slowest's
    rank: int  # the slowest's global rank

    def encode(self) -> bytes:
        fastest, slowest = round(self.fastest, 6), round(self.slowest, 6)  # microseconds: enough, and short
        data = {"round": self.round, "fastest": fastest, "slowest": slowest, "rank": self.rank}
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def decode(node: str, raw: bytes) -> NodePace | None:
    """A node's pace from its key's value; None when the value is not one."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    round_, rank = data.get("round"), data.get("rank")
    fastest, slowest = data.get("fastest"), data.get("slowest")
    if not (type(round_) is int and type(rank) is int and _seconds(fastest) and _seconds(slowest)):
        return None
    return NodePace(node, round_, float(fastest), float(slowest), rank)


def read_paces(client: EtcdClient, keys: JobKeys) -> dict[str, NodePace]:
    """Every node's pace now, by node (for ``elastic-ctl status``)."""
    prefix = keys.pace()
    kvs, _ = client.get_prefix(prefix)
    found = (decode(kv.key.decode(errors="replace")[len(prefix) :], kv.value) for kv in kvs)
    return {pace.node: pace for pace in found if pace is not None}


class PaceBoard:
    """One agent's view of the others' paces (kept by a watch) and its own key."""

    def __init__(self, client: EtcdClient, keys: JobKeys, node: str) -> None:
        self._client, self._prefix, self._node = client, keys.pace(), node
        self._paces: dict[str, NodePace] = {}
        self._watch: Watch | None = None

    def _follow(self) -> None:
        kvs, revision = self._client.get_prefix(self._prefix)
        self._paces = {}
        for kv in kvs:
            self._take(kv.key, kv.value)
        self._watch = Watch(self._client, KeyRange(self._prefix, prefix=True), start_revision=revision + 1)

    def _take(self, key: bytes, value: bytes) -> None:
        node = key.decode(errors="replace")[len(self._prefix) :]
        pace = decode(node, value)
        if pace is not None and node != self._node:
            self._paces[node] = pace

    def others(self, round_: int) -> list[NodePace]:
        """The other nodes' paces in ``round_`` (read once, then kept by the watch)."""
        if self._watch is None:
            self._follow()
        for event in self._watch.drain():
            if event.type is EventType.RESYNC:
                self._watch.close(wait=False)
                self._follow()
                break
            if event.type is EventType.PUT:
                self._take(event.key, event.value)
            else:
                self._paces.pop(event.key.decode(errors="replace")[len(self._prefix) :], None)
        return [pace for pace in self._paces.values() if pace.round == round_]

    def publish(self, pace: NodePace, lease: int) -> None:
        self._client.put(self._prefix + self._node, pace.encode(), lease=lease)

    def close(self) -> None:
        if self._watch is not None:
            try:
                self._watch.close(wait=False)
            except RendezvousError:
                pass
            self._watch = None
