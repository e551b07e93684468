"""The fault soak's invariants (tests/faults/soak_checks.py) on made-up worker records."""

from tests.faults.soak_checks import Worker, overlaps, restart_problems, rounds


def w(pid, rank, master, created, ticks, restart=0, world=2, agent=1):
    return Worker(pid, agent, rank, (master, world), restart, created, tuple(ticks))


def test_workers_group_into_rounds_in_the_order_they_started():
    later, earlier = w(3, 0, "m:2", 20.0, []), w(1, 0, "m:1", 10.0, [])
    assert rounds([later, earlier, w(2, 1, "m:1", 10.1, [])]) == [[earlier, w(2, 1, "m:1", 10.1, [])], [later]]


def test_a_worker_that_stopped_before_the_next_round_started_overlaps_nothing():
    old, new = w(1, 0, "m:1", 10.0, [10.0, 10.5, 11.9]), w(2, 0, "m:2", 12.0, [12.0, 12.5])
    assert overlaps([old, new], {}, 0.25) == []


def test_a_rank_ticking_after_the_next_rounds_worker_of_that_rank_started_is_split_brain():
    old, new = w(1, 0, "m:1", 10.0, [11.9, 12.1, 12.4]), w(2, 0, "m:2", 12.0, [12.0])
    (found,) = overlaps([old, new], {}, 0.25)
    assert (found.rank, found.old, found.new, found.ticks, found.woken) == (0, 1, 2, 2, False)
    assert abs(found.seconds - 0.4) < 1e-9 and "SPLIT BRAIN" in str(found)


def test_a_stale_worker_of_a_rank_the_shrunk_round_lacks_counts_against_its_first_worker():
    old, new = w(1, 3, "m:1", 10.0, [12.2], world=4), w(2, 0, "m:2", 12.0, [12.0])
    assert [(o.old, o.new) for o in overlaps([old, new], {}, 0.25)] == [(1, 2)]


def test_ticks_right_after_its_node_was_woken_are_reported_apart_and_only_within_the_allowance():
    old, new = w(1, 0, "m:1", 10.0, [20.01], agent=7), w(2, 0, "m:2", 12.0, [12.0])
    (found,) = overlaps([old, new], {7: [5.0, 20.0]}, 0.25)
    assert found.woken and abs(found.after_wake - 0.01) < 1e-9 and "after its frozen node woke" in str(found)
    late = w(1, 0, "m:1", 10.0, [20.01, 20.5], agent=7)
    assert not overlaps([late, new], {7: [20.0]}, 0.25)[0].woken


def test_restart_counts_agree_within_a_round_and_never_go_back():
    assert restart_problems([w(1, 0, "m:1", 1.0, []), w(2, 1, "m:1", 1.0, []), w(3, 0, "m:2", 2.0, [], 1)]) == []
    split = restart_problems([w(1, 0, "m:1", 1.0, [], 0), w(2, 1, "m:1", 1.0, [], 1)])
    assert split == ["round of master m:1: restart counts [0, 1] within one round"]
    back = restart_problems([w(1, 0, "m:1", 1.0, [], 2), w(2, 0, "m:2", 2.0, [], 1)])
    assert back == ["round of master m:2: restart count 1 after 2"]
