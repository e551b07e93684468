"""Figures the README states are the code's: each is read from the README and measured or looked up
here, so the README cannot drift from what the code does (the behaviour behind each is tested in
tests/integration: the history bound and the wait for etcd in test_history and test_client)."""

from __future__ import annotations

import re

from rendezvous.job.history import DEFAULT_LIMIT
from rendezvous.job.ranktable import encode_buckets, new_table_id
from rendezvous.job.state import Keep, NodeInfo, Participant
from rendezvous.rounds.decide import LiveNode, frozen_state
from rendezvous.settings import RendezvousSettings
from tests.readme_quotes import DOCS as README  # noqa: E402 -- README.md and docs/*.md


def _figure(pattern: str) -> float:
    match = re.search(pattern, README)
    assert match, f"the README no longer says {pattern!r}"
    return float(match.group(1))


def _frozen(k: int):
    # node ids as default_node_id() makes them on a host named like node-0001 (18 characters), IPv4
    nodes = tuple(
        Participant(f"node-{i:04d}-{i * 7919 % 16**8:08x}", i, f"10.0.{i // 256 % 256}.{i % 256}", 8) for i in range(k)
    )
    live = [LiveNode(NodeInfo(p.node, 7, p.addr, 8, 29500), i) for i, p in enumerate(nodes)]
    keep = Keep(lease=7587881234567890123, retention=259200)  # an etcd lease id, the default retention
    return frozen_state(
        "job-42", 7, nodes, live, k // 2, k, restarts=1, max_restarts=3, table=new_table_id(7), keep=keep
    )


def test_what_every_node_reads_of_a_frozen_round_is_the_size_the_readme_says():
    header = _figure(r"reads the header \((\d+) bytes at 1024 nodes and at 16384\)")
    for k in (1024, 16384):
        assert abs(len(_frozen(k).encode()) - header) < 20, f"{len(_frozen(k).encode())} bytes of state at {k} nodes"
    state = _frozen(1024)
    buckets = encode_buckets(state.participants, state.buckets)
    average = sum(map(len, buckets.values())) / len(buckets)
    stated = _figure(r"bucket \(([\d.]+) KB on average at 1024 nodes")
    assert abs(average / 1000 - stated) < 0.1, (
        f"{average:.0f} bytes a bucket at 1024 nodes; the README says {stated:g} KB"
    )


def test_the_history_keeps_as_many_records_as_the_readme_says():
    assert _figure(r"the newest (\d+)\s+records are kept") == DEFAULT_LIMIT == 1000


def test_agents_wait_for_etcd_as_long_and_say_so_as_often_as_the_readme_says():
    import inspect

    from rendezvous.etcd.client import EtcdClient

    assert _figure(r"wait for it \(`connect_timeout`, (\d+) s\)") == RendezvousSettings("job", 1, 1).connect_timeout
    every = inspect.signature(EtcdClient.wait_ready).parameters["every"].default
    assert _figure(r"saying so every (\d+) s") == every
