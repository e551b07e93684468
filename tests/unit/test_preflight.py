"""The pre-flight check's plan and verdict, without etcd or torch: who pairs with whom in each pass,
which nodes the figures name, and which of those leave."""

from __future__ import annotations

from dataclasses import replace

from launcher.preflight.gate import Preflight, Verdict, decide
from launcher.preflight.pairs import Finding, confirm_pass, first_pass, judge, second_pass
from rendezvous.job.state import Cause, JobState, JobStatus, NodeInfo, Participant
from rendezvous.rounds.decide import LiveNode, formed_cause, frozen_state


def test_the_first_pass_pairs_by_group_rank_and_an_odd_one_out_meets_rank_0_after():
    assert first_pass(1) == []
    assert first_pass(2) == [[(0, 1)]]
    assert first_pass(4) == [[(0, 1), (2, 3)]]
    assert first_pass(5) == [[(0, 1), (2, 3)], [(0, 4)]]


def test_the_second_pass_pairs_the_fastest_with_the_slowest_and_a_failure_counts_slowest():
    assert second_pass({0: 0.1, 1: 0.1, 2: 0.4, 3: 0.4}) == [[(0, 3), (1, 2)]]
    assert second_pass({0: 0.3, 1: 0.1, 2: None, 3: 0.2}) == [[(0, 3), (1, 2)]]
    slots = second_pass({0: 0.1, 1: 0.2, 2: 0.3})
    assert slots == [[(0, 2)], [(0, 1)]]  # the middle one meets the fastest after


def test_a_node_that_failed_with_both_partners_is_faulty_and_its_first_partner_is_not():
    first = {0: None, 1: None, 2: 0.1, 3: 0.1}  # 0 and 1 failed together in pass 1
    second = {0: None, 1: 0.1, 2: 0.1, 3: 0.1}  # 1 succeeded with another partner
    found = judge(first, second, dict.fromkeys(range(4), 0.01))
    assert found == [Finding(0, "faulty", "its all-reduce failed with two different partners")]


def test_a_node_slow_with_both_partners_or_in_its_matmul_is_slow_and_one_slow_pair_names_nobody():
    first = {0: 0.1, 1: 0.1, 2: 0.5, 3: 0.5}  # 2 and 3 were a pair: slow together
    second = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.5}  # 3 is slow with a fast partner too
    found = judge(first, second, {0: 0.01, 1: 0.01, 2: 0.01, 3: 0.01})
    assert [(f.node, f.kind) for f in found] == [(3, "slow")]
    assert "its all-reduce took 500 ms and 500 ms against medians of" in found[0].line()
    found = judge(dict.fromkeys(range(4), 0.1), dict.fromkeys(range(4), 0.1), {0: 0.01, 1: 0.01, 2: 0.01, 3: 0.05})
    assert [(f.node, f.kind) for f in found] == [(3, "slow")] and "matmul took 50 ms" in found[0].why
    assert judge(dict.fromkeys(range(4), 0.1), dict.fromkeys(range(4), 0.12), dict.fromkeys(range(4), 0.01)) == []


def test_a_node_slow_in_both_passes_meets_the_fastest_node_again_and_is_named_only_if_slow_there_too():
    first = {0: 0.1, 1: 0.1, 2: 0.5, 3: 0.5}
    second = {0: 0.09, 1: 0.1, 2: 0.1, 3: 0.5}
    matmul = dict.fromkeys(range(4), 0.01)
    assert confirm_pass(first, second) == [[(0, 3)]]  # the suspect with pass 2's fastest
    assert confirm_pass(dict.fromkeys(range(4), 0.1), dict.fromkeys(range(4), 0.1)) == []  # nobody slow: no pass
    stalled = judge(first, second, matmul, {0: 0.11, 1: None, 2: None, 3: 0.11})  # fast now: a passing stall
    assert stalled == []
    slow = judge(first, second, matmul, {0: 0.6, 1: None, 2: None, 3: 0.6})
    assert [(f.node, f.kind) for f in slow] == [(3, "slow")] and slow[0].why.endswith(
        "then 600 ms with a third partner"
    )
    failed = judge(first, second, matmul, dict.fromkeys(range(4)))  # the third pair failed: still slow
    assert [(f.node, f.kind) for f in failed] == [(3, "slow")]


def test_two_slow_nodes_take_two_fast_partners_and_one_without_a_partner_is_named_on_two_passes():
    first = {0: 0.1, 1: 0.5, 2: 0.1, 3: 0.5, 4: 0.1, 5: 0.1}
    second = {0: 0.1, 1: 0.5, 2: 0.12, 3: 0.5, 4: 0.11, 5: 0.1}
    assert confirm_pass(first, second) == [[(0, 1), (3, 5)]]  # by pass 2's time, then group rank
    first = {0: 0.1, 1: 0.5, 2: None, 3: 0.5, 4: 0.1}  # 2 and 4 each failed once: no partner to confirm with
    second = {0: 0.1, 1: 0.5, 2: 0.1, 3: 0.5, 4: None}
    assert confirm_pass(first, second) == [[(0, 1)]]
    found = judge(first, second, dict.fromkeys(range(5), 0.01), {0: 0.1, 1: 0.1, 2: None, 3: None, 4: None})
    assert [(f.node, f.kind) for f in found] == [(3, "slow")]


def test_the_named_nodes_leave_only_when_the_job_keeps_its_minimum_without_them():
    named = [Finding(3, "slow", "x"), Finding(1, "faulty", "y")]
    assert decide(named, 4, 2) == (1, 3)
    assert decide(named, 4, 3) == ()  # it would fall to 2 of a minimum of 3: all kept
    assert decide([], 4, 1) == ()


def _frozen(before: JobState | None, nodes: str, round_: int, **changes) -> JobState:
    """Round ``round_`` of ``nodes`` frozen as the coordinator freezes it after ``before`` (forming)."""
    team = tuple(Participant(node, rank, "127.0.0.1", 1) for rank, node in enumerate(nodes))
    live = [LiveNode(NodeInfo(node, round_, "127.0.0.1", 1, 29500 + rank), 0) for rank, node in enumerate(nodes)]
    frozen = frozen_state("job", round_, team, live, 2, 4, cause=formed_cause(before, team))
    return replace(frozen, **changes)


def _forming(running: JobState, cause: Cause) -> JobState:
    """The round after ``running`` forming for ``cause``, read with the running round's participants."""
    return replace(running, round=running.round + 1, status=JobStatus.JOINING, cause=cause)


def test_every_round_a_node_joined_is_checked_on_every_node_alike_and_no_other():
    first = _frozen(None, "abc", 1)
    assert Preflight.needed(first)  # the job's first round: every node is new
    lost = _frozen(_forming(first, Cause(lost=("c",))), "ab", 2)
    assert not Preflight.needed(lost)  # a node left: nothing new
    failed = _forming(lost, Cause(failures=("rank 1 on node b failed (exit code 1)",)))
    assert not Preflight.needed(_frozen(failed, "ab", 3, restarts=1))
    late = _frozen(_forming(first, Cause(joining=("d",), waiting=1)), "abcd", 2)
    assert Preflight.needed(late) and late.cause.joining == ("d",)  # a node slow to start, come late
    # a node that came while the round formed after a failure, not named by the round's cause
    came = _frozen(failed, "abd", 3, restarts=1)
    assert Preflight.needed(came) and came.cause.joining == ("d",) and came.cause.failures == failed.cause.failures
    assert JobState.decode(late.encode()).cause == late.cause  # what every node reads back from etcd


def test_the_check_s_line_says_what_it_found_and_what_came_of_it():
    verdict = Verdict((Finding(2, "slow", "its matmul took 50 ms against a median of 10 ms"),), {}, 1.24, (2,))
    assert Preflight.line(verdict, 2) == (
        "pre-flight check (1.2 s): group rank 2 is slow: its matmul took 50 ms against a median of 10 ms: "
        "excluded before training"
    )


def test_a_node_whose_matmul_came_too_late_for_rank_0_is_slow_on_every_node():
    times = dict.fromkeys(range(4), 0.02)
    found = judge(times, times, {0: 0.001, 1: 0.001, 2: 0.001, 3: None})
    assert [(f.node, f.kind) for f in found] == [(3, "slow")] and "not reported" in found[0].why, found
    assert judge(times, times, {0: 0.001, 1: 0.001, 2: 0.001}) == []  # a node not in the figures at all: no word
