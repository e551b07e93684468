"""Round decisions without etcd: made-up node lists and an injected clock."""

from dataclasses import replace

import pytest

from rendezvous.job.state import JobState, JobStatus, NodeInfo, Participant
from rendezvous.rounds.decide import (
    Freeze,
    LiveNode,
    Wait,
    assign_ranks,
    decide,
    forming_news,
    forming_state,
    frozen_state,
    job_budget,
    restart_count,
    silent_after,
    silent_nodes,
    still_running,
)
from rendezvous.rounds.ending import failures_reported, lost_participants, newcomers, nodes_waiting


def node(name, round_=1, rev=None, lws=2, port=1000):
    return LiveNode(NodeInfo(name, round_, f"{name}.host", lws, port), rev if rev is not None else int(name[1:]) + 10)


def running(participants, round_=1, max_nodes=4):
    return JobState("job", round_, JobStatus.RUNNING, 1, max_nodes, "m", 1, participants=tuple(participants))


def p(name, rank, lws=2):
    return Participant(name, rank, f"{name}.host", lws)


def call(nodes, round_=1, previous=None, min_nodes=2, max_nodes=4, last_call=5.0, start=None, now=100.0):
    return decide(
        previous,
        nodes,
        round_,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        last_call_timeout=last_call,
        last_call_start=start,
        now=now,
    )


def test_round_freezes_at_once_when_max_nodes_joined():
    decision = call([node("n0"), node("n1"), node("n2"), node("n3")])
    assert isinstance(decision, Freeze)
    assert [q.group_rank for q in decision.participants] == [0, 1, 2, 3]


def test_round_waits_for_change_below_min_nodes():
    assert call([node("n0")]) == Wait(until=None, last_call_start=None)


def test_last_call_starts_when_min_nodes_joined_and_ends_after_the_window():
    nodes = [node("n0"), node("n1")]
    first = call(nodes, now=100.0)
    assert first == Wait(until=105.0, last_call_start=100.0)
    assert call(nodes, start=100.0, now=104.9) == Wait(until=105.0, last_call_start=100.0)
    assert isinstance(call(nodes, start=100.0, now=105.0), Freeze)


def test_dropping_below_min_nodes_cancels_the_last_call():
    assert call([node("n0")], start=100.0, now=101.0) == Wait(until=None, last_call_start=None)


def test_extra_nodes_beyond_max_wait_for_the_next_round():
    nodes = [node(f"n{i}") for i in range(6)]
    decision = call(nodes, max_nodes=4)
    assert [q.node for q in decision.participants] == ["n0", "n1", "n2", "n3"]


def test_nodes_that_ask_for_another_round_do_not_count():
    decision = call([node("n0"), node("n1", round_=2), node("n2")], min_nodes=3)
    assert isinstance(decision, Wait) and decision.last_call_start is None


def test_re_rendezvous_freezes_without_last_call_once_every_live_node_rejoined():
    previous = running([p("n0", 0), p("n1", 1), p("n2", 2)])
    survivors = [node("n0", 2), node("n2", 2)]  # n1's key is gone: its agent died
    decision = call(survivors, round_=2, previous=previous, min_nodes=1, max_nodes=3)
    assert isinstance(decision, Freeze)
    assert [(q.node, q.group_rank) for q in decision.participants] == [("n0", 0), ("n2", 1)]


def test_re_rendezvous_waits_for_a_live_node_that_has_not_rejoined_yet():
    previous = running([p("n0", 0), p("n1", 1)])
    decision = call([node("n0", 2), node("n1", 1)], round_=2, previous=previous, min_nodes=1, max_nodes=3)
    assert isinstance(decision, Wait) and decision.until == 105.0


def test_assign_ranks_keeps_the_ranks_of_nodes_that_stay():
    previous = [p("a", 0), p("b", 1), p("c", 2), p("d", 3)]
    stay = [node("n9", rev=1), node("a", rev=2), node("c", rev=3), node("d", rev=4)]
    stay = [LiveNode(NodeInfo(x.info.node, 2, "h", 1, 1), x.create_revision) for x in stay]
    ranks = {q.node: q.group_rank for q in assign_ranks(previous, stay, 8)}
    assert ranks == {"a": 0, "c": 2, "d": 3, "n9": 1}


def test_assign_ranks_moves_a_stayer_whose_rank_no_longer_fits():
    previous = [p("a", 0), p("b", 1), p("c", 2)]
    stay = [LiveNode(NodeInfo(n, 2, "h", 1, 1), r) for n, r in (("a", 1), ("c", 2))]
    assert {q.node: q.group_rank for q in assign_ranks(previous, stay, 8)} == {"a": 0, "c": 1}


def test_assign_ranks_is_deterministic_whatever_the_input_order():
    previous = [p("a", 0), p("b", 1)]
    nodes = [LiveNode(NodeInfo(n, 2, "h", 1, 1), r) for n, r in (("x", 7), ("b", 3), ("y", 5))]
    assert assign_ranks(previous, nodes, 8) == assign_ranks(previous, list(reversed(nodes)), 8)


def test_assign_ranks_prefers_previous_participants_when_capped():
    previous = [p("old", 0)]
    nodes = [LiveNode(NodeInfo(n, 2, "h", 1, 1), r) for n, r in (("new", 1), ("old", 9))]
    assert [q.node for q in assign_ranks(previous, nodes, 1)] == ["old"]


def test_frozen_state_takes_master_from_group_rank_zero():
    nodes = [node("n0", port=1111), node("n1", port=2222)]
    participants = (p("n1", 0), p("n0", 1))
    state = frozen_state("job", 3, participants, nodes, 1, 2)
    assert (state.master_addr, state.master_port, state.round) == ("n1.host", 2222, 3)
    assert state.world == 4


def test_nodes_waiting_counts_newcomers_only_while_there_is_room():
    state = running([p("n0", 0), p("n1", 1)], max_nodes=3)
    nodes = [node("n0"), node("n1"), node("n5", 2), node("n6", 2)]
    assert nodes_waiting(state, nodes) == 1
    assert nodes_waiting(running([p("n0", 0), p("n1", 1)], max_nodes=2), nodes) == 0


def test_nodes_waiting_counts_a_participant_asking_for_a_new_round():
    state = running([p("n0", 0), p("n1", 1)], max_nodes=2)
    assert nodes_waiting(state, [node("n0"), node("n1", 2)]) == 1


def test_lost_participants_are_those_whose_key_is_gone():
    state = running([p("n0", 0), p("n1", 1), p("n2", 2)])
    assert lost_participants(state, {"n0", "n2"}) == ["n1"]
    assert lost_participants(None, set()) == []


def test_a_participant_that_leaves_a_finishing_round_is_not_lost():
    """A node's workers all succeeded (finishing): one that leaves now left an ending job -- its exit
    barrier gave up -- and the others end theirs without a new round, as torch's agents do."""
    state = replace(running([p("n0", 0), p("n1", 1)]), finishing=True)
    assert lost_participants(state, {"n1"}) == []


@pytest.mark.parametrize("status", [JobStatus.JOINING, JobStatus.CLOSED])
def test_nothing_waits_and_nothing_is_lost_unless_a_round_runs(status):
    state = JobState("job", 1, status, 1, 4, participants=(p("n0", 0),))
    assert nodes_waiting(state, [node("n5", 2)]) == 0
    assert lost_participants(state, set()) == []


# -- one restart count per job --------------------------------------------------------------------
def _asking(node: str, round_: int, revision: int, failed_round: int = 0, failure: str = "") -> LiveNode:
    return LiveNode(NodeInfo(node, round_, "h", 1, 1, failed_round=failed_round, failure=failure), revision)


def _running(round_: int, restarts: int, members=("a", "b")) -> JobState:
    return JobState(
        run_id="job",
        round=round_,
        status=JobStatus.RUNNING,
        min_nodes=1,
        max_nodes=4,
        participants=tuple(Participant(n, i, "h", 1) for i, n in enumerate(members)),
        master_addr="h",
        master_port=1,
        restarts=restarts,
        max_restarts=3,
    )


def test_a_failure_reported_for_the_round_before_advances_the_count_once():
    state = _running(4, restarts=1)
    nodes = [_asking("a", 5, 1, failed_round=4), _asking("b", 5, 2, failed_round=4)]
    assert restart_count(state, nodes, 5) == 2


def test_a_membership_change_leaves_the_count():
    state = _running(4, restarts=1)
    assert restart_count(state, [_asking("a", 5, 1), _asking("c", 5, 3)], 5) == 1


def test_a_stale_failure_of_an_older_round_does_not_count_again():
    state = _running(5, restarts=2)
    assert restart_count(state, [_asking("a", 6, 1, failed_round=4)], 6) == 2


def test_the_first_round_starts_at_zero_and_the_budget_is_the_first_agents():
    assert restart_count(None, [_asking("a", 1, 1)], 1) == 0
    assert job_budget(None, 7) == 7
    assert job_budget(_running(1, 0), 7) == 3


def test_others_learn_what_failed_and_who_joined():
    state = _running(4, restarts=0)
    nodes = [
        _asking("a", 5, 1, failed_round=4, failure="rank 0 on node a failed (exit code 1)"),
        _asking("b", 4, 2),
        _asking("c", 5, 3),
    ]
    assert failures_reported(state, nodes) == ["rank 0 on node a failed (exit code 1)"]
    assert newcomers(state, nodes) == ["c"]
    assert failures_reported(_running(5, 0), nodes) == []


def test_a_hot_spare_filling_the_round_waits_for_a_stayer_whose_workers_may_still_run():
    previous = running([p("n0", 0), p("n1", 1), p("n2", 2)], max_nodes=3)
    # n0's worker failed, n1 stopped at once, the spare n3 waited already: max_nodes asked, but n2
    # is still stopping its workers of round 1 (its key says round 1)
    nodes = [node("n0", 2), node("n1", 2), node("n2", 1), node("n3", 2)]
    decision = call(nodes, round_=2, previous=previous, min_nodes=2, max_nodes=3)
    assert decision == Wait(until=None, last_call_start=100.0, stopping=("n2",))
    # once n2 asks (its workers are gone) the stayers keep their ranks and the spare waits on
    nodes[2] = node("n2", 2)
    decision = call(nodes, round_=2, previous=previous, min_nodes=2, max_nodes=3, start=100.0, now=104.0)
    assert [(q.node, q.group_rank) for q in decision.participants] == [("n0", 0), ("n1", 1), ("n2", 2)]


def test_the_last_call_does_not_freeze_a_round_while_a_stayer_still_runs():
    previous = running([p("n0", 0), p("n1", 1)])
    decision = call([node("n0", 2), node("n1", 1)], round_=2, previous=previous, min_nodes=1, start=90.0)
    assert decision == Wait(until=None, last_call_start=90.0, stopping=("n1",))


def test_a_participant_whose_key_is_gone_or_whose_workers_finished_is_not_waited_for():
    previous = running([p("n0", 0), p("n1", 1), p("n2", 2)], max_nodes=3)
    finished = LiveNode(NodeInfo("n2", 1, "n2.host", 2, 1000, finished=True), 12)
    assert still_running(previous.participants, [node("n0", 2), finished], 2) == ()
    decision = call([node("n0", 2), finished], round_=2, previous=previous, min_nodes=1, max_nodes=3, start=90.0)
    assert isinstance(decision, Freeze)


def test_the_rounds_cause_carries_the_kind_of_its_first_failure_read_back_from_etcd_as_written():
    from rendezvous.job.state import Cause, FailureKind
    from rendezvous.rounds.ending import round_cause

    state = _running(4, restarts=0, members=("a", "b"))
    hang = NodeInfo("b", 5, "h", 1, 1, failed_round=4, failure="rank 1 on node b hung", failure_kind=FailureKind.HANG)
    failed = NodeInfo("a", 5, "h", 1, 1, failed_round=4, failure="rank 0 on node a failed (exit code 1)")
    cause = round_cause(state, [LiveNode(hang, 1), LiveNode(failed, 2)])
    assert cause.failures[0].startswith("rank 0 on node a failed") and cause.kind is FailureKind.WORKER
    assert round_cause(state, [LiveNode(hang, 1)]).kind is FailureKind.HANG
    assert round_cause(state, [LiveNode(NodeInfo("c", 5, "h", 1, 1), 3)]).kind is None
    assert NodeInfo.decode(hang.encode()) == hang and NodeInfo.decode(failed.encode()).failure_kind is None
    assert b"failure_kind" not in failed.encode()  # no larger than before kinds when there is none
    stored = JobState(
        "job", 5, JobStatus.JOINING, 1, 4, cause=Cause.of(["rank 1 on node b hung"], [], [], 0, FailureKind.HANG)
    )
    assert JobState.decode(stored.encode()).cause.kind is FailureKind.HANG
    assert JobState.decode(JobState("job", 5, JobStatus.JOINING, 1, 4).encode()).cause.kind is None


def test_a_failure_kind_etcd_holds_that_is_not_one_is_a_state_error():
    from rendezvous.errors import RendezvousStateError

    raw = NodeInfo("b", 5, "h", 1, 1).encode().replace(b'"finished"', b'"failure_kind":"oops","finished"')
    with pytest.raises(RendezvousStateError, match="failure_kind is not one of worker_failure, hang"):
        NodeInfo.decode(raw)


def test_the_coordinator_tells_a_forming_round_only_what_changed():
    from dataclasses import replace

    from rendezvous.rounds.decide import News, Wait, forming_news

    waiting = Wait(until=None, last_call_start=None)
    forming = JobState("job", 5, JobStatus.JOINING, 1, 4, joined=2)
    assert forming_news(_running(4, 0), 5, waiting, None, 2) is News.TELL  # not announced yet
    assert forming_news(forming, 5, waiting, None, 2) is News.NONE
    assert forming_news(forming, 5, waiting, None, 3) is News.RECOUNT  # only the count: at the progress pace
    assert forming_news(forming, 5, Wait(until=9.0, last_call_start=1.0), 1234.5, 2) is News.TELL  # last call began
    assert forming_news(replace(forming, last_call_at=1234.5), 5, waiting, None, 2) is News.TELL  # and it ended
    assert forming_news(forming, 5, Wait(None, None, stopping=("n2",)), None, 2) is News.TELL  # whom it waits for
    assert forming_news(forming, 6, waiting, None, 2) is News.TELL  # a later round


def test_a_node_whose_lease_missed_two_renewals_is_silent_with_when_its_lease_runs_out():
    # lease_ttl 15, renewed every 1 s: a live lease shows 14-15 s left; 12 or more is not yet telling
    time_left = [("a", 15), ("b", 14), ("c", 12), ("d", 11), ("e", 0), ("gone", -1)]
    assert silent_after(1.0) == 3.0
    assert silent_nodes(time_left, 15, 1.0, now=1000.0) == (("d", 1011.0), ("e", 1000.0))


def test_a_node_going_silent_is_news_for_the_forming_rounds_state_and_survives_encoding():
    waiting = Wait(until=130.0, last_call_start=100.0)
    told = forming_state(None, "job", 2, min_nodes=2, max_nodes=3, last_call_at=130.0, max_restarts=0, joined=2)
    silent = Wait(until=130.0, last_call_start=100.0, silent=(("c", 1011.0),))
    assert forming_news(told, 2, waiting, 130.0, 2).value == "none"
    assert forming_news(told, 2, silent, 130.0, 2).value == "tell"
    again = forming_state(
        told, "job", 2, min_nodes=2, max_nodes=3, last_call_at=130.0, max_restarts=0, joined=2, silent=silent.silent
    )
    assert JobState.decode(again.encode()).silent == (("c", 1011.0),)
    assert b"silent" not in told.encode()  # absent unless some node is silent: the header keeps its size
    later = Wait(until=130.0, last_call_start=100.0, silent=(("c", 1012.0),))
    assert forming_news(again, 2, later, 130.0, 2).value == "none"  # the same node: no rewrite for a second's drift


def test_a_malformed_silent_list_is_a_state_error():
    from rendezvous.errors import RendezvousStateError

    raw = forming_state(None, "job", 2, min_nodes=2, max_nodes=3, last_call_at=None, max_restarts=0).encode()
    bad = raw[:-1] + b',"silent":[["c"]]}'
    with pytest.raises(RendezvousStateError, match="silent is not a list"):
        JobState.decode(bad)
