"""The rank table's layout without etcd: which bucket holds a node, what a row says, what a follower reads."""

import json
import zlib

import pytest

from rendezvous.errors import RendezvousStateError
from rendezvous.etcd.txn import prefix_range_end
from rendezvous.job.keys import JobKeys
from rendezvous.job.ranktable import (
    ROWS_PER_BUCKET,
    Placement,
    bucket_count,
    bucket_of,
    decode_bucket,
    drop_other_tables,
    encode_buckets,
)
from rendezvous.job.state import Participant


def _participants(k: int, lws=lambda i: 1 + i % 3):
    return tuple(
        Participant(f"node-{i:05d}-{i * 7919 % 16**8:08x}", i, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", lws(i))
        for i in range(k)
    )


def test_a_nodes_bucket_is_the_same_in_every_process():
    # crc32, not Python's hash(), which is salted per process
    assert bucket_of("node-a", 7) == zlib.crc32(b"node-a") % 7
    assert bucket_of("node-a", 1) == 0


def test_every_node_finds_its_row_and_the_global_rank_of_its_first_worker_in_its_own_bucket():
    members = _participants(300)
    buckets = bucket_count(len(members))
    values = encode_buckets(members, buckets)
    assert sorted(values) == list(range(buckets))
    base = 0
    for p in members:
        rows = decode_bucket(values[bucket_of(p.node, buckets)], "bucket")
        assert Placement(p, base) in rows
        base += p.local_world_size


@pytest.mark.parametrize("k", [1, 64, 1024, 16384])
def test_what_a_follower_reads_stays_small_at_any_size(k):
    members = _participants(k)
    values = encode_buckets(members, bucket_count(k))
    biggest = max(len(v) for v in values.values())
    rows = max(len(json.loads(v)) for v in values.values())
    assert rows <= 3 * ROWS_PER_BUCKET, f"{rows} rows in one bucket at K={k}"
    assert biggest <= 3 * ROWS_PER_BUCKET * 64, f"{biggest} bytes in one bucket at K={k}"
    assert sum(len(json.loads(v)) for v in values.values()) == k


def test_an_empty_bucket_is_written_so_that_a_missing_one_means_a_lost_table():
    values = encode_buckets(_participants(3), 8)
    assert len(values) == 8 and values[next(b for b in range(8) if values[b] == b"[]")] == b"[]"


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"{", "not valid JSON"),
        (b'{"a": 1}', "not a list of rows"),
        (b'[["a", 0, "h", 1]]', "is not \\[node, group_rank"),
        (b'[["a", 0, "h", 0, 0]]', "malformed: row"),
        (b'[["a", -1, "h", 1, 0]]', "malformed: row"),
        (b'[["a", 0, 7, 1, 0]]', "malformed: row"),
    ],
)
def test_a_bucket_that_is_not_rows_is_refused_naming_it(raw, fragment):
    with pytest.raises(RendezvousStateError, match=fragment):
        decode_bucket(raw, "bucket x")


def test_dropping_other_tables_spares_the_one_kept():
    keys = JobKeys("/e", "job")
    first, second = drop_other_tables(keys, "7-abc")
    kept = keys.rank_table("7-abc").encode()
    assert first.request_delete_range.key == keys.rank_tables.encode()
    assert first.request_delete_range.range_end == kept  # up to the kept table, exclusive
    assert second.request_delete_range.key == prefix_range_end(kept)  # from just after it
    assert second.request_delete_range.range_end == prefix_range_end(keys.rank_tables)
