"""An etcd outage while workers run does not touch them."""

from __future__ import annotations

import os
import time

import pytest

from rendezvous import EtcdServer

from .cli_helpers import PROBE, agent_args, finish, records, run_id, start, wait_for


@pytest.fixture
def own_etcd():
    with EtcdServer() as server:
        yield server


def test_workers_run_on_through_five_seconds_without_etcd(own_etcd, tmp_path):
    agent = start(agent_args(own_etcd.endpoints, run_id(), "1") + [PROBE, str(tmp_path), "--run", "9"])
    wait_for(lambda: len(records(str(tmp_path), 0)) == 2, 30, what="2 workers")
    beat = tmp_path / "beat-0"
    wait_for(beat.exists, 10, what="a heartbeat")
    own_etcd.stop_member(0)
    stopped = time.monotonic()
    seen = set()
    while time.monotonic() - stopped < 5:
        seen.add(beat.read_text())
        time.sleep(0.2)
    own_etcd.start_member(0)
    assert len(seen) >= 20, "the workers kept working while etcd was down"
    code, output = finish(agent, timeout=30)
    assert code == 0, output
    assert "re-rendezvous" not in output and "restarting" not in output
    assert sorted(os.listdir(tmp_path)) == ["0-0.json", "0-1.json", "beat-0", "beat-1"]  # one attempt only
