"""A round's hang cases in etcd: the keys and their JSON, nothing of the protocol that uses them
(that is ``launcher.hangs.cases``):

    <job>/hangs/<round>/s/<case>          the suspicion (created once; its creator decides)
    <job>/hangs/<round>/r/<case>/<node>   each node's report of its ranks
    <job>/hangs/<round>/v/<case>          the verdict (created once), which every node acts on
    <job>/beats/<node>                    a node's oldest heartbeat, for elastic-ctl status

Every key is on its writer's lease. Agents watch only suspicions and verdicts, so a case costs the
job K reports and one range read by the decider, not K events for each of K nodes. What this module
reads is JSON, checked on decode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.recipes import create_once
from rendezvous.etcd.watch import EventType, KeyRange, Watch

from .keys import JobKeys

__all__ = ["CaseEvent", "HangBoard", "HangChannel", "read_beats"]


@dataclass(frozen=True)
class CaseEvent:
    kind: str  # "suspect" or "verdict"
    case: int
    data: dict


def _decode(raw: bytes) -> dict | None:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _encode(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class HangBoard:
    """One round's hang cases, for one node."""

    def __init__(self, client: EtcdClient, keys: JobKeys, round_: int, node: str, lease_id: int) -> None:
        self._client = client
        self._prefix = keys.hangs(round_)
        self._node = node
        self._lease = lease_id
        existing, revision = client.get_prefix(self._prefix)
        self._pending = [e for e in (self._event(kv.key, kv.value) for kv in existing) if e is not None]
        self._watch = Watch(
            client,
            KeyRange(self._prefix + "s/", prefix=True),
            KeyRange(self._prefix + "v/", prefix=True),
            start_revision=revision + 1,
        )

    def _event(self, key: bytes, value: bytes) -> CaseEvent | None:
        rest = key.decode(errors="replace")[len(self._prefix) :]
        kind, _, case = rest.partition("/")
        data = _decode(value)
        if kind not in ("s", "v") or not case.isdigit() or data is None:
            return None  # a report, or a value that is not ours
        return CaseEvent("suspect" if kind == "s" else "verdict", int(case), data)

    def poll(self) -> list[CaseEvent]:
        """Suspicions and verdicts that arrived since the last poll, in order."""
        events, self._pending = self._pending, []
        for event in self._watch.drain():
            if event.type is EventType.PUT:
                found = self._event(event.key, event.value)
                if found is not None:
                    events.append(found)
        return events

    def _create(self, key: str, data: dict) -> tuple[bool, dict | None]:
        """Write ``key`` unless it exists; (whether we wrote it, the value that stands)."""
        created = create_once(self._client, key, _encode(data), lease=self._lease)
        if created.written:
            return True, data
        return False, _decode(created.current.value) if created.current is not None else None

    def suspect(self, case: int, data: dict) -> bool:
        """Open case ``case``; True when this node opened it (and so decides it)."""
        return self._create(f"{self._prefix}s/{case}", {**data, "node": self._node})[0]

    def report(self, case: int, data: dict) -> None:
        self._client.put(f"{self._prefix}r/{case}/{self._node}", _encode(data), lease=self._lease)

    def reports(self, case: int) -> list[dict]:
        kvs, _ = self._client.get_prefix(f"{self._prefix}r/{case}/")
        return [data for data in (_decode(kv.value) for kv in kvs) if data is not None]

    def settle(self, case: int, verdict: dict) -> dict | None:
        """Write the verdict unless one stands; the one that stands."""
        return self._create(f"{self._prefix}v/{case}", verdict)[1]

    def close(self) -> None:
        self._watch.close()


class HangChannel:
    """What an agent needs of etcd for hangs: each round's board, and its heartbeat summary."""

    def __init__(self, client: EtcdClient, keys: JobKeys, node: str) -> None:
        self._client, self._keys, self._node = client, keys, node

    def board(self, round_: int, lease_id: int) -> HangBoard:
        return HangBoard(self._client, self._keys, round_, self._node, lease_id)

    def publish(self, lease_id: int, summary: dict[str, Any]) -> None:
        """This node's heartbeat summary (``oldest``: the wall time of its oldest last heartbeat)."""
        self._client.put(self._keys.beats + self._node, _encode(summary), lease=lease_id)


def read_beats(client: EtcdClient, keys: JobKeys) -> dict[str, dict]:
    """Every node's heartbeat summary, by node; values that are not ours are left out."""
    kvs, _ = client.get_prefix(keys.beats)
    found = {}
    for kv in kvs:
        data = _decode(kv.value)
        if data is not None and isinstance(data.get("oldest"), (int, float)):
            found[kv.key.decode(errors="replace")[len(keys.beats) :]] = data
    return found
