"""The join protocol's decisions, without etcd."""

from dataclasses import replace

from rendezvous.job.state import JobState, JobStatus, Participant
from rendezvous.rounds.join import (
    Announce,
    Closed,
    Coordinate,
    Follow,
    Frozen,
    Progress,
    ReadAll,
    join_step,
    progress_of,
    target_round,
    waits_as_spare,
)

A = Participant("a", 0, "h", 1)
B = Participant("b", 1, "h", 1)


def _state(status, round_, *participants):
    return JobState("job", round_, status, 1, 4, "h", 1, participants=tuple(participants))


def _step(state, target=2, node="a", coordinator="a", all_nodes=True, lease_alive=True):
    return join_step(state, target, node, coordinator=coordinator, all_nodes=all_nodes, lease_alive=lease_alive)


def test_a_node_asks_for_the_forming_round_or_the_one_after_the_last():
    assert target_round(None) == 1
    assert target_round(_state(JobStatus.JOINING, 3)) == 3
    assert target_round(_state(JobStatus.RUNNING, 3, A)) == 4


def test_a_closed_job_is_never_joined():
    assert _step(_state(JobStatus.CLOSED, 2, A)) == Closed()


def test_a_frozen_round_sends_the_node_to_its_row_in_the_rank_table():
    # whether the node is in it is its row's business (rendezvous.job.ranktable; tests/unit/test_ranktable.py)
    assert _step(_state(JobStatus.RUNNING, 2, A, B), node="b") == Frozen()
    assert _step(_state(JobStatus.RUNNING, 3), target=2, node="c", coordinator="a") == Frozen()


def test_a_later_round_forming_is_asked_for():
    assert _step(_state(JobStatus.JOINING, 5), target=2) == Announce(5)


def test_a_lost_lease_is_replaced_and_the_round_asked_for_again():
    assert _step(_state(JobStatus.JOINING, 2), lease_alive=False) == Announce(2)


def test_the_coordinator_reads_every_node_before_it_decides():
    assert _step(_state(JobStatus.JOINING, 2), all_nodes=False) == ReadAll()
    assert _step(_state(JobStatus.JOINING, 2), all_nodes=True) == Coordinate()


def test_the_others_follow_the_coordinator():
    assert _step(_state(JobStatus.JOINING, 2), node="b", coordinator="a") == Follow("a")
    assert _step(None, target=1, node="b", coordinator=None) == Follow("")


def test_progress_says_what_the_forming_round_looks_like_and_nothing_once_it_froze_or_the_job_closed():
    forming = replace(_state(JobStatus.JOINING, 2), joined=2, last_call_at=110.0, stopping=("c",))
    assert progress_of(forming, 2, 2, 3, 100.0, 50.0) == Progress(2, 2, 2, 3, 10.0, 50.0, ("c",))
    assert progress_of(None, 1, 2, 3, 100.0, 50.0) == Progress(1, 0, 2, 3, None, 50.0)  # a new job
    spare = progress_of(replace(_state(JobStatus.RUNNING, 1, A, B), size=2), 2, 2, 3, 100.0, None)
    assert spare == Progress(2, 0, 2, 3, None, None, running=2)  # waits for a place beside round 1
    # a spare still waiting for round 2 when round 2 froze without it, or when the job ended: any
    # count it could print ("round 2: 0/3 nodes joined") would be false; the join loop tells next
    assert progress_of(_state(JobStatus.RUNNING, 2, A, B), 2, 2, 3, 100.0, None) is None
    assert progress_of(_state(JobStatus.CLOSED, 2, A, B), 3, 2, 3, 100.0, None) is None


def test_a_node_waits_as_a_spare_only_while_a_round_runs_without_it():
    assert waits_as_spare(_state(JobStatus.RUNNING, 1, A, B), 2)  # round 1 runs; it waits for round 2
    assert not waits_as_spare(_state(JobStatus.RUNNING, 2, A, B), 2)  # its round froze: it is in it, or told next
    assert not waits_as_spare(_state(JobStatus.JOINING, 2), 2)  # a round forming: it may be in it
    assert not waits_as_spare(_state(JobStatus.CLOSED, 1), 2)
    assert not waits_as_spare(None, 1)  # a new job
