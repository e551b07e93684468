"""The rendezvous rounds against real etcd."""

from __future__ import annotations

import threading
import time

import pytest

from rendezvous import RendezvousClosedError, RendezvousStateError, RendezvousTimeoutError
from rendezvous.job.state import JobStatus, NodeInfo
from rendezvous.rounds.join import RendezvousInfo
from rendezvous.rounds.view import get_state
from tests.integration.rdzv_helpers import Nodes


@pytest.fixture
def nodes(etcd_endpoints, key_prefix):
    group = Nodes(etcd_endpoints, key_prefix, min_nodes=2, max_nodes=3, last_call_timeout=0.5, join_timeout=20)
    yield group
    group.close()


def _ok(results) -> dict[str, RendezvousInfo]:
    for node, value in results.items():
        assert isinstance(value, RendezvousInfo), f"{node}: {value!r}"
    return results


def test_eight_participants_form_one_round_with_ranks_0_to_7(etcd_endpoints, key_prefix):
    group = Nodes(etcd_endpoints, key_prefix, min_nodes=8, max_nodes=8)
    try:
        handlers = [group.add(f"node{i}", local_world_size=2) for i in range(8)]
        results = _ok(group.rendezvous(handlers))
        assert sorted(r.group_rank for r in results.values()) == list(range(8))
        assert {r.round for r in results.values()} == {1}
        assert {(r.master_addr, r.master_port) for r in results.values()} == {
            (results["node0"].master_addr, results["node0"].master_port)
        }
        assert {r.world_size for r in results.values()} == {16}
        assert sorted(r.base_global_rank for r in results.values()) == list(range(0, 16, 2))
        assert {r.group_world_size for r in results.values()} == {8}
    finally:
        group.close()


def test_round_with_min_nodes_freezes_after_the_last_call(nodes):
    handlers = [nodes.add("a"), nodes.add("b")]
    started = time.monotonic()
    results = _ok(nodes.rendezvous(handlers))
    elapsed = time.monotonic() - started
    assert sorted(r.group_rank for r in results.values()) == [0, 1]
    assert 0.5 <= elapsed < 5, elapsed


def test_round_freezes_at_once_when_max_nodes_joined(nodes):
    handlers = [nodes.add(n, last_call_timeout=30) for n in "abc"]
    started = time.monotonic()
    _ok(nodes.rendezvous(handlers))
    assert time.monotonic() - started < 5


def test_revoked_participant_makes_the_others_re_rendezvous_into_a_smaller_round(nodes):
    handlers = [nodes.add(n) for n in "abc"]
    first = _ok(nodes.rendezvous(handlers))
    victim = next(h for h in handlers if first[h.node_id].group_rank == 1)
    survivors = [h for h in handlers if h is not victim]
    for handler in survivors:
        assert not handler.membership_changed()
    victim.shutdown()
    for handler in survivors:
        assert handler.membership_changed(timeout=5)
        assert list(handler.round_monitor().cause.lost) == [victim.node_id]
    second = _ok(nodes.rendezvous(survivors))
    assert sorted(r.group_rank for r in second.values()) == [0, 1]
    assert {r.round for r in second.values()} == {2}
    for handler in survivors:  # group rank 0 stays rank 0; the one that stays keeps its rank when it fits
        if first[handler.node_id].group_rank == 0:
            assert second[handler.node_id].group_rank == 0


def test_when_the_keeper_of_a_running_round_leaves_another_node_takes_over_and_the_others_hear_it(
    nodes, etcd_client, key_prefix
):
    handlers = [nodes.add(n) for n in "abc"]
    first = _ok(nodes.rendezvous(handlers))
    keeper_id = etcd_client.get(f"{key_prefix}/job/coordinator").value.decode()
    keeper = next(h for h in handlers if h.node_id == keeper_id)
    survivors = [h for h in handlers if h is not keeper]
    for handler in survivors:
        assert not handler.membership_changed()
        assert not handler.round_monitor().keeper
    keeper.shutdown()  # its coordinator key goes with its lease: nobody watches the nodes now
    for handler in survivors:
        assert handler.membership_changed(timeout=5), "the keeper's node left and nobody noticed"
        assert list(handler.round_monitor().cause.lost) == [keeper_id]
    claimed = etcd_client.get(f"{key_prefix}/job/coordinator").value.decode()
    assert claimed in {h.node_id for h in survivors}
    second = _ok(nodes.rendezvous(survivors))
    assert sorted(r.group_rank for r in second.values()) == [0, 1] and {r.round for r in second.values()} == {2}
    assert all(
        second[h.node_id].group_rank == first[h.node_id].group_rank
        for h in survivors
        if first[h.node_id].group_rank < 2
    )


def test_a_killed_agent_is_noticed_within_its_lease_ttl_and_recovery_takes_about_one_ttl(nodes):
    handlers = [nodes.add(n, lease_ttl=2) for n in "abc"]
    _ok(nodes.rendezvous(handlers))
    victim, survivors = handlers[2], handlers[:2]
    for handler in survivors:
        assert not handler.membership_changed()
    # Kill the agent: its keep-alive stops and nothing revokes the lease (as with SIGKILL).
    victim._member._session.done.set()
    started = time.monotonic()
    assert survivors[0].membership_changed(timeout=10)
    noticed = time.monotonic() - started
    second = _ok(nodes.rendezvous(survivors))
    recovered = time.monotonic() - started
    ttl = handlers[0].settings.lease_ttl
    assert noticed <= ttl + 1.0, f"noticed after {noticed:.2f}s with a {ttl}s TTL"
    assert recovered <= ttl + 2.0, f"recovered after {recovered:.2f}s"
    assert sorted(r.group_rank for r in second.values()) == [0, 1]


def test_a_late_joiner_waits_then_the_job_scales_up(nodes):
    handlers = [nodes.add("a"), nodes.add("b")]
    _ok(nodes.rendezvous(handlers))
    late = nodes.add("late")
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(nodes.rendezvous([late])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not all(h.num_nodes_waiting() == 1 for h in handlers):
        assert time.monotonic() < deadline, "the running nodes never saw the late joiner"
        handlers[0].membership_changed(timeout=0.2)
    assert all(h.membership_changed() for h in handlers)
    results = _ok(nodes.rendezvous(handlers))
    thread.join(timeout=20)
    assert not thread.is_alive()
    results.update(_ok(outcome))
    assert sorted(r.group_rank for r in results.values()) == [0, 1, 2]
    assert {r.round for r in results.values()} == {2}
    assert results["late"].group_rank == 2


def test_join_timeout_names_how_many_nodes_came_of_how_many_needed(nodes):
    lonely = nodes.add("a", join_timeout=1.0)
    started = time.monotonic()
    (error,) = nodes.rendezvous([lonely]).values()
    assert isinstance(error, RendezvousTimeoutError)
    assert "1 of 2 required nodes joined" in str(error)
    assert time.monotonic() - started < 3


def test_a_closed_job_stays_closed_for_a_late_agent(nodes):
    """An agent launched before the job closed is a late node of that run: told, never a new run."""
    handlers = [nodes.add("a"), nodes.add("b")]
    _ok(nodes.rendezvous(handlers))
    launched = time.time()
    time.sleep(0.05)
    handlers[0].set_closed("training finished")
    assert handlers[1].is_closed()
    assert handlers[1].membership_changed(timeout=5)
    for handler in handlers:
        handler.shutdown()
    (error,) = nodes.rendezvous([nodes.add("late", launched_at=launched)]).values()
    assert isinstance(error, RendezvousClosedError)
    assert "training finished" in str(error) and "new --rdzv-id" in str(error)
    assert "launched 0.1 s before it closed: a late node of that run" in str(error), str(error)


def test_one_agent_leaving_does_not_close_the_job(nodes):
    handlers = [nodes.add("a"), nodes.add("b"), nodes.add("c")]
    _ok(nodes.rendezvous(handlers))
    handlers[0].shutdown()
    assert not handlers[1].is_closed()
    second = _ok(nodes.rendezvous(handlers[1:]))
    assert sorted(r.group_rank for r in second.values()) == [0, 1]


def test_corrupt_state_gives_a_state_error(nodes, etcd_client, key_prefix):
    etcd_client.put(f"{key_prefix}/job/state", b"\x80\x04\x95 not ours")
    (error,) = nodes.rendezvous([nodes.add("a")]).values()
    assert isinstance(error, RendezvousStateError)


def test_progress_shows_how_the_round_is_forming(nodes):
    first = nodes.add("a", last_call_timeout=30, max_nodes=3)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(nodes.rendezvous([first])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while (first.progress() is None or first.progress().nodes_joined < 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    progress = first.progress()
    assert (progress.round, progress.nodes_joined, progress.min_nodes, progress.max_nodes) == (1, 1, 2, 3)
    assert progress.last_call_in is None
    second = nodes.add("b", last_call_timeout=30, max_nodes=3)
    thread2 = threading.Thread(target=lambda: outcome.update(nodes.rendezvous([second])), daemon=True)
    thread2.start()
    while (first.progress() is None or first.progress().last_call_in is None) and time.monotonic() < deadline + 5:
        time.sleep(0.05)
    assert 0 < first.progress().last_call_in <= 30
    third = nodes.add("c")
    _ok(nodes.rendezvous([third]))
    thread.join(10)
    thread2.join(10)
    assert len(_ok(outcome)) == 2


def test_a_follower_takes_over_when_the_coordinator_dies_while_the_round_forms(nodes, etcd_client, key_prefix):
    # A coordinator that joined first and then hangs: its node key and the coordinator key exist, it never decides.
    lease = etcd_client.grant_lease(30)
    hung = NodeInfo(node="hung", round=1, addr="127.0.0.1", local_world_size=1, master_port=1)
    etcd_client.put(f"{key_prefix}/job/nodes/hung", hung.encode(), lease=lease)
    etcd_client.put(f"{key_prefix}/job/coordinator", b"hung", lease=lease)
    handlers = [nodes.add(n, min_nodes=2, max_nodes=2) for n in "bc"]
    results = {}
    runner = threading.Thread(target=lambda: results.update(nodes.rendezvous(handlers)), daemon=True)
    runner.start()
    runner.join(1.0)
    assert runner.is_alive(), "the round froze although its coordinator never decided"
    died = time.monotonic()
    etcd_client.revoke_lease(lease)  # the coordinator's agent is gone
    runner.join(10)
    assert not runner.is_alive()
    took_over = time.monotonic() - died
    infos = _ok(results)
    assert sorted(i.group_rank for i in infos.values()) == [0, 1] and infos["b"].group_world_size == 2
    assert {n.node for n in get_state(etcd_client, "job", key_prefix=key_prefix).nodes if n.group_rank is not None} == {
        "b",
        "c",
    }
    assert took_over < 2.0, f"the round froze {took_over:.2f}s after the coordinator died"


def test_etcd_out_of_reach_as_a_round_begins_is_no_membership_change_and_no_error(etcd_endpoints, key_prefix):
    """The round's monitor is set up on the first look; etcd cut just then must leave the decision
    to the renew deadline (the fence), not end the agent with a connection error."""
    from tests.faults.proxy import Proxy

    host, port = etcd_endpoints.split(",")[0].rsplit(":", 1)
    with Proxy(host, int(port)) as proxy:
        group = Nodes(proxy.endpoint, key_prefix, min_nodes=1, max_nodes=1)
        try:
            handler = group.add("a")
            _ok(group.rendezvous([handler]))
            proxy.cut()
            started = time.monotonic()
            assert handler.membership_changed(timeout=0.1) is False
            assert time.monotonic() - started < 10  # one read's budget (the client's 5 s), no more
            proxy.heal()
            assert handler.membership_changed(timeout=0.1) is False  # set up now, and nothing changed
            assert handler.round_monitor() is not None
        finally:
            group.close()


def test_closing_a_round_monitor_ends_its_thread_and_stream_at_once_never_after_a_poll(nodes):
    """The agent's exit path closes its round monitor: the keeper's thread, blocked on its watch for up
    to the job lease's renewal period, is woken by the close, and a follower's stream is cancelled --
    both gone by the time ``close`` returns, whatever the poll or renewal period."""
    handlers = [nodes.add(n) for n in "ab"]
    _ok(nodes.rendezvous(handlers))
    monitors = [h.round_monitor() for h in handlers]
    keeper = next(m for m in monitors if m.keeper)
    follower = next(m for m in monitors if not m.keeper)
    thread, keeper_stream, follower_stream = keeper._thread, keeper._watch._task, follower._watch._task
    assert thread.is_alive() and not keeper_stream.done() and not follower_stream.done()
    keeper.close(join=True)
    assert not thread.is_alive(), "the keeper's thread outlived close(): it waits for a poll, not for the close"
    follower.close(join=True)
    assert keeper_stream.done() and follower_stream.done()


def test_a_round_monitor_set_up_on_a_lease_etcd_no_longer_has_says_the_membership_ended(nodes, etcd_client):
    """etcd answering "lease not found" to the claim a monitor makes as it starts (the node's lease
    expired while it could not renew it) is this node's membership ending, as the fence has it:
    never an error that ends the agent; the next round takes a new lease."""
    from rendezvous.job.keys import JobKeys
    from rendezvous.rounds.monitor import JobMonitor

    handlers = [nodes.add(n, lease_ttl=30, keep_alive_interval=10.0) for n in "ab"]
    first = _ok(nodes.rendezvous(handlers))
    node = next(h for h in handlers if h.round_monitor().keeper)  # its coordinator key goes with the lease:
    old_lease = node.lease.lease_id  # so its monitor claims it again, on the lease etcd no longer has
    etcd_client.revoke_lease(old_lease)  # behind its back; its keep-alive hears of it 10 s later at most
    keys = JobKeys(nodes.settings.key_prefix, nodes.settings.run_id)
    monitor = JobMonitor(nodes.clients[0], keys, first[node.node_id].round, node.node_id, old_lease)
    try:
        assert monitor.lease_gone and monitor.changed
    finally:
        monitor.close(join=True)
    for handler in handlers:
        assert handler.membership_changed(timeout=5)
    second = _ok(nodes.rendezvous(handlers))
    assert {info.round for info in second.values()} == {first[node.node_id].round + 1}
    assert node.lease.lease_id not in (0, old_lease)


@pytest.mark.parametrize(
    "departure, restarts",
    [("its peers' verdict", 0), ("its own health gate", 0), ("a plain leave", 1)],
    ids=["lost record by a peer", "step_out", "no lost record"],
)
def test_a_failure_in_a_round_whose_participant_was_recorded_lost_costs_no_restart(
    etcd_endpoints, key_prefix, departure, restarts
):
    """Four nodes; d goes, and b's workers fail in the same round but b's own probes saw nothing:
    only the coordinator's read of ``lost/<round>/`` (written by d's watchers, or by d stepping out
    unhealthy) keeps b's failure from costing a restart."""
    import json

    from rendezvous.job.keys import JobKeys

    group = Nodes(etcd_endpoints, key_prefix, min_nodes=2, max_nodes=4, last_call_timeout=0.5, join_timeout=20)
    try:
        a, b, c, d = (group.add(n) for n in "abcd")
        assert {info.round for info in _ok(group.rendezvous([a, b, c, d])).values()} == {1}
        if departure == "its peers' verdict":
            lease = a.job_state().keep.lease
            record = json.dumps({"why": "its agent's probe connection was closed", "by": "a"}).encode()
            group.clients[0].put(JobKeys(key_prefix, "job").lost_in(1, "d"), record, lease=lease)
            d.shutdown()
        elif departure == "its own health gate":
            d.step_out("--health-check failed: /scratch is full")
        else:
            d.shutdown()
        b.request_restart("rank 1 on node b failed (exit code 1)")
        second = _ok(group.rendezvous([a, b, c]))
        assert {info.restart_count for info in second.values()} == {restarts}, second
        assert {info.group_world_size for info in second.values()} == {3}
    finally:
        group.close()


def _late_joiner(nodes):
    """A third node joining in a thread while a and b run round 1: {"late": info or error}, and the thread."""
    late, outcome = nodes.add("late"), {}
    thread = threading.Thread(target=lambda: outcome.update(nodes.rendezvous([late])), daemon=True)
    thread.start()
    return outcome, thread


def _until(condition, what, within=10.0):
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _finish_like_an_agent(handler):
    """The agent's exit barrier: say this node finished; close the job once every participant has."""
    handler.finish()
    if handler.all_finished(timeout=10):
        handler.set_closed("the job finished")
        return True
    return False


def test_a_newcomer_while_the_job_finishes_restarts_nothing_and_hears_the_job_close(nodes):
    """A node that comes once a participant's workers succeeded (a fenced node rejoining, a spare)
    does not start a new round: the job is at its end. It waits, and the close tells it so."""
    a, b = nodes.add("a"), nodes.add("b")
    _ok(nodes.rendezvous([a, b]))
    a.finish()
    outcome, thread = _late_joiner(nodes)
    _until(lambda: b.spares_waiting() == 1, "the late node never asked to join")
    time.sleep(1.0)  # the keeper has seen it: it would have started round 2 by now
    assert a.job_state().status is JobStatus.RUNNING and a.job_state().round == 1
    assert a.num_nodes_waiting() == b.num_nodes_waiting() == 0
    assert not a.membership_changed() and not b.membership_changed()
    assert all(Nodes.each([a, b], _finish_like_an_agent, timeout=15).values())  # a's finish was said: b's now
    thread.join(timeout=10)
    (error,) = outcome.values()
    assert isinstance(error, RendezvousClosedError) and error.while_waiting, error


def test_a_newcomer_just_before_the_last_workers_succeeded_does_not_keep_the_job_open(nodes):
    """The keeper started round 2 for the newcomer; then every participant's workers succeeded
    before they were stopped for it: the job finished, every participant closes it, and the
    newcomer -- alone in round 2 -- hears it close instead of waiting out its join timeout."""
    a, b = nodes.add("a"), nodes.add("b")
    _ok(nodes.rendezvous([a, b]))
    outcome, thread = _late_joiner(nodes)
    _until(lambda: a.job_state().status is JobStatus.JOINING, "the keeper never started round 2 for the late node")
    assert all(Nodes.each([a, b], _finish_like_an_agent, timeout=15).values())
    thread.join(timeout=10)
    (error,) = outcome.values()
    assert isinstance(error, RendezvousClosedError) and error.while_waiting, error
    _until(lambda: a.job_state().status is JobStatus.CLOSED, "a never saw the close")
    assert a.job_state().reason == "the job finished"


def test_a_node_that_finishes_after_another_closed_the_job_from_the_newcomers_round_says_it_finished(nodes):
    """As above, one participant after the other: b decides from the node keys and closes the job
    (from the newcomer's round 2); a, finishing after, finds it closed as finished -- True, as the
    barrier says when the job closes in its own round (a CI run saw a's False)."""
    a, b = nodes.add("a"), nodes.add("b")
    _ok(nodes.rendezvous([a, b]))
    outcome, thread = _late_joiner(nodes)
    _until(lambda: a.job_state().status is JobStatus.JOINING, "the keeper never started round 2 for the late node")
    a.finish()
    assert _finish_like_an_agent(b)
    # a's view is its monitor's, one watch event behind etcd (CI 32 read it before the close arrived)
    _until(lambda: a.job_state().status is JobStatus.CLOSED, "a never saw b's close")
    a.finish()
    assert a.all_finished(timeout=5)
    thread.join(timeout=10)
    (error,) = outcome.values()
    assert isinstance(error, RendezvousClosedError) and error.while_waiting, error


def test_a_finished_node_rejoins_when_a_participant_was_stopped_for_the_newcomer(nodes):
    """Round 2 began for the newcomer; a's workers succeeded, b's were stopped for it: the job goes
    on with the newcomer, and a -- whose ranks the round needs -- rejoins it as the agent does."""
    from launcher.restart import rejoin_after_finish

    a, b = nodes.add("a"), nodes.add("b")
    _ok(nodes.rendezvous([a, b]))
    outcome, thread = _late_joiner(nodes)
    _until(lambda: a.job_state().status is JobStatus.JOINING, "the keeper never started round 2 for the late node")
    a.finish()
    rejoined = {}
    b_thread = threading.Thread(target=lambda: rejoined.update(nodes.rendezvous([b])), daemon=True)
    b_thread.start()
    assert not a.all_finished(timeout=10)
    assert rejoin_after_finish(a.job_state()) == (
        "late came to join before every node's workers finished: the job goes on with them; rejoining"
    )
    second = _ok(nodes.rendezvous([a]))
    for joiner in (thread, b_thread):
        joiner.join(timeout=10)
    second.update(_ok(outcome), **_ok(rejoined))
    assert {info.round for info in second.values()} == {2}
    assert sorted(info.group_rank for info in second.values()) == [0, 1, 2]
