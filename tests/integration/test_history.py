"""The job's history in etcd: bounded, time-ordered, and never in the way of a round."""

from __future__ import annotations

import time

from rendezvous import EtcdClient
from rendezvous.etcd.txn import op_put
from rendezvous.job.history import Event, HistoryWriter, read_history
from rendezvous.job.keys import frame_state
from rendezvous.job.state import JobState, JobStatus, Keep
from tests.integration.rdzv_helpers import dead_endpoint


def _job(client: EtcdClient, root: str, lease: int = 0) -> str:
    """A job's state under ``root`` (a writer puts its records on the job's lease: none here)."""
    state = JobState(run_id="job", round=1, status=JobStatus.RUNNING, min_nodes=1, max_nodes=1, keep=Keep(lease))
    client.put(root + "state", frame_state(state.encode()), lease=lease)
    return root


def test_the_newest_records_are_kept_in_time_order(etcd_client, key_prefix):
    root = _job(etcd_client, f"{key_prefix}/job/")
    writer = HistoryWriter(etcd_client, root, "n1", limit=10)
    for i in range(25):
        writer.record("round_frozen", i, world_size=i)
    writer.close(timeout=10)
    events, _ = read_history(etcd_client, root)
    assert [e.round for e in events] == list(range(15, 25))
    assert all(a.time <= b.time for a, b in zip(events, events[1:]))
    assert events[-1].as_dict() == {
        "time": events[-1].time,
        "round": 24,
        "node": "n1",
        "kind": "round_frozen",
        "world_size": 24,
    }


def test_records_that_are_not_ours_are_skipped(etcd_client, key_prefix):
    root = _job(etcd_client, f"{key_prefix}/job/")
    etcd_client.put(f"{root}history/00000000000000000001-x", b"not json")
    good = Event(time.time(), 3, "n2", "node_joined")
    etcd_client.put(good.key(root), good.encode())
    events, _ = read_history(etcd_client, root)
    assert [(e.round, e.node, e.kind) for e in events] == [(3, "n2", "node_joined")]


def test_a_record_goes_on_the_jobs_lease_and_none_is_written_for_a_job_that_is_gone(etcd_client, key_prefix):
    lease = etcd_client.grant_lease(60)
    root = _job(etcd_client, f"{key_prefix}/job/", lease)
    gone = f"{key_prefix}/gone/"
    for where in (root, gone):
        writer = HistoryWriter(etcd_client, where, "n1")
        writer.record("node_left", 1, reason="finished")
        writer.close(timeout=10)
    (record,), _ = etcd_client.get_prefix(root + "history/")
    assert record.lease == lease
    assert etcd_client.count_prefix(gone) == 0
    etcd_client.revoke_lease(lease)
    assert etcd_client.count_prefix(root) == 0


def test_recording_never_blocks_and_a_failed_write_is_said_once():
    said: list[str] = []
    client = EtcdClient(dead_endpoint(), timeout=0.5)
    writer = HistoryWriter(client, "/elastic/job/", "n1", report=said.append)
    started = time.monotonic()
    for i in range(3):
        writer.record("worker_failed", 1, rank=i)
    assert time.monotonic() - started < 0.05, "record() waited for etcd"
    writer.close(timeout=15)
    client.close()
    assert len(said) == 1 and "could not write the job's history in etcd" in said[0], said


def test_the_agents_writer_keeps_the_newest_1000_records(etcd_client, key_prefix):
    root = _job(etcd_client, f"{key_prefix}/job/")
    old = [Event(1_000_000 + i, 1, "old", "round_frozen") for i in range(1000)]
    for start in range(0, len(old), 100):
        ops = [op_put(e.key(root), e.encode()) for e in old[start : start + 100]]
        etcd_client.txn([], ops)
    writer = HistoryWriter(etcd_client, root, "n1")  # the agent's: the default limit
    for i in range(5):
        writer.record("round_frozen", 2, world_size=i)
    writer.close(timeout=10)
    events, _ = read_history(etcd_client, root)
    assert len(events) == 1000
    assert [e.time for e in events[:995]] == [e.time for e in old[5:]]  # the 5 oldest went
    assert [e.node for e in events[995:]] == ["n1"] * 5


def test_the_cap_holds_exactly_when_many_writers_add_records_at_once(etcd_client, key_prefix):
    """200 agents' writers adding 2 records each to a full history: exactly the newest 1000 stay."""
    import threading

    root = _job(etcd_client, f"{key_prefix}/job/")
    old = [Event(1_000_000 + i, 1, "old", "round_frozen") for i in range(1000)]
    for start in range(0, len(old), 100):
        etcd_client.txn([], [op_put(e.key(root), e.encode()) for e in old[start : start + 100]])
    writers = [HistoryWriter(etcd_client, root, f"w{i:03d}") for i in range(200)]
    go = threading.Event()

    def add(writer: HistoryWriter) -> None:
        go.wait()
        writer.record("worker_failed", 2, rank=1)
        writer.record("worker_failed", 2, rank=2)
        writer.close(timeout=60)

    threads = [threading.Thread(target=add, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(90)
    events, _ = read_history(etcd_client, root)
    assert len(events) == 1000, len(events)
    assert sum(1 for e in events if e.node.startswith("w")) == 400  # every new record, and 600 of the old
