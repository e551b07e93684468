"""Figures the README states are the code's: each is read from the README and measured or looked up
here, so the README cannot drift from what the code does (the behaviour behind each is tested in
tests/integration: the history bound and the wait for etcd in test_history and test_client)."""

from __future__ import annotations

import re
from pathlib import Path

from rendezvous.history import DEFAULT_LIMIT
from rendezvous.settings import RendezvousSettings
from rendezvous.state import JobState, JobStatus, Participant

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _figure(pattern: str) -> float:
    match = re.search(pattern, README)
    assert match, f"the README no longer says {pattern!r}"
    return float(match.group(1))


def test_the_frozen_state_of_1024_nodes_is_the_size_the_readme_says():
    # node ids as default_node_id() makes them on a host named like node-0001 (18 characters), IPv4
    nodes = tuple(Participant(f"node-{i:04d}-{i * 7919 % 16**8:08x}", i, f"10.0.{i // 256}.{i % 256}", 8)
                  for i in range(1024))
    state = JobState("job-42", 7, JobStatus.RUNNING, 512, 1024, nodes, "10.0.0.0", 29500, restarts=1, max_restarts=3)
    size = len(state.encode())
    stated = _figure(r"\((\d+) KB at 1024 nodes")
    assert abs(size / 1000 - stated) < 1.0, f"{size} bytes at 1024 nodes; the README says {stated:g} KB"
    per_node = (size - len(JobState("job-42", 7, JobStatus.RUNNING, 512, 1024).encode())) / 1024
    assert per_node < 18 + 11 + 12, f"{per_node:.1f} bytes a node: more than the id, the address and a row's frame"


def test_the_history_keeps_as_many_records_as_the_readme_says():
    assert _figure(r"the newest (\d+)\s+records are kept") == DEFAULT_LIMIT == 1000


def test_agents_wait_for_etcd_as_long_and_say_so_as_often_as_the_readme_says():
    import inspect

    from rendezvous.client import EtcdClient

    assert _figure(r"wait for it \(`connect_timeout`, (\d+) s\)") == RendezvousSettings("job", 1, 1).connect_timeout
    every = inspect.signature(EtcdClient.wait_ready).parameters["every"].default
    assert _figure(r"saying so every (\d+) s") == every
