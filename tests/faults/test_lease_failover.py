"""A lease's renewal when the leader freezes: renewed as soon as any member knows a new leader.

Six sessions on a real 3-member cluster, one for each order the endpoints can be listed in, so
that every session starts on a different member and meets the frozen leader at a different place
in its list. A renewal sent to a follower before the election hangs there for etcd's request
timeout (it is forwarded to the frozen leader), so only a session that asks again, of every
member, once a leader is known gets its renewal through inside one keep-alive interval.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time

import pytest

from rendezvous import EtcdClient
from rendezvous.etcd.session import Session, keep_alive_interval

from .helpers import leader_index, member_endpoint, signal_member

DEADLINE = 4.0  # renew deadline; the keep-alive interval is then 0.5 s (a job of 4096 nodes: 1.0 s)
SLACK = 0.4  # a round trip and the stream loop's scheduling, on a loaded machine


def _new_leader_known(cluster, frozen: int, old: int, limit: float) -> float:
    """When a member other than ``frozen`` first names a leader other than ``old`` (monotonic)."""
    others = [EtcdClient(member_endpoint(cluster, i), timeout=0.5) for i in range(3) if i != frozen]
    try:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            for client in others:
                try:
                    status = client.status()
                except Exception:  # noqa: BLE001 -- a member between leaders may not answer at once
                    continue
                if status.leader not in (0, old):
                    return time.monotonic()
            time.sleep(0.02)
    finally:
        for client in others:
            client.close()
    raise AssertionError(f"no new leader within {limit} s of freezing member {frozen}")


def _leader_id(cluster, index: int) -> int:
    client = EtcdClient(member_endpoint(cluster, index), timeout=2.0)
    try:
        return client.status().header.member_id
    finally:
        client.close()


# the keep-alive interval: a small job's (an eighth of the deadline), and a job of 4096 nodes' (a quarter)
INTERVALS = {"small job": keep_alive_interval(DEADLINE), "4096 nodes": keep_alive_interval(DEADLINE, 4096)}


@pytest.mark.parametrize("interval", INTERVALS.values(), ids=INTERVALS.keys())
def test_a_frozen_leader_delays_renewals_by_the_election_and_one_interval_only(cluster, interval):
    """A big job's renewals come further apart (``keep_alive_interval``): the election still costs it
    no fence -- a renewal gets through one interval after a leader is known, well inside the deadline."""
    orders = list(itertools.permutations(range(3)))
    acked: list[list[tuple[float, float]]] = [[] for _ in orders]  # (sent, answered) of each renewal
    lock = threading.Lock()
    clients, sessions = [], []
    try:
        for n, order in enumerate(orders):
            client = EtcdClient(",".join(member_endpoint(cluster, i) for i in order), timeout=5)
            clients.append(client)

            def note(_lease, deadline, n=n):  # the deadline is the send time of the answered renewal + DEADLINE
                with lock:
                    acked[n].append((deadline - DEADLINE, time.monotonic()))

            sessions.append(Session(client, 15, renew_deadline=DEADLINE, interval=interval, on_renew=note))
        time.sleep(1.5 + interval)
        leader = leader_index(cluster)
        old = _leader_id(cluster, leader)
        signal_member(cluster, leader, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            elected = _new_leader_known(cluster, leader, old, 10.0)
            time.sleep(DEADLINE)
        finally:
            signal_member(cluster, leader, signal.SIGCONT)
        with lock:
            first = [min((answered for sent, answered in times if sent > frozen), default=None) for times in acked]
        assert all(t is not None for t in first), f"a session renewed nothing in {DEADLINE} s: {first}"
        late = [t - elected for t in first]
        print(
            f"\nleader (member {leader}) frozen; a new leader known {elected - frozen:.2f} s later; the first "
            f"renewal sent since was answered {', '.join(f'{x:+.2f}' for x in late)} s from then "
            f"(sessions starting on members {', '.join(str(o[0]) for o in orders)})"
        )
        bound = sessions[0].interval + SLACK
        assert max(late) <= bound, f"a renewal got through {max(late):.2f} s after a leader was known (> {bound} s)"
        assert all(not s.overdue() for s in sessions), "a session missed its renew deadline"
    finally:
        for session in sessions:
            session.close()
        for client in clients:
            client.close()
