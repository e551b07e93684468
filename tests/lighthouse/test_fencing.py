"""Safety across replicas, each fault held past the timeouts that would hide it: a leader frozen
past its lease does not answer with the quorum it had when it froze (it is fenced), and a new leader
goes on from the last id issued (kept in etcd, not in memory): one member set per id, ids never back."""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta

import pytest

from .conftest import leading

pytest.importorskip("torchft", reason="torchft is not installed (pip install -e '.[torchft]')")

FLAGS = ("--min_replicas", "1", "--join_timeout_ms", "200", "--heartbeat_timeout_ms", "1000", "--lease-ttl", "2")


def ask(address: str, replica_id: str, timeout: float = 10.0):
    from torchft._torchft import LighthouseClient

    client = LighthouseClient(addr=address, connect_timeout=timedelta(seconds=5))
    quorum = client.quorum(replica_id=replica_id, timeout=timedelta(seconds=timeout), step=1, world_size=1)
    return int(quorum.quorum_id), tuple(sorted(m.replica_id for m in quorum.participants))


def test_a_frozen_leader_is_fenced_and_the_next_one_goes_on_from_the_record(etcd_endpoints, replicas):
    rdzv_id = f"fence-{time.monotonic_ns()}"
    pair = [replicas(etcd_endpoints, rdzv_id, *FLAGS) for _ in range(2)]
    old = leading(etcd_endpoints, rdzv_id, pair)
    other = 1 - old
    first = ask(pair[old].address(), "x")
    assert first == (1, ("x",))

    pair[old].signal(signal.SIGSTOP)  # past its 2 s lease: the other replica takes over
    try:
        assert leading(etcd_endpoints, rdzv_id, pair, not_=old) == other
        second = ask(pair[other].address(), "y")
        # the new leader read the record: y's quorum (members changed) is id 2, not a second id 1
        assert second == (2, ("y",)), f"the new leader issued {second} after {first}"

        # x asks the frozen leader again; it reads the request when it thaws, with its old quorum {x}
        # (id 1) in memory: answering from it would send an id back. Fenced, it hands x over.
        got: list = []
        asking = threading.Thread(target=lambda: got.append(ask(pair[old].address(), "x")))
        asking.start()
        time.sleep(0.5)
    finally:
        pair[old].signal(signal.SIGCONT)
    asking.join(20)
    assert got, "x got no quorum"
    third = got[0]
    assert third[0] > second[0], f"x got quorum {third} after {second} was issued: an id went back"
    assert third[1] == ("x",) or "y" in third[1]
    assert "stops leading" in pair[old].output()


def status_port(replica) -> int:
    """The port of the replica's status page, from its first line."""
    import re

    return int(re.search(r"status page on port (\d+)", replica.output()).group(1))


def status_of(replica) -> dict:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{status_port(replica)}/status.json", timeout=5) as answer:
        return json.loads(answer.read())


def waits_for(leader, participants: int, within: float = 10.0) -> None:
    """Until the leader's status says it has ``participants`` asking (bounded)."""
    deadline = time.monotonic() + within
    while f"only have {participants} participants" not in (said := status_of(leader)["quorum_status"]):
        assert time.monotonic() < deadline, f"waiting for {participants} participants, the leader says: {said}"
        time.sleep(0.02)


def b_asks_through(follower, leader) -> tuple[threading.Thread, list[Exception]]:
    """b's quorum call through ``follower``, in a thread, once it is at the leader; the error it
    ends with goes in the list (the tests kill the follower under it)."""
    failed: list[Exception] = []

    def ask_b() -> None:
        try:
            ask(follower.address(), "b", timeout=30)
        except Exception as exc:
            failed.append(exc)

    asking = threading.Thread(target=ask_b, daemon=True)
    asking.start()
    waits_for(leader, 1)  # b's request, forwarded, is at the leader
    return asking, failed


def test_a_group_whose_replica_died_while_it_asked_is_in_no_quorum(etcd_endpoints, replicas):
    """b asks through a follower that is SIGKILLed before the quorum is decided; a and c then ask the
    leader: their quorum is (a, c). One that named b, which never hears of it, would have a and c
    wait for b in their first collective until torchft's timeout ends their step (or their job)."""
    from torchft._torchft import LighthouseClient

    rdzv_id = f"gone-{time.monotonic_ns()}"
    flags = ("--min_replicas", "1", "--join_timeout_ms", "300", "--heartbeat_timeout_ms", "10000", "--lease-ttl", "2")
    pair = [replicas(etcd_endpoints, rdzv_id, *flags) for _ in range(2)]
    lead = leading(etcd_endpoints, rdzv_id, pair)
    leader, follower = pair[lead], pair[1 - lead]
    for rid in ("a", "c"):  # heard: b alone is no majority, and waits
        LighthouseClient(addr=leader.address(), connect_timeout=timedelta(seconds=5)).heartbeat(rid)
    asking, failed = b_asks_through(follower, leader)
    follower.signal(signal.SIGKILL)
    asking.join(10)
    assert failed, "b's call outlived its replica"
    waits_for(leader, 0, within=3.0)  # b no longer asks, long before its heartbeat would expire
    both: list = []
    pairs = [threading.Thread(target=lambda r=rid: both.append(ask(leader.address(), r)), daemon=True) for rid in "ac"]
    for thread in pairs:
        thread.start()
    for thread in pairs:
        thread.join(20)
    assert both == [(1, ("a", "c"))] * 2, f"a and c got {both}"
    assert "Quorum request of b withdrawn" in leader.output(), leader.output()


def test_a_group_whose_answer_died_with_its_replica_gets_that_quorum_on_retry(etcd_endpoints, replicas):
    """b asks through a follower, which is frozen before the leader's answer reaches it and then
    killed: the quorum (a, b) was issued, a got it and is in its step with b. b's Manager retries
    with the same request, at a replica that is alive, and gets that quorum at once; were it asking
    for a next one, it would wait for a, who waits for b."""
    rdzv_id = f"lost-{time.monotonic_ns()}"
    flags = ("--min_replicas", "2", "--join_timeout_ms", "300", "--heartbeat_timeout_ms", "10000", "--lease-ttl", "2")
    pair = [replicas(etcd_endpoints, rdzv_id, *flags) for _ in range(2)]
    lead = leading(etcd_endpoints, rdzv_id, pair)
    leader, follower = pair[lead], pair[1 - lead]
    asking, failed = b_asks_through(follower, leader)
    follower.signal(signal.SIGSTOP)
    try:
        assert ask(leader.address(), "a") == (1, ("a", "b"))
    finally:
        follower.signal(signal.SIGKILL)  # not kill(), which thaws it first: it could relay the answer
    asking.join(10)
    assert failed, "b got an answer through a frozen replica"
    started = time.monotonic()
    assert ask(leader.address(), "b", timeout=5) == (1, ("a", "b"))
    assert time.monotonic() - started < 2.0, "b's retry waited for a next quorum"
    assert "Quorum 1 again for b" in leader.output(), leader.output()


def test_status_page_and_bad_input(etcd_endpoints, replicas):
    """The status page of a leader and a follower (HTML and JSON), a kill of a replica not in the
    quorum refused in one line, and a malformed gRPC request refused with INVALID_ARGUMENT."""
    import urllib.error
    import urllib.request

    import grpc

    rdzv_id = f"status-{time.monotonic_ns()}"
    pair = [replicas(etcd_endpoints, rdzv_id, *FLAGS) for _ in range(2)]
    lead = leading(etcd_endpoints, rdzv_id, pair)
    assert ask(pair[lead].address(), "x") == (1, ("x",))
    pages = {}
    for index, replica in enumerate(pair):
        port = status_port(replica)
        pages[index] = status_of(replica)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
            assert "Current quorum_id: 1" in answer.read().decode()
    assert pages[lead]["leads"] and not pages[1 - lead]["leads"]
    for page in pages.values():
        assert page["quorum_id"] == 1 and [p["replica_id"] for p in page["participants"]] == ["x"]
    assert "x" in pages[lead]["heartbeats"]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/replica/nobody/kill", method="POST")
    try:
        urllib.request.urlopen(request, timeout=5)
        raise AssertionError("killing an unknown replica was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404 and exc.read().decode() == "replica nobody is not in the last quorum\n"
    with grpc.insecure_channel(pair[lead].target) as channel:
        call = channel.unary_unary("/torchft.LighthouseService/Quorum")
        try:
            call(b"\xff\xff\xff", timeout=5)
            raise AssertionError("a malformed request was answered")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.details() == "not a LighthouseQuorumRequest"
        try:
            call(b"", timeout=5)  # a request with no requester
            raise AssertionError("a request without requester was answered")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.details() == "missing requester"


def test_bad_flags_are_one_line(etcd_endpoints):
    import socket
    import subprocess

    from .replicas import LIGHTHOUSE

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    cases = [
        ([], "Missing option '--min_replicas'"),
        (["--min_replicas", "1", "--bind", "nope"], "is not host:port"),
        (["--min_replicas", "-1"], "--min_replicas"),
        (["--min_replicas", "1", "--bind", f"127.0.0.1:{port}"], "cannot listen there (the port is in use"),
        (
            ["--min_replicas", "1", "--bind", "127.0.0.1:0", "--http-bind", f"127.0.0.1:{port}"],
            "status page cannot listen",
        ),
    ]
    for args, said in cases:
        argv = [LIGHTHOUSE, "--rdzv-endpoint", etcd_endpoints, *args]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert run.returncode == 2, (args, run.stderr)
        assert said in run.stderr and "Traceback" not in run.stderr, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    taken.close()


def test_steady_steps_and_heartbeats_write_nothing_to_etcd(etcd_endpoints, replicas):
    """Groups stepping with the same members, heartbeating every 100 ms through two replicas: no
    write under the lighthouse's keys (a quorum under the same id is checked, not written;
    heartbeats stay in the replicas). Counted by a watch on its prefix: other tests' keys may move
    the shared etcd's revision meanwhile (leases of replicas they killed expiring)."""
    from lighthouse.book import LighthouseKeys
    from rendezvous.etcd.client import EtcdClient
    from rendezvous.etcd.watch import Watch

    from .groups import Group, check

    rdzv_id = f"quiet-{time.monotonic_ns()}"
    pair = [replicas(etcd_endpoints, rdzv_id, *FLAGS) for _ in range(2)]
    groups = [
        Group(f"q{i}", [r.address() for r in pair], steps=100_000, start_at=i % 2, step_time=0.01).start()
        for i in range(3)
    ]
    with EtcdClient(etcd_endpoints, timeout=5) as client:
        deadline = time.monotonic() + 30
        while min(g.done for g in groups) < 50 or len({g.seen[-1].members for g in groups}) != 1:
            assert time.monotonic() < deadline, [g.done for g in groups]
            time.sleep(0.05)
        assert all(len(g.seen[-1].members) == 3 for g in groups)
        before, at = client.status().header.revision, min(g.done for g in groups)
        time.sleep(2.0)
        now = min(g.done for g in groups)
        with Watch(client, LighthouseKeys("/elastic", rdzv_id).root, start_revision=before + 1, prefix=True) as watch:
            time.sleep(0.5)  # the watch delivers what happened since ``before``
            writes = watch.drain()
    for group in groups:
        group.stop()
    for group in groups:
        group.join(30)
    check(groups, complete=False)
    assert now - at > 20, f"the groups made only {now - at} steps in 2 s"
    assert not writes, f"{len(writes)} etcd writes during {now - at} steady steps: {writes[:3]}"


def test_the_record_is_kept_while_in_use_and_vanishes_a_retention_after(etcd_endpoints, replicas):
    """With a 3 s retention: groups stepping under one id for longer keep the record (its lease is
    renewed by the leader, not only when the id changes); once every replica is gone, the
    lighthouse's keys vanish by themselves."""
    from lighthouse.book import LighthouseKeys
    from rendezvous.etcd.client import EtcdClient

    from .groups import Group, check

    rdzv_id = f"keep-{time.monotonic_ns()}"
    one = replicas(etcd_endpoints, rdzv_id, *FLAGS, "--rdzv-conf", "retention=3")
    keys = LighthouseKeys("/elastic", rdzv_id)
    groups = [Group(f"k{i}", [one.address()], steps=100_000, step_time=0.01).start() for i in range(2)]
    with EtcdClient(etcd_endpoints, timeout=5) as client:
        time.sleep(6.0)  # twice the retention, under one quorum id
        record = client.get(keys.quorum)
        assert record is not None, "the quorum record expired while the lighthouse was in use"
        assert client.lease_ttl(record.lease) > 0
        for group in groups:
            group.stop()
        for group in groups:
            group.join(30)
        quorums = check(groups, complete=False)
        assert len(quorums) <= 2  # one id for the whole run (two if the groups started apart)
        one.kill()
        deadline = time.monotonic() + 3 + 2 + 5  # retention, the replica's lease, slack
        while client.count_prefix(keys.root):
            assert time.monotonic() < deadline, [kv.key for kv in client.get_prefix(keys.root)[0]]
            time.sleep(0.2)
