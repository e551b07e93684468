"""The crash-loop breaker without etcd or workers: what counts as progress, how the job's streak
is counted when a restart is, when a failure trips it, and the record's trip through etcd."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.restart import crash_loop_reason, crash_loop_summary, failure_of, raise_site
from launcher.workers.errorfile import ErrorRecord
from launcher.workers.group import GroupState, GroupStatus, WorkerFailure
from rendezvous.errors import RendezvousStateError
from rendezvous.job.progress import SHOWN_FAILURES, RoundProgress, Streak, alike, counted, progressed, tripped
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


def _killed(rank: int, ran: float) -> RoundProgress:
    return RoundProgress(how="SIGKILL", rank=rank, ran=ran)


def test_workers_sigkilled_from_outside_at_other_ranks_or_times_never_make_a_crash_loop():
    """The fault soak's kills: a random worker of 8, every few seconds -- no two in a row alike."""
    kills = [_killed(3, 7.0), _killed(5, 6.5), _killed(0, 12.0), _killed(0, 3.1), _killed(6, 3.0), _killed(6, 9.5)]
    assert _cycles(kills) == 0
    times = [4.0, 9.5, 3.2, 15.0, 7.7, 12.1, 5.5, 20.0]
    assert _cycles([_killed(2, t) for t in times]) == 0  # the same rank, at times that differ


def test_the_same_exception_at_the_same_step_and_the_same_oom_after_start_are_still_loops():
    raised = RoundProgress(how="exit 1", rank=1, site="train.py:42 in step", ran=3.0)
    again = [raised, replace(raised, ran=3.3), replace(raised, rank=0, ran=2.8), raised]  # whichever rank came first
    assert _cycles(again) == 3
    oom = [_killed(0, 1.2), _killed(0, 1.5), _killed(0, 1.1)]  # the kernel picks the same process each time
    assert _cycles(oom) == 3
    cold_then_warm = [replace(raised, ran=9.0), *[replace(raised, ran=2.1)] * 4]  # the first start imports
    assert _cycles(cold_then_warm) == 4


@pytest.mark.parametrize(
    "other",
    [
        RoundProgress(how="exit 2", rank=1, site="train.py:42 in step", ran=3.0),
        RoundProgress(how="exit 1", rank=1, site="data.py:7 in load", ran=3.0),
        RoundProgress(how="exit 1", rank=1, site="train.py:42 in step", ran=30.0),
        RoundProgress(how="SIGKILL", rank=1, ran=3.0),
    ],
    ids=["another exit code", "another site", "a much longer run", "a signal"],
)
def test_a_failure_unlike_the_streaks_starts_a_streak_of_its_own(other):
    raised = RoundProgress(how="exit 1", rank=1, site="train.py:42 in step", ran=3.0)
    assert alike(raised, replace(raised, rank=4, ran=3.5)) and not alike(raised, other)
    streak = counted(counted(Streak(), [("a", raised)]), [("a", raised)])
    assert streak.stalled == 2 and not tripped(streak, other, 3) and tripped(streak, raised, 3)
    assert counted(streak, [("b", other)]).stalled == 1
    assert alike(RoundProgress(), other), "a record that says nothing of its failure (an older agent's) goes on"
    assert not alike(_killed(1, 3.0), _killed(2, 3.0))


def test_a_nodes_request_says_how_its_first_failed_worker_ended_where_and_after_how_long():
    traceback = 'Traceback (most recent call last):\n  File "/job/train.py", line 42, in step\n    raise ValueError\n'
    raised = WorkerFailure(0, 3, 1, "h", 10.0, "", ErrorRecord("ValueError: bad", traceback, 10))
    killed = WorkerFailure(1, 4, -9, "h", 11.0, "", None)
    failure = failure_of(GroupStatus(GroupState.FAILED, (killed, raised)), "n1", None)
    assert failure.progress(7, -1, False, 3.456) == RoundProgress(
        7, -1, False, "exit 1", 3, "train.py:42 in step", 3.46
    )
    only_killed = failure_of(GroupStatus(GroupState.FAILED, (killed,)), "n1", None).progress(0, -1, False, 1.0)
    assert (only_killed.how, only_killed.rank, only_killed.site) == ("SIGKILL", 4, "")
    assert raise_site("no frames here") == ""


def _node(name: str, round_: int, failed_round: int = 0, progress: RoundProgress | None = None) -> LiveNode:
    info = NodeInfo(name, round_, "h", 1, 1, failed_round=failed_round, failure=f"{name} failed", progress=progress)
    return LiveNode(info, 1)


def test_the_coordinator_counts_the_streak_only_with_a_restart():
    state = JobState("j", 3, JobStatus.RUNNING, 1, 2, restarts=1, streak=Streak(stalled=1, beats=5))
    failing = [_node("a", 4, failed_round=3, progress=DIES_AT_STEP_5), _node("b", 4)]
    assert streak_after(state, failing, 4) == Streak(stalled=2, beats=5, failures=("a failed",), last=(DIES_AT_STEP_5,))
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
    marked = RoundProgress(3, 9, False, "SIGKILL", 4, "train.py:1 in f", 2.5)
    streak = Streak(stalled=1, failures=("x",), last=(marked,))
    assert Streak.decode(streak.encode(), "job state") == streak
    assert RoundProgress.decode(marked.encode(), "node record") == marked
    assert b"progress" not in NodeInfo("a", 2, "h", 1, 1).encode()
    for bad in ({"stalled": -1}, {"beats": "5"}, {"failures": [1]}, []):
        with pytest.raises(RendezvousStateError, match="malformed"):
            Streak.decode(bad, "job state")
    for bad in ({"beats": -2}, {"long": 1}, "x", {"ran": -3}, {"rank": "1"}, {"how": 5}, {"site": "x" * 301}):
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
