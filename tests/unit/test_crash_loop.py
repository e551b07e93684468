"""The crash-loop breaker without etcd or workers: what counts as progress, how the job's streak
is counted when a restart is, when a failure trips it, and the record's trip through etcd."""

from __future__ import annotations

import pytest

from launcher.restart import crash_loop_reason, crash_loop_summary
from rendezvous.errors import RendezvousStateError
from rendezvous.job.progress import SHOWN_FAILURES, RoundProgress, Streak, counted, progressed, tripped
from rendezvous.job.state import JobState, JobStatus, NodeInfo
from rendezvous.rounds.decide import LiveNode, streak_after

DIES_AT_STEP_5 = RoundProgress(beats=5)


def _cycles(progress: list[RoundProgress], limit: int = 3) -> int:
    """The failure (1-based) that trips the breaker when each round got as far as ``progress`` says (0: none)."""
    streak = Streak()
    for i, mine in enumerate(progress, start=1):
        if tripped(streak, mine, limit):
            return i
        streak = counted(streak, [(f"rank 0 failed in cycle {i}", mine)])
    return 0


def test_a_job_that_dies_at_the_same_step_every_time_trips_on_its_fourth_failure():
    assert _cycles([DIES_AT_STEP_5] * 10) == 4  # the first got somewhere; the next three did not
    assert _cycles([DIES_AT_STEP_5] * 10, limit=1) == 2
    assert _cycles([RoundProgress()] * 10) == 3  # no heartbeats at all: nothing is ever progress
    assert _cycles([DIES_AT_STEP_5] * 10, limit=0) == 0  # --crash-loop-restarts 0: never


@pytest.mark.parametrize(
    "further",
    [
        RoundProgress(beats=6),  # a worker beat more than any before
        RoundProgress(beats=5, checkpoint=40),  # a newer checkpoint step
        RoundProgress(beats=1, long=True),  # the round ran the progress window
    ],
    ids=["more heartbeats", "a newer checkpoint", "a long round"],
)
def test_any_sign_of_progress_starts_the_count_again(further):
    streak = Streak(stalled=2, beats=5, checkpoint=30, failures=("a", "b"))
    assert progressed(streak, further) and not tripped(streak, further, 3)
    after = counted(streak, [("c", further)])
    assert after.stalled == 0 and after.failures == () and after.beats >= 5 and after.checkpoint >= 30
    assert _cycles([RoundProgress(beats=5 + i, checkpoint=i) for i in range(20)]) == 0  # a job that gets further


def test_the_streak_counts_once_per_restart_whatever_the_nodes_said_and_keeps_the_best():
    streak = Streak(stalled=1, beats=8, checkpoint=3, failures=("rank 1 failed (exit code 1)",))
    same = [("rank 1 failed (exit code 1)", RoundProgress(beats=8)), ("rank 3 hung", RoundProgress(beats=7))]
    after = counted(streak, same)
    assert after.stalled == 2 and after.beats == 8 and after.checkpoint == 3
    assert after.failures == ("rank 1 failed (exit code 1)", "rank 1 failed (exit code 1); rank 3 hung")
    one_further = counted(streak, [*same, ("rank 2 failed", RoundProgress(beats=9))])
    assert one_further.stalled == 0 and one_further.beats == 9
    assert counted(streak, [("an agent that did not say", None)]).stalled == 0  # never stop a job on no word
    many = Streak(stalled=20, failures=tuple(str(i) for i in range(SHOWN_FAILURES)))
    assert counted(many, [("new", RoundProgress())]).failures[-1] == "new"
    assert len(counted(many, [("new", RoundProgress())]).failures) == SHOWN_FAILURES


def _node(name: str, round_: int, failed_round: int = 0, progress: RoundProgress | None = None) -> LiveNode:
    info = NodeInfo(name, round_, "h", 1, 1, failed_round=failed_round, failure=f"{name} failed", progress=progress)
    return LiveNode(info, 1)


def test_the_coordinator_counts_the_streak_only_with_a_restart():
    state = JobState("j", 3, JobStatus.RUNNING, 1, 2, restarts=1, streak=Streak(stalled=1, beats=5))
    failing = [_node("a", 4, failed_round=3, progress=DIES_AT_STEP_5), _node("b", 4)]
    assert streak_after(state, failing, 4) == Streak(stalled=2, beats=5, failures=("a failed",))
    assert streak_after(state, failing, 4, peers_lost=True) == state.streak  # a peer's death: no restart
    assert streak_after(state, [_node("a", 4), _node("b", 4)], 4) == state.streak  # a membership change
    assert streak_after(None, [_node("a", 1)], 1) == Streak()


def test_the_record_survives_etcd_and_a_malformed_one_is_refused():
    streak = Streak(stalled=2, beats=7, checkpoint=12, failures=("x", "y"))
    state = JobState("j", 3, JobStatus.RUNNING, 1, 2, streak=streak)
    assert JobState.decode(state.encode()).streak == streak
    assert b"streak" not in JobState("j", 3, JobStatus.RUNNING, 1, 2).encode()  # nothing written until needed
    info = NodeInfo("a", 2, "h", 1, 1, failed_round=1, progress=RoundProgress(3, 9, True))
    assert NodeInfo.decode(info.encode()) == info
    assert b"progress" not in NodeInfo("a", 2, "h", 1, 1).encode()
    for bad in ({"stalled": -1}, {"beats": "5"}, {"failures": [1]}, []):
        with pytest.raises(RendezvousStateError, match="malformed"):
            Streak.decode(bad, "job state")
    for bad in ({"beats": -2}, {"long": 1}, "x"):
        with pytest.raises(RendezvousStateError, match="malformed"):
            RoundProgress.decode(bad, "node record")


def test_the_lines_name_each_restart_of_the_loop_and_why_none_was_progress():
    streak = Streak(stalled=2, beats=5, checkpoint=-1, failures=("rank 1 failed (exit code 1)",) * 2)
    what = "rank 1 on node n1 failed (exit code 1)"
    assert crash_loop_reason(what, streak, 3) == f"{what}: a crash loop, 3 restarts in a row made no progress (3/3)"
    summary = crash_loop_summary(what, streak, 3, 300.0).splitlines()
    assert summary[0] == (
        "crash loop: 3 restarts in a row made no progress -- no worker beat more than 5 heartbeats in a round, "
        "no elastic.checkpoint step after none, no round ran 300 s (--crash-loop-restarts, --progress-window)"
    )
    assert summary[1:] == [
        "  restart 1: rank 1 failed (exit code 1)",
        "  restart 2: rank 1 failed (exit code 1)",
        f"  restart 3: {what}",
    ]
