import time

import elastic
from tests.integration.rdzv_helpers import Nodes


def test_get_state_returns_none_when_there_is_no_such_job(etcd_endpoints, key_prefix):
    assert elastic.get_state(etcd_endpoints, "nope", key_prefix=key_prefix) is None


def test_get_state_shows_the_running_round_and_its_nodes(etcd_endpoints, key_prefix, etcd_client):
    group = Nodes(etcd_endpoints, key_prefix, min_nodes=2, max_nodes=3, last_call_timeout=0.2)
    try:
        handlers = [group.add("a", local_world_size=2), group.add("b", local_world_size=3)]
        results = group.rendezvous(handlers)
        before = etcd_client.get_prefix(key_prefix)
        view = elastic.get_state(etcd_endpoints, "job", key_prefix=key_prefix)
        assert etcd_client.get_prefix(key_prefix) == before, "get_state must not write"
        assert (view.run_id, view.status, view.round, view.world_size) == ("job", "running", 1, 5)
        assert (view.master_addr, view.master_port) == (results["a"].master_addr, results["a"].master_port)
        assert {(n.node, n.group_rank, n.alive) for n in view.nodes} == {
            ("a", results["a"].group_rank, True),
            ("b", results["b"].group_rank, True),
        }
        handlers[1].shutdown()
        # the coordinator's node starts round 2 as soon as it hears b is gone (when b was the
        # coordinator, a takes over as it follows its round, as its agent does); the view shows round 1's
        # nodes until round 2 freezes
        deadline = time.monotonic() + 10
        while (view := elastic.get_state(etcd_endpoints, "job", key_prefix=key_prefix)).status != "joining":
            assert time.monotonic() < deadline, f"the job is still {view.status} 10 s after b left"
            handlers[0].membership_changed(timeout=0.05)
        assert {n.node: n.alive for n in view.nodes} == {"a": True, "b": False}
        data = view.as_dict()
        assert data["round"] == 2 and len(data["nodes"]) == 2
    finally:
        group.close()
