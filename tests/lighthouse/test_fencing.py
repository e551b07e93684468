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
