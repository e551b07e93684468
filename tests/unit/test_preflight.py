"""The pre-flight check's plan and verdict, without etcd or torch: who pairs with whom in each pass,
which nodes the figures name, and which of those leave."""

from __future__ import annotations

from dataclasses import replace

from launcher.preflight.gate import Preflight, Verdict, decide
from launcher.preflight.pairs import Finding, confirm_pass, first_pass, judge, second_pass
from rendezvous.job.state import Cause, JobState, JobStatus


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


def test_the_jobs_first_round_and_each_round_nodes_joined_are_checked_and_no_other():
    check = Preflight(start=lambda argv, env: None, say=lambda line: None)
    first = JobState("job", 1, JobStatus.RUNNING, 2, 4)
    assert check.needed(first)
    check._checked = True
    assert not check.needed(replace(first, round=2, cause=Cause(lost=("b",))))  # a node left: nothing new
    assert not check.needed(replace(first, round=2, restarts=1, cause=Cause(failures=("rank 1 failed",))))
    assert check.needed(replace(first, round=3, cause=Cause(joining=("d",))))  # a spare joined
    verdict = Verdict((Finding(2, "slow", "its matmul took 50 ms against a median of 10 ms"),), {}, 1.24, (2,))
    assert Preflight.line(verdict, 2) == (
        "pre-flight check (1.2 s): group rank 2 is slow: its matmul took 50 ms against a median of 10 ms: "
        "excluded before training"
    )
