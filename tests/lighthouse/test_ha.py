"""Several elastic-lighthouse replicas on a 3-member etcd, replica groups stepping through them with
torchft's own client, and real faults: a replica SIGKILLed mid-quorum, one SIGSTOPped past the
heartbeat timeout and its lease, an etcd member cut. Every group finishes every step, each quorum id
has one member set, and no group sees an id go back."""

from __future__ import annotations

import signal
import time

import pytest

from ..faults.helpers import leader_index, signal_member
from .conftest import leading
from .groups import Group, check, same_per_step

pytest.importorskip("torchft", reason="torchft is not installed (pip install -e '.[torchft]')")

LEASE_TTL = 2
HEARTBEAT_MS = 1000
FLAGS = (
    "--min_replicas",
    "1",
    "--join_timeout_ms",
    "500",
    "--heartbeat_timeout_ms",
    str(HEARTBEAT_MS),
    "--lease-ttl",
    str(LEASE_TTL),
)


def start(cluster, replicas, rdzv_id: str, count: int = 3) -> list:
    return [replicas(cluster.endpoints, rdzv_id, *FLAGS) for _ in range(count)]


def step_until(groups: list[Group], step: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while min(g.done for g in groups) < step:
        assert time.monotonic() < deadline, f"groups stuck at {[g.done for g in groups]}"
        time.sleep(0.02)


def finish(groups: list[Group], timeout: float = 60) -> dict:
    for group in groups:
        assert group.join(timeout), f"{group.replica_id} stuck at step {group.done} ({group.failovers})"
    return check(groups)


def first_answer_after(groups: list[Group], moment: float) -> float:
    return min(s.at for g in groups for s in g.seen if s.at > moment) - moment


def test_a_replica_sigkilled_mid_quorum_costs_a_reconnect(cluster, replicas):
    lighthouses = start(cluster, replicas, "ha-kill")
    addresses = [lh.address() for lh in lighthouses]
    groups = [Group(f"g{i}", addresses, steps=120, start_at=i % 3).start() for i in range(4)]
    step_until(groups, 20)
    victim = leading(cluster.endpoints, "ha-kill", lighthouses)
    killed = time.monotonic()
    lighthouses[victim].signal(signal.SIGKILL)
    quorums = finish(groups)
    assert same_per_step(groups) > 80
    recovered = first_answer_after(groups, killed)
    print(f"leader SIGKILLed: next quorum after {recovered:.2f} s; quorum ids {sorted(quorums)}")
    assert recovered < LEASE_TTL + 2.0
    assert leading(cluster.endpoints, "ha-kill", lighthouses) != victim
    moved = [g for g in groups if g.failovers]
    assert moved, "no group talked to the killed replica"


def test_a_replica_stopped_past_its_lease_steps_down_and_issues_nothing_stale(cluster, replicas):
    lighthouses = start(cluster, replicas, "ha-stop")
    addresses = [lh.address() for lh in lighthouses]
    groups = [Group(f"g{i}", addresses, steps=150, start_at=i % 3, call_timeout=2.0).start() for i in range(4)]
    step_until(groups, 20)
    victim = leading(cluster.endpoints, "ha-stop", lighthouses)
    lighthouses[victim].signal(signal.SIGSTOP)
    stopped = time.monotonic()
    time.sleep(LEASE_TTL + HEARTBEAT_MS / 1000 + 1.5)
    lighthouses[victim].signal(signal.SIGCONT)
    quorums = finish(groups)
    for g in groups:
        print(g.replica_id, [(round(t - stopped, 2), why[:60]) for t, why in g.failovers])
    print(f"leader SIGSTOPped {LEASE_TTL + HEARTBEAT_MS / 1000 + 1.5:.1f} s: quorum ids {sorted(quorums)}")
    assert leading(cluster.endpoints, "ha-stop", lighthouses) != victim
    assert "stops leading" in lighthouses[victim].output() or "lease ended" in lighthouses[victim].output()


def test_an_etcd_member_cut_away(cluster, replicas):
    lighthouses = start(cluster, replicas, "ha-etcd")
    addresses = [lh.address() for lh in lighthouses]
    groups = [Group(f"g{i}", addresses, steps=150, start_at=i % 3).start() for i in range(4)]
    step_until(groups, 20)
    # the member every replica talks to first (the other two keep etcd's quorum)
    was_leader = leader_index(cluster) == 0
    signal_member(cluster, 0, signal.SIGKILL)
    cut = time.monotonic()
    step_until(groups, 60)
    quorums = finish(groups)
    assert same_per_step(groups) > 80
    gaps = [b.at - a.at for g in groups for a, b in zip(g.seen, g.seen[1:]) if b.at > cut]
    print(
        f"etcd member 0 (leader: {was_leader}) killed: longest step after it {max(gaps):.2f} s; "
        f"quorum ids {sorted(quorums)}"
    )
