"""Fixtures of the lighthouse suite: replicas that are always killed at the end."""

from __future__ import annotations

import pytest

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
