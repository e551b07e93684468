"""How a running round ends, without etcd: a newcomer against a job at its end."""

from dataclasses import replace

import pytest

from launcher.restart import rejoin_after_finish
from rendezvous.job.state import Cause, JobState, JobStatus, NodeInfo, Participant
from rendezvous.rounds.decide import LiveNode
from rendezvous.rounds.ending import (
    Ending,
    closed_finished,
    ending_after,
    finishing,
    newcomer_round,
    nodes_waiting,
    round_cause,
)


def node(name, round_=1, finished=False, failed_round=0):
    info = NodeInfo(name, round_, f"{name}.host", 1, 1000, finished=finished, failed_round=failed_round)
    return LiveNode(info, int(name[1:]) + 10)


PARTICIPANTS = (Participant("n0", 0, "n0.host", 1), Participant("n1", 1, "n1.host", 1))


def running(finishing=False, max_nodes=3):
    return JobState("job", 1, JobStatus.RUNNING, 2, max_nodes, participants=PARTICIPANTS, finishing=finishing)


def forming(cause):
    return JobState("job", 2, JobStatus.JOINING, 2, 3, participants=PARTICIPANTS, cause=cause)


def test_a_newcomer_counts_while_nobody_finished():
    nodes = [node("n0"), node("n1"), node("n2", 2)]
    assert not finishing(running(), nodes)
    assert nodes_waiting(running(), nodes) == 1
    assert round_cause(running(), nodes).waiting == 1


@pytest.mark.parametrize("said", ["by a participant's key", "by the state"])
def test_a_newcomer_does_not_count_once_the_round_is_finishing(said):
    by_key = said == "by a participant's key"
    nodes = [node("n0", finished=by_key), node("n1"), node("n2", 2)]
    state = running(finishing=not by_key)
    assert finishing(state, nodes)
    assert nodes_waiting(state, nodes) == 0
    cause = round_cause(state, nodes)
    assert (cause.waiting, cause.joining) == (0, ("n2",))  # named, but it ends nothing


def test_a_participant_asking_again_counts_while_the_round_is_finishing():
    """A worker that failed after another node's finished still restarts the job."""
    nodes = [node("n0", finished=True), node("n1", 2, failed_round=1)]
    assert nodes_waiting(running(), nodes) == 1


def test_a_newcomer_round_is_one_forming_for_waiting_nodes_alone():
    assert newcomer_round(forming(Cause(waiting=1, joining=("n2",))), 1)
    assert not newcomer_round(forming(Cause(waiting=1, failures=("rank 1 failed",))), 1)
    assert not newcomer_round(forming(Cause(waiting=1, lost=("n1",))), 1)
    assert not newcomer_round(forming(Cause(waiting=1)), 2)  # not the round after this node's
    assert not newcomer_round(replace(forming(Cause(waiting=1)), status=JobStatus.CLOSED), 1)
    assert not newcomer_round(None, 1)


def test_a_round_every_participant_of_which_finished_finished_whatever_joins_after():
    nodes = [node("n0", finished=True), node("n1", finished=True), node("n2", 2)]
    assert ending_after(PARTICIPANTS, nodes, 1) is Ending.FINISHED


def test_a_round_goes_on_when_a_participant_was_stopped_for_the_newcomer_or_is_gone():
    stopped = [node("n0", finished=True), node("n1", 2), node("n2", 2)]
    assert ending_after(PARTICIPANTS, stopped, 1) is Ending.GOES_ON
    gone = [node("n0", finished=True), node("n2", 2)]
    assert ending_after(PARTICIPANTS, gone, 1) is Ending.GOES_ON


def test_a_round_is_undecided_while_a_participant_still_runs_its_workers():
    nodes = [node("n0", finished=True), node("n1"), node("n2", 2)]
    assert ending_after(PARTICIPANTS, nodes, 1) is Ending.UNDECIDED
    assert ending_after((), nodes, 1) is Ending.UNDECIDED  # no table read: nothing to go by


def test_a_finished_node_rejoins_for_a_failure_or_a_newcomer_and_not_for_a_loss():
    failed = rejoin_after_finish(forming(Cause(failures=("rank 1 on node n1 failed (exit code 1)",), waiting=1)))
    assert (
        failed
        == "rank 1 on node n1 failed (exit code 1) after this node's workers finished: the job restarts; rejoining"
    )
    counted = rejoin_after_finish(
        replace(forming(Cause(failures=("rank 1 failed",), waiting=1)), restarts=1, max_restarts=2)
    )
    assert (
        counted == "rank 1 failed after this node's workers finished: the job restarts (2/2); rejoining"
    )  # as the others
    newcomer = rejoin_after_finish(forming(Cause(joining=("n2",), waiting=1)))
    assert newcomer == "n2 came to join before every node's workers finished: the job goes on with them; rejoining"
    assert rejoin_after_finish(forming(Cause(lost=("n1",), waiting=1))) is None
    assert rejoin_after_finish(replace(forming(Cause(waiting=1)), status=JobStatus.CLOSED)) is None
    assert rejoin_after_finish(None) is None


def test_a_job_closed_as_finished_in_this_round_or_the_newcomers_after_it_finished():
    closed = replace(forming(Cause(waiting=1)), status=JobStatus.CLOSED, reason="the job finished")
    assert closed_finished(closed, 1) and closed_finished(replace(closed, round=1), 1)
    assert not closed_finished(replace(closed, failed=True), 1)
    assert not closed_finished(replace(closed, closed_by="operator"), 1)
    assert not closed_finished(replace(closed, round=3), 1)
    assert not closed_finished(forming(Cause(waiting=1)), 1)
