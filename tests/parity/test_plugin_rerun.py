"""The ``etcd-v3`` torchrun handler's job lifetime, with torch's own DynamicRendezvousHandler over
a real etcd: a finished job's id runs again at once on a new launch (as torch's c10d backend
allows), a node of the finished run is still told it closed, the new run reads none of the old
run's store keys, and every key the handler writes is on a lease that ends by itself."""

from __future__ import annotations

import json
import uuid

import pytest
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousParameters

from rendezvous import EtcdClient
from rendezvous.job.keys import JobKeys
from rendezvous.torchrun.lifetime import TTL
from rendezvous.torchrun.plugin import create_handler


def _handler(endpoints: str, run_id: str):
    params = RendezvousParameters("etcd-v3", endpoints, run_id, 1, 1, local_addr="127.0.0.1", last_call_timeout=1)
    return create_handler(params)


@pytest.fixture
def run_id() -> str:
    return f"rerun-{uuid.uuid4().hex[:8]}"


def test_a_finished_jobs_id_runs_again_on_a_new_launch_and_reads_nothing_of_the_old_run(etcd_endpoints, run_id):
    first = _handler(etcd_endpoints, run_id)
    info = first.next_rendezvous()
    info.store.set("left-by-the-first-run", b"stale")
    assert first.shutdown()  # torch's agent closes the rendezvous as the job ends
    second = _handler(etcd_endpoints, run_id)  # the same command line, run again
    again = second.next_rendezvous()
    assert again.rank == 0 and again.world_size == 1
    assert not again.store.check(["left-by-the-first-run"]), "the new run read a key of the old one"
    second.shutdown()


@pytest.mark.parametrize("rerun", [False, True], ids=["the old state stands", "a new run replaced it"])
def test_a_node_of_the_finished_run_is_told_it_closed_and_never_joins_a_new_one(etcd_endpoints, run_id, rerun):
    first = _handler(etcd_endpoints, run_id)
    first.next_rendezvous()
    late = _handler(etcd_endpoints, run_id)
    late.num_nodes_waiting()  # its first look at the state: while the run is open
    first.shutdown()
    if rerun:
        again = _handler(etcd_endpoints, run_id)
        again.next_rendezvous()  # a new launch of the same id runs, over the closed state
    with pytest.raises(RendezvousClosedError):
        late.next_rendezvous()


def test_the_handlers_keys_are_on_a_lease_of_two_hours(etcd_endpoints, run_id):
    handler = _handler(etcd_endpoints, run_id)
    info = handler.next_rendezvous()
    info.store.set("a-key", b"1")
    keys = JobKeys("/elastic", run_id)
    with EtcdClient(etcd_endpoints) as client:
        written, _ = client.get_prefix(keys.root)
        names = sorted(kv.key.decode() for kv in written)
        assert keys.state in names and any(name.endswith("a-key") for name in names), names
        for kv in written:
            assert kv.lease != 0, f"{kv.key!r} is on no lease"
            assert TTL - 60 <= client.lease_ttl(kv.lease) <= TTL, client.lease_ttl(kv.lease)
    handler.shutdown()


def test_elastic_ctl_status_shows_a_torchrun_job_without_unpickling_it(etcd_endpoints, run_id):
    from tests.e2e.cli_helpers import run

    handler = _handler(etcd_endpoints, run_id)
    info = handler.next_rendezvous()
    shown = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", run_id], tool_name="elastic-ctl")
    assert shown.returncode == 0, shown.stderr
    assert "started by torchrun's etcd-v3 handler" in shown.stdout and "running, round 0" in shown.stdout, shown.stdout
    assert shown.stdout.splitlines()[-1].split()[:2] == ["0", "127.0.0.1"], shown.stdout  # rank 0, its address
    handler.shutdown()
    as_json = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", run_id, "--json"], tool_name="elastic-ctl")
    view = json.loads(as_json.stdout)
    assert view["closed"] is True and view["participants"][0]["rank"] == info.rank == 0, view
