"""The same command run twice: a new launch of a closed job's id begins a new run of it (as torchrun's
c10d allows), against real etcd -- once no node of the old run is alive, never for a node launched
before the job closed, never for a job an operator closed; the old run's history stays readable."""

from __future__ import annotations

import threading
import time

import pytest

from rendezvous import RendezvousClosedError
from rendezvous.etcd.client import EtcdClient
from rendezvous.job.history import RERUN, last_run, read_history
from rendezvous.job.keys import JobKeys
from rendezvous.job.state import CLOSED_BY_OPERATOR, JobStatus
from rendezvous.rounds.join import RendezvousInfo
from rendezvous.rounds.view import get_state
from tests.integration.rdzv_helpers import Nodes


@pytest.fixture
def nodes(etcd_endpoints, key_prefix):
    group = Nodes(etcd_endpoints, key_prefix, min_nodes=2, max_nodes=2, last_call_timeout=0.3, join_timeout=20)
    yield group
    group.close()


def _finished_run(nodes: Nodes, reason: str = "the job finished", **closing) -> None:
    first = [nodes.add("a"), nodes.add("b")]
    for value in nodes.rendezvous(first).values():
        assert isinstance(value, RendezvousInfo), value
    first[0].set_closed(reason, **closing)
    for handler in first:
        handler.shutdown()  # its agent exits: its node key goes with its lease


def test_a_new_launch_of_a_finished_jobs_id_runs_again_and_keeps_the_old_runs_history(nodes, etcd_endpoints):
    _finished_run(nodes)
    client = EtcdClient(etcd_endpoints, timeout=5)
    keys = JobKeys(nodes.settings.key_prefix, nodes.settings.run_id)
    client.put(keys.store + "left-by-the-first-run", b"stale")
    again = nodes.rendezvous([nodes.add("c"), nodes.add("d")])  # the same command line, launched again
    assert sorted(info.group_rank for info in again.values()) == [0, 1], again
    state = get_state(client, keys.run_id, key_prefix=keys.prefix)
    assert state.status == JobStatus.RUNNING.value and {n.node for n in state.nodes} == {"c", "d"}, state
    assert client.get(keys.store + "left-by-the-first-run") is None, "the new run kept a key of the old one"
    events, _ = read_history(client, keys.root)
    reruns = [e for e in events if e.kind == RERUN]
    assert len(reruns) == 1 and reruns[0].details["closed"] == "the job finished", events
    assert last_run(events) == events[events.index(reruns[0]) + 1 :]
    client.close()


def test_a_new_launch_waits_while_a_node_of_the_finished_run_is_still_alive(nodes):
    first = [nodes.add("a"), nodes.add("b")]
    nodes.rendezvous(first)
    first[0].set_closed("the job finished")
    first[0].shutdown()  # b's agent is still exiting: its node key is alive
    results = {}
    later = [nodes.add("c"), nodes.add("d")]
    thread = threading.Thread(target=lambda: results.update(nodes.rendezvous(later)), daemon=True)
    thread.start()
    time.sleep(2.0)
    assert thread.is_alive() and not results, "a new run began while a node of the old one was alive"
    first[1].shutdown()
    thread.join(30)
    assert sorted(info.group_rank for info in results.values()) == [0, 1], results


def test_a_job_an_operator_closed_is_not_run_again_until_it_is_reset(nodes):
    _finished_run(nodes, "stopped for maintenance", closed_by=CLOSED_BY_OPERATOR)
    (error,) = nodes.rendezvous([nodes.add("c")]).values()
    assert isinstance(error, RendezvousClosedError), error
    assert "starts no new run of it: an operator closed it" in str(error) and "elastic-ctl reset" in str(error)
