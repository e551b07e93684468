"""The etcd c10d store, tested the way torch tests its own stores (set/get/check, add, compare_set,
timeouts, prefix stores, and a process group bootstrapped from it)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
import torch.distributed as dist

from rendezvous import EtcdClient
from rendezvous.torchrun.plugin import EtcdStore

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def make_store(etcd_endpoints, key_prefix):
    clients = []
    run_id = f"store-{uuid.uuid4().hex[:8]}"

    def make(timeout: float = 30.0) -> EtcdStore:
        client = EtcdClient(etcd_endpoints, timeout=5)
        clients.append(client)
        return EtcdStore(client, run_id, key_prefix=key_prefix, timeout=timedelta(seconds=timeout))

    yield make
    for client in clients:
        client.close()


def test_set_get_check(make_store):
    store = make_store()
    store.set("key0", "value0")
    store.set("key1", b"value1")
    store.set("key2", "value2")
    assert store.get("key0") == b"value0"
    assert store.get("key1") == b"value1"
    assert store.get("key2") == b"value2"
    assert store.check(["key0", "key1"]) and not store.check(["key0", "missing"])
    assert store.num_keys() == 3
    assert store.delete_key("key1") is True and store.delete_key("key1") is False
    assert store.num_keys() == 2
    store.set("key0", b"\x00\xffbinary")
    assert store.get("key0") == b"\x00\xffbinary"


def test_add_is_atomic_across_clients(make_store):
    stores = [make_store() for _ in range(8)]
    assert stores[0].add("counter", 5) == 5

    def bump(store):
        for _ in range(25):
            store.add("counter", 1)

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert stores[1].add("counter", 0) == 205
    assert stores[2].get("counter") == b"205"
    assert stores[3].add("negative", -3) == -3


def test_compare_set(make_store):
    store = make_store()
    assert store.compare_set("cs", "", "first") == b"first"  # absent + empty expected: set
    assert store.compare_set("cs", "wrong", "second") == b"first"  # mismatch: current value
    assert store.compare_set("cs", "first", "second") == b"second"
    assert store.get("cs") == b"second"
    assert store.compare_set("absent", "expected", "x") == b"expected"  # absent + non-empty: expected
    assert not store.check(["absent"])


def test_get_waits_for_a_later_set(make_store):
    reader, writer = make_store(), make_store()
    threading.Timer(0.3, writer.set, args=("late", "here")).start()
    started = time.monotonic()
    assert reader.get("late") == b"here"
    assert 0.2 < time.monotonic() - started < 5


def test_get_and_wait_time_out(make_store):
    store = make_store(timeout=0.5)
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="'nothing'"):
        store.get("nothing")
    assert time.monotonic() - started < 3
    with pytest.raises(dist.DistStoreError):
        store.wait(["a", "b"], timedelta(seconds=0.3))
    store.set("a", "1")
    store.set("b", "2")
    store.wait(["a", "b"], timedelta(seconds=0.3))


def test_torchs_set_get_sequence_and_key_count(make_store):
    """torch's StoreTestBase set/get case: adds and sets mixed, 5 keys, a key with a leading dash."""
    store = make_store()
    for amount in (1, 2, 3):
        store.add("key", amount)
    store.set("key0", "value0")
    store.add("key3", 1)
    store.set("key1", "value1")
    store.add("key3", 2)
    store.set("key2", "value2")
    for amount in (3, 4, 5, 6):
        store.add("key3", amount)
    assert store.num_keys() == 5
    assert [store.get(k) for k in ("key", "key0", "key1", "key2", "key3")] == [
        b"6",
        b"value0",
        b"value1",
        b"value2",
        b"21",
    ]
    store.set("-key3", "7")
    assert store.get("-key3") == b"7"
    store.delete_key("-key3")
    assert store.num_keys() == 5
    assert sorted(store.list_keys()) == ["key", "key0", "key1", "key2", "key3"]


def test_a_simple_wait_times_out_with_the_word_timeout(make_store):
    store = make_store()
    with pytest.raises(RuntimeError, match="[t -i]imeout"):  # torch's own check of every store
        store.wait(["bad_key"], timedelta(seconds=0.25))
    store.add("good_key", 1)
    store.wait(["good_key"])


def test_queues_are_fifo_across_clients_and_a_pop_waits_for_a_push(make_store):
    producer, consumer = make_store(), make_store(timeout=5)
    with pytest.raises(dist.QueueEmptyError):
        consumer.queue_pop("q", False)
    for item in ("a", b"b", "c"):
        producer.queue_push("q", item)
    assert consumer.queue_len("q") == 3 and producer.num_keys() == 0  # queues are not keys, as in torch's stores
    assert [consumer.queue_pop("q") for _ in range(3)] == [b"a", b"b", b"c"]
    threading.Timer(0.3, lambda: producer.queue_push("q", "late")).start()
    started = time.monotonic()
    assert consumer.queue_pop("q") == b"late"
    assert 0.2 < time.monotonic() - started < 5
    consumer.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(dist.DistStoreError, match="timeout"):
        consumer.queue_pop("empty")


def test_a_queue_holding_items_answers_check_and_wait_as_torchs_store(make_store):
    theirs, ours, producer = dist.HashStore(), make_store(), make_store()
    answers = {}
    for name, store, push in (("torch", theirs, theirs), ("ours", ours, producer)):
        before = store.check(["foo"])
        push.queue_push("foo", "x")
        store.wait(["foo"], timedelta(seconds=2))  # returns: the queue holds an item
        during = store.check(["foo"])
        store.queue_pop("foo")
        answers[name] = (before, during, store.check(["foo"]))
    assert answers["ours"] == answers["torch"] == (False, True, False)
    threading.Timer(0.3, lambda: producer.queue_push("later", "y")).start()
    started = time.monotonic()
    ours.wait(["later"], timedelta(seconds=5))  # a queue that gets its first item while waiting
    assert 0.2 < time.monotonic() - started < 5
    with pytest.raises(dist.DistStoreError, match="timeout"):
        ours.wait(["never"], timedelta(seconds=0.3))


def test_concurrent_consumers_each_get_an_item_once(make_store):
    producer = make_store()
    for i in range(20):
        producer.queue_push("work", str(i))
    taken: list[bytes] = []
    lock = threading.Lock()

    def consume(store):
        while True:
            try:
                item = store.queue_pop("work", False)
            except dist.QueueEmptyError:
                return
            with lock:
                taken.append(item)

    threads = [threading.Thread(target=consume, args=(make_store(),)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(taken, key=int) == [str(i).encode() for i in range(20)]


def test_append_and_multi_get_set(make_store):
    store = make_store()
    store.append("log", "a")
    store.append("log", b"b")
    store.multi_set(["x", "y"], ["1", b"2"])
    assert store.multi_get(["log", "x", "y"]) == [b"ab", b"1", b"2"]


def test_prefix_store_over_it(make_store):
    base = make_store()
    prefixed = dist.PrefixStore("job", base)
    prefixed.set("k", "v")
    assert base.get("job/k") == b"v"
    assert prefixed.get("k") == b"v"
    assert prefixed.add("n", 2) == 2


WORKER = """
import sys
from datetime import timedelta
import torch, torch.distributed as dist
from rendezvous import EtcdClient
from rendezvous.torchrun.plugin import EtcdStore
endpoints, run_id, prefix, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = EtcdStore(EtcdClient(endpoints), run_id, key_prefix=prefix, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(int(t.item()))
dist.destroy_process_group()
"""


def test_a_gloo_process_group_bootstraps_from_it(etcd_endpoints, key_prefix):
    run_id = f"pg-{uuid.uuid4().hex[:8]}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, etcd_endpoints, run_id, key_prefix, str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == ["3", "3"]
