"""Fixtures of the lighthouse suite: replicas that are always killed at the end, a 3-member etcd."""

from __future__ import annotations

import json
import time

import pytest

from lighthouse.book import LighthouseKeys
from rendezvous.etcd.client import EtcdClient

from ..faults.conftest import cluster  # noqa: F401 -- the fault suite's 3-member etcd, as a fixture here
from .replicas import Lighthouse


@pytest.fixture
def replicas(tmp_path):
    started: list[Lighthouse] = []

    def start(endpoints: str, rdzv_id: str, *args: str) -> Lighthouse:
        replica = Lighthouse(endpoints, rdzv_id, tmp_path, *args)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.kill()


def leading(endpoints: str, rdzv_id: str, replicas: list, *, not_: int | None = None) -> int:
    """The index of the replica that leads now (its name ends with its pid); with ``not_``, the
    first one that is not that one. A replica is a Lighthouse or a process (psutil, Popen)."""
    client = EtcdClient(endpoints, timeout=5)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            kv = client.get(LighthouseKeys("/elastic", rdzv_id).leader)
            if kv is not None:
                pid = int(json.loads(kv.value)["name"].rsplit("-", 1)[1])
                for index, replica in enumerate(replicas):
                    if getattr(replica, "process", replica).pid == pid and index != not_:
                        return index
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError("no replica leads")
