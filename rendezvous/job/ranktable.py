"""A frozen round's rank table: its rows in buckets, so that a node reads its own row and nothing else.

The job state (``state``) is the round's header: its number, master, world size, restart count and
the id of its table. The table itself is written, once, before the header that names it is
compare-and-swapped in:

    <prefix>/<run_id>/ranks/<table>/<bucket>   [[node, group_rank, addr, local_world_size, base_rank(, watch)], ...]

A node's bucket is ``crc32(node) % buckets``, with about ``ROWS_PER_BUCKET`` rows in each, so a
follower reads one small value to learn its group rank and the global rank of its first worker; the
coordinator, ``elastic-ctl status`` and ``get_state`` read the whole table (one range read). A
table is never changed once written: the header's CAS is the round's one commit, and the tables of
earlier rounds (and of a freeze that lost its CAS) are deleted when a later one commits.
Writes are split to stay inside etcd's limits (``--max-txn-ops`` 128, a 1.5 MiB request).

A row's optional ``watch`` lists the peers its node probes (``launcher.peers``): its ``WATCHERS``
successors in group-rank order among the nodes that answer probes, each as ``[node, probe
endpoint, lease id, watchers]`` -- where to probe it, the lease its watchers end once they all agree
it is dead, and how many watchers it has (how many must agree).
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from rendezvous.errors import RendezvousStateError
from rendezvous.etcd.client import EtcdClient
from rendezvous.etcd.endpoints import host_port
from rendezvous.etcd.txn import op_delete, op_put, prefix_range_end

from .keys import JobKeys
from .state import JobState, Participant, parse_json

__all__ = [
    "ROWS_PER_BUCKET",
    "WATCHERS",
    "Placement",
    "Target",
    "watch_lists",
    "bucket_count",
    "bucket_of",
    "encode_buckets",
    "decode_bucket",
    "new_table_id",
    "write_table",
    "read_placement",
    "read_table",
    "drop_other_tables",
]

ROWS_PER_BUCKET = 32  # rows per bucket: a follower reads about this many rows to find its own
MAX_OPS = 64  # puts per transaction: half of etcd's default --max-txn-ops
MAX_BYTES = 1 << 20  # bytes per transaction: under etcd's 1.5 MiB request limit
WATCHERS = 2  # peers probing each node: a machine's death is seen by this many, and needs them all to agree


class Target(NamedTuple):
    """A peer a node probes: where, the lease its death ends, and how many watchers it has."""

    node: str
    probe: str  # host:port
    lease: int
    watchers: int


class Placement(NamedTuple):
    """One node's row: its participant entry, the global rank of its local rank 0, and the peers it probes."""

    participant: Participant
    base_rank: int
    watch: tuple[Target, ...] = ()


def watch_lists(
    participants: Sequence[Participant], probes: Mapping[str, tuple[str, int]]
) -> dict[str, tuple[Target, ...]]:
    """Whom each node probes: a ring in group-rank order over the participants that answer probes
    (``probes``: node -> (endpoint, lease id)), each watching its next ``WATCHERS`` -- so each has
    that many watchers (fewer in a ring that small), and a job's probes are O(N)."""
    ring = [p.node for p in sorted(participants, key=lambda p: p.group_rank) if p.node in probes]
    k = min(WATCHERS, len(ring) - 1)
    lists: dict[str, tuple[Target, ...]] = {}
    for i, node in enumerate(ring):
        nexts = (ring[(i + step) % len(ring)] for step in range(1, k + 1))
        lists[node] = tuple(Target(n, *probes[n], k) for n in nexts)
    return lists


def bucket_count(size: int) -> int:
    """Buckets of a rank table of ``size`` rows: about ROWS_PER_BUCKET rows in each."""
    return max(1, -(-size // ROWS_PER_BUCKET))


def bucket_of(node: str, buckets: int) -> int:
    """The bucket of ``node``'s row: the same in every process (crc32, not Python's salted hash)."""
    return zlib.crc32(node.encode()) % buckets


def new_table_id(round_: int) -> str:
    """A table's id: the round, and a random part so that two coordinators racing never share one."""
    return f"{round_}-{uuid.uuid4().hex[:8]}"


def encode_buckets(
    participants: Sequence[Participant], buckets: int, watch: Mapping[str, tuple[Target, ...]] | None = None
) -> dict[int, bytes]:
    """Every bucket's value (an empty bucket is written too, so that a missing key means a lost table)."""
    rows: dict[int, list] = {b: [] for b in range(buckets)}
    base = 0
    for p in sorted(participants, key=lambda p: p.group_rank):
        row = [p.node, p.group_rank, p.addr, p.local_world_size, base]
        targets = (watch or {}).get(p.node)
        if targets:
            row.append([list(t) for t in targets])
        rows[bucket_of(p.node, buckets)].append(row)
        base += p.local_world_size
    return {b: json.dumps(r, separators=(",", ":")).encode() for b, r in rows.items()}


def decode_bucket(raw: bytes, where: str) -> list[Placement]:
    rows = parse_json(raw, where)
    if not isinstance(rows, list):
        raise RendezvousStateError(f"{where} is not a list of rows")
    out = []
    for row in rows:
        if type(row) is not list or len(row) not in (5, 6):
            raise RendezvousStateError(
                f"{where} is malformed: {row!r} is not [node, group_rank, addr, local_world_size, base_rank(, watch)]"
            )
        node, rank, addr, size, base = row[:5]
        if (
            type(node) is not str
            or type(addr) is not str
            or type(rank) is not int
            or type(size) is not int
            or type(base) is not int
            or rank < 0
            or size < 1
            or base < 0
        ):
            raise RendezvousStateError(f"{where} is malformed: row {row!r}")
        watch = _targets(row[5], where) if len(row) == 6 else ()
        out.append(Placement(Participant(node, rank, addr, size), base, watch))
    return out


def _targets(entries: object, where: str) -> tuple[Target, ...]:
    """A row's watch list, checked: ``[[node, "host:port", lease, watchers], ...]``."""
    ok = type(entries) is list and all(
        type(e) is list
        and len(e) == 4
        and type(e[0]) is str
        and type(e[1]) is str
        and host_port(e[1]) is not None
        and type(e[2]) is int
        and type(e[3]) is int
        and e[3] >= 1
        for e in entries
    )
    if not ok:
        raise RendezvousStateError(
            f"{where} is malformed: watch list {entries!r} is not [[node, host:port, lease, watchers], ...]"
        )
    return tuple(Target(*e) for e in entries)


def write_table(
    client: EtcdClient,
    keys: JobKeys,
    table: str,
    participants: Sequence[Participant],
    buckets: int,
    lease: int = 0,
    watch: Mapping[str, tuple[Target, ...]] | None = None,
) -> None:
    """Write a new table's buckets on ``lease`` (the job's), in as few transactions as etcd's limits allow."""
    batch: list = []
    size = 0
    for bucket, value in encode_buckets(participants, buckets, watch).items():
        key = keys.rank_bucket(table, bucket)
        if batch and (len(batch) >= MAX_OPS or size + len(value) + len(key) > MAX_BYTES):
            client.txn([], batch)
            batch, size = [], 0
        batch.append(op_put(key, value, lease=lease))
        size += len(value) + len(key)
    if batch:
        client.txn([], batch)


def read_placement(client: EtcdClient, keys: JobKeys, state: JobState, node: str) -> Placement | None:
    """``node``'s row in ``state``'s table (None: not a participant). RendezvousStateError when the
    bucket is gone or corrupt -- the caller reads the state again: a later round may have replaced it."""
    key = keys.rank_bucket(state.table, bucket_of(node, state.buckets))
    kv = client.get(key)
    if kv is None:
        raise RendezvousStateError(f"rank table bucket {key} is missing")
    for placement in decode_bucket(kv.value, f"rank table bucket {key}"):
        if placement.participant.node == node:
            return placement
    return None


def read_table(client: EtcdClient, keys: JobKeys, state: JobState, revision: int = 0) -> tuple[Participant, ...]:
    """Every participant of ``state``'s table in group-rank order (at ``revision``, 0: now)."""
    if not state.table:
        return ()
    prefix = keys.rank_table(state.table)
    kvs, _ = client.get_prefix(prefix, revision=revision)
    rows = [p.participant for kv in kvs for p in decode_bucket(kv.value, f"rank table bucket {kv.key!r}")]
    rows.sort(key=lambda p: p.group_rank)
    if len(kvs) != state.buckets or [p.group_rank for p in rows] != list(range(state.size)):
        raise RendezvousStateError(
            f"rank table {prefix} holds {len(rows)} rows in {len(kvs)} buckets; "
            f"the state says {state.size} in {state.buckets}"
        )
    return tuple(rows)


def drop_other_tables(keys: JobKeys, keep: str) -> list:
    """Delete operations for every table but ``keep`` (earlier rounds', and those of lost freezes)."""
    root, kept = keys.rank_tables.encode(), keys.rank_table(keep).encode()
    return [_delete_range(root, kept), _delete_range(prefix_range_end(kept), prefix_range_end(root))]


def _delete_range(start: bytes, end: bytes):
    op = op_delete(start)
    op.request_delete_range.range_end = end
    return op
