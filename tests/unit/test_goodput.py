"""The goodput account (pure): a job's history records cut into training and lost time by cause,
the incidents costliest first, and the round record's details a node writes."""

from __future__ import annotations

import pytest

from launcher.goodput.account import Spent, account_of
from launcher.goodput.drag import Pace, lay, rate_shares
from launcher.goodput.marks import RoundMarks, round_details
from launcher.goodput.text import report_lines
from launcher.hangs.hangwatch import RoundWork
from launcher.hangs.steptimes import StepTimes
from rendezvous.job.history import Event

T0 = 1_800_000_000.0


def frozen(at: float, round_: int, formed_in: float, world: int = 2) -> Event:
    return Event(T0 + at, round_, "a", "round_frozen", {"formed_in": formed_in, "world_size": world, "nodes": world})


def ended(at: float, round_: int, outcome: str, *, ran: float, stop: float = 0.5, rank: int = 0, **marks) -> Event:
    """A round_ended record written at ``at`` (after the stop), its workers started ``ran + stop`` before."""
    details = {"outcome": outcome, "group_rank": rank, "ran": ran, "stop": stop, "steps": 0, "step": -1, **marks}
    return Event(T0 + at, round_, "a" if rank == 0 else "b", "round_ended", details)


def closed(at: float, round_: int) -> Event:
    return Event(T0 + at, round_, "a", "job_closed", {"reason": "the job finished", "failed": False, "by": "agent"})


def killed_once() -> list[Event]:
    """Two rounds: rank 1 SIGKILLed in the first (saved 10 s before), the second runs to the end."""
    return [
        frozen(0.0, 1, 0.0),
        ended(50.5, 1, "failed", ran=50.0, first_step=1.0, last_step=49.8, steps=250, step=199, saved=40.0),
        Event(T0 + 50.0, 1, "b", "worker_failed", {"rank": 1, "signal": "SIGKILL", "exit_code": None}),
        frozen(51.0, 2, 0.3),
        ended(101.0, 2, "succeeded", ran=49.5, first_step=1.5, last_step=49.0, steps=240, step=430),
        closed(101.0, 2),
    ]


def totals(account) -> dict[Spent, float]:
    out = {Spent.TRAINING: round(account.productive, 3)}
    out.update({cause: round(seconds, 3) for cause, seconds in account.lost.items()})
    return out


def test_a_job_that_ran_through_is_training_but_its_wait_start_and_stop():
    # nodes wait 2 s for each other; workers start at 2.5, first step at 4.5, end at 102.5, gone at 103
    events = [
        frozen(2.0, 1, 2.0),
        ended(103.0, 1, "succeeded", ran=100.0, stop=0.5, first_step=2.0, last_step=99.9, steps=500, step=490),
        closed(103.2, 1),
    ]
    account = account_of(events)
    assert account.wall == pytest.approx(103.2)
    assert totals(account) == {
        Spent.TRAINING: 97.9,  # first step to last
        Spent.WAITING: 2.0,
        Spent.START: 2.5,  # freeze -> workers started (0.5) -> first step (2.0)
        Spent.STOPPING: 0.8,  # last step -> the round's end (0.1) -> workers gone (0.5) -> the close (0.2)
    }
    assert sum(s.seconds for s in account.segments) == pytest.approx(account.wall)  # the segments tile the wall time
    assert account.goodput == pytest.approx(97.9 / 103.2)


def test_the_job_begins_at_its_first_agent_s_start_and_the_agents_own_start_is_the_job_s_start_cost():
    # The freezing agent had run 3.2 s when it froze the first round: the job began at -1.2, 1.2 s
    # before the first node's arrival (0.0: the freeze at 2.0 less its 2.0 s of forming).
    first = frozen(2.0, 1, 2.0)
    first.details["up"] = 3.2
    later = frozen(60.0, 2, 0.5)
    later.details["up"] = 1.0  # a new node's agent: it started long after the job
    events = [
        first,
        ended(30.0, 1, "failed", ran=27.5, stop=0.5, first_step=2.0, last_step=27.0, steps=100, step=90),
        later,
        ended(100.0, 2, "succeeded", ran=39.5, stop=0.5, first_step=1.0, last_step=39.0, steps=150, step=240),
        closed(100.0, 2),
    ]
    account = account_of(events)
    assert account.start == pytest.approx(T0 - 1.2) and account.wall == pytest.approx(101.2)
    assert account.from_start and report_lines(account, "j")[0].startswith(
        "job j: 1 min 41 s from its first agent's start"
    )
    assert account.segments[0].cause is Spent.START and account.segments[0].seconds == pytest.approx(1.2)
    assert sum(s.seconds for s in account.segments) == pytest.approx(account.wall)
    (start,) = [i for i in account.incidents if "the job's start" in i.what]
    assert dict(start.parts)[Spent.START] == pytest.approx(1.2 + 2.0)  # its own, then to the first step
    assert dict(start.parts)[Spent.WAITING] == pytest.approx(2.0)
    without = account_of([frozen(2.0, 1, 2.0), *events[1:]])  # an older agent's records: no "up"
    assert without.start == pytest.approx(T0) and without.wall == pytest.approx(100.0) and not without.from_start
    for bad in (-1.0, True, "3", float("inf")):
        odd = frozen(2.0, 1, 2.0)
        odd.details["up"] = bad
        assert account_of([odd, *events[1:]]).start == pytest.approx(T0), bad


def test_a_failure_costs_the_steps_since_the_last_save_the_stop_the_rendezvous_and_the_next_start():
    events = [
        frozen(0.0, 1, 0.0),
        # round 1: started at 0, first step at 1, saved at 40, a worker died at 50, workers gone at 50.5
        ended(50.5, 1, "failed", ran=50.0, first_step=1.0, last_step=49.8, steps=250, step=199, saved=40.0),
        Event(T0 + 50.0, 1, "b", "worker_failed", {"rank": 1, "signal": "SIGKILL", "exit_code": -9}),
        frozen(51.0, 2, 0.3),  # formed 0.5 s after the stop
        ended(101.0, 2, "succeeded", ran=49.5, stop=0.5, first_step=1.5, last_step=49.0, steps=240, step=430),
        closed(101.0, 2),
    ]
    account = account_of(events)
    lost = totals(account)
    assert lost[Spent.REDONE] == pytest.approx(10.0)  # 40 -> 50: redone after the restart
    assert lost[Spent.RENDEZVOUS] == pytest.approx(0.5)
    assert lost[Spent.START] == pytest.approx(1.0 + 1.5)  # each round's start to its first step
    assert lost[Spent.STOPPING] == pytest.approx(0.5 + 0.5 + 0.5)  # each stop, and round 2's finish
    assert lost[Spent.TRAINING] == pytest.approx(39.0 + 47.5)
    worst = account.incidents[0]
    assert worst.what == "round 1: rank 1 on b failed (signal SIGKILL)", worst
    # its cost: the redone steps, the stop, the next round's forming and start
    assert worst.seconds == pytest.approx(10.0 + 0.5 + 0.5 + 1.5)


def test_a_hang_costs_the_silence_until_the_verdict_and_the_steps_since_the_save():
    events = [
        frozen(0.0, 1, 0.0),
        ended(40.5, 1, "hung", ran=40.0, first_step=1.0, last_step=30.0, steps=150, step=99, saved=20.0),
        frozen(41.0, 2, 0.1),
        ended(60.0, 2, "succeeded", ran=18.5, first_step=0.5, last_step=18.0, steps=90, step=190, saved=18.0),
        closed(60.0, 2),
    ]
    lost = totals(account_of(events))
    assert lost[Spent.HANG] == pytest.approx(10.0)  # last heartbeat at 30, verdict at 40
    assert lost[Spent.REDONE] == pytest.approx(10.0)  # saved at 20, last step at 30


def test_a_job_that_saves_nothing_says_so_and_counts_no_redone_steps():
    events = [
        frozen(0.0, 1, 0.0),
        ended(20.5, 1, "failed", ran=20.0, first_step=1.0, last_step=19.0, steps=90),
        frozen(21.0, 2, 0.1),
        ended(40.0, 2, "succeeded", ran=18.5, first_step=1.0, last_step=18.0, steps=90),
        closed(40.0, 2),
    ]
    account = account_of(events)
    assert Spent.REDONE not in account.lost
    assert any("save no elastic.checkpoint" in note for note in account.notes), account.notes


def test_a_job_without_heartbeats_trains_from_its_workers_start_to_the_first_exit_and_says_so():
    # workers start at 2.5; the first exits 0 at 100.5 (node b, rank 1's record), the last at 102.5, gone at 103
    events = [
        frozen(2.0, 1, 2.0),
        ended(103.0, 1, "succeeded", ran=100.0, stop=0.5, first_exit=99.0),
        ended(103.1, 1, "succeeded", ran=100.1, stop=0.5, rank=1, first_exit=98.0),
        closed(103.2, 1),
    ]
    account = account_of(events)
    assert totals(account) == {
        Spent.TRAINING: 98.0,  # the workers' start (2.5) to the first exit seen (100.5)
        Spent.WAITING: 2.0,
        Spent.STOPPING: 2.7,  # the first exit to the last (102.5), the workers gone (103), the close (103.2)
        Spent.START: 0.5,  # the freeze to the workers' start
    }
    assert account.goodput == pytest.approx(98.0 / 103.2)
    assert any("call no elastic.heartbeat()" in note and "until the first one exits" in note for note in account.notes)


def test_a_job_without_heartbeats_that_lost_a_worker_trains_until_the_fault_and_after_the_restart():
    events = [
        frozen(0.0, 1, 0.0),
        ended(30.5, 1, "failed", ran=30.0),  # killed at 30: no heartbeat, no save -- nothing known redone
        Event(T0 + 30.0, 1, "b", "worker_failed", {"rank": 1, "signal": "SIGKILL", "exit_code": None}),
        frozen(31.0, 2, 0.2),
        ended(62.0, 2, "succeeded", ran=30.6, stop=0.3, first_exit=30.0),
        closed(62.0, 2),
    ]
    lost = totals(account_of(events))
    assert lost[Spent.TRAINING] == pytest.approx(30.0 + 30.0)
    assert lost[Spent.STOPPING] == pytest.approx(0.5 + 0.6 + 0.3)  # each stop, and the first exit to the last
    assert lost[Spent.STOPPING] < 0.05 * lost[Spent.TRAINING]


def test_a_round_slower_than_the_fastest_of_its_size_is_straggler_drag():
    events = [
        frozen(0.0, 1, 0.0),
        # 101 steps in 100 s: 1 s a step
        ended(
            102.0, 1, "membership changed", ran=101.5, first_step=1.0, last_step=101.0, steps=101, step=100, saved=101.0
        ),
        frozen(102.5, 2, 0.1),
        # 51 steps in 100 s: 2 s a step -- half the job's speed
        ended(204.0, 2, "succeeded", ran=101.0, first_step=1.0, last_step=101.0, steps=51, step=150),
        closed(204.0, 2),
    ]
    account = account_of(events)
    assert account.lost[Spent.STRAGGLER] == pytest.approx(50.0, abs=0.6)  # half of round 2's training


def test_a_named_straggler_drags_by_its_score_from_when_it_was_named():
    events = [
        frozen(0.0, 1, 0.0),
        Event(T0 + 50.0, 1, "b", "straggler", {"rank": 1, "score": 0.5, "pace": 0.2, "fastest": 0.1}),
        ended(101.0, 1, "succeeded", ran=100.5, first_step=0.5, last_step=100.0, steps=400, step=390),
        closed(101.0, 1),
    ]
    assert account_of(events).lost[Spent.STRAGGLER] == pytest.approx(0.5 * 50.0, abs=0.01)  # to the last step


def replaced_straggler() -> list[Event]:
    """A straggler at half speed named at 50 s, slow for 12 s before, its node replaced at 51.5 s."""
    return [
        frozen(0.0, 1, 0.0),
        Event(T0 + 50.0, 1, "b", "straggler", {"rank": 1, "score": 0.5, "slow_for": 12.0}),
        Event(T0 + 51.0, 1, "b", "node_left", {"reason": "replaced by a spare"}),
        ended(52.0, 1, "replaced", ran=51.5, first_step=0.5, last_step=51.0, steps=400, step=390, kept=True),
        frozen(52.5, 2, 0.2),
        ended(100.0, 2, "succeeded", ran=47.0, first_step=0.5, last_step=46.5, steps=400, step=790, kept=True),
        closed(100.0, 2),
    ]


def test_a_straggler_named_late_drags_from_when_it_was_slow():
    # slow from 38 s to the round's end at 51.5 s, at half the job's speed
    assert account_of(replaced_straggler()).lost[Spent.STRAGGLER] == pytest.approx(0.5 * 13.5, abs=0.01)


def test_a_straggler_s_drag_lies_in_the_windows_where_it_was_slow():
    account = account_of(replaced_straggler())
    goodput = [round(w[2], 3) for w in account.windows(10)]  # 10 s windows; slow at half speed from 38 s to 51.5 s
    assert goodput[1:3] == [1.0, 1.0]  # healthy: nothing of the drag here
    assert goodput[3] == pytest.approx(0.9) and goodput[4] == pytest.approx(0.5)  # 30-38 s healthy, 38-50 s slow
    assert sum(s.drag for s in account.segments) == pytest.approx(0.5 * 13.5, abs=0.01)  # the total as before


def test_drag_is_laid_on_the_pieces_by_how_slow_each_was():
    # a round 15 % slower than the job's healthy rate, with a straggler at half speed from 40 to 60: the
    # straggler's stretch lost half of its 20 s, the round's other 5 s lie on the rest by length
    pieces = lay(0.0, 100.0, 0.15, [(40.0, 60.0, 0.5)])
    assert pieces == [(0.0, 40.0, 2.5), (40.0, 60.0, 10.0), (60.0, 100.0, 2.5)]
    # a round slow by its straggler alone: its drag all where it was slow, even where the round's rate
    # says less (the straggler's score is its own measure)
    assert lay(0.0, 100.0, 0.1, [(40.0, 60.0, 0.5)]) == [(0.0, 40.0, 0.0), (40.0, 60.0, 10.0), (60.0, 100.0, 0.0)]
    assert lay(0.0, 100.0, 0.05, [(40.0, None, 0.5)]) == [(0.0, 40.0, 0.0), (40.0, 100.0, 30.0)]
    assert lay(0.0, 100.0, 0.6, [(0.0, None, 0.5)]) == [(0.0, 100.0, 60.0)]  # nowhere else to lay the rest
    assert lay(0.0, 10.0, 0.0, []) == [(0.0, 10.0, 0.0)]
    # rounds recorded without a healthy step: dragged only when more than 10 % slower than the fastest
    old = {1: Pace(2, 100, 1.0), 2: Pace(2, 100, 2.0), 3: Pace(3, 0, None), 4: Pace(2, 100, 1.05)}
    assert rate_shares(old) == {1: 0.0, 2: 0.5, 3: 0.0, 4: 0.0}


def test_every_step_slower_than_the_job_s_healthy_pace_is_drag():
    # the job's healthy pace: the rounds' healthy steps weighted by their steps (1.0 s: round 1's, not the
    # fastest round's 0.98 s -- one lucky round does not make the rest slow)
    paces = {
        1: Pace(2, 500, 1.04, 1.0),
        2: Pace(2, 300, 1.0, 0.98),
        3: Pace(2, 100, 2.0, 1.9),
        4: Pace(3, 50, 0.8, 0.7),
    }
    shares = rate_shares(paces)
    assert shares[1] == pytest.approx(1 - 1 / 1.04)  # 4 % slower on average than its healthy steps: not noise
    assert shares[2] == 0.0 and shares[3] == pytest.approx(0.5)  # a slow round does not make itself healthy
    assert shares[4] == pytest.approx(1 - 0.7 / 0.8)  # each world size against its own pace


def test_a_round_s_healthy_step_is_read_from_its_record_and_a_bad_one_is_not_believed():
    def drag(pace: object, key: str = "healthy_step") -> float:
        events = [
            frozen(0.0, 1, 0.0),
            # 101 steps in 100 s: 1 s a step on average, its healthy step 0.8 s
            ended(102.0, 1, "succeeded", ran=101.5, first_step=1.0, last_step=101.0, steps=101, **{key: pace}),
            closed(102.0, 1),
        ]
        return account_of(events).lost.get(Spent.STRAGGLER, 0.0)

    assert drag(0.8) == pytest.approx(20.0, abs=0.01)  # 0.2 s lost of each 1 s step
    assert drag(0.8, "median_step") == pytest.approx(20.0, abs=0.01)  # an older agent's record: its median
    assert drag("0.8") == drag(-1.0) == drag(True) == drag(float("nan")) == 0.0  # as with none


def test_slow_steps_with_no_straggler_named_are_an_incident_of_their_own_not_the_round_end_s():
    events = [
        frozen(0.0, 1, 0.0),
        # 101 steps in 100 s (1 s each on average, half of them 0.8 s), then a worker killed
        ended(102.0, 1, "failed", ran=101.5, first_step=1.0, last_step=101.0, steps=101, healthy_step=0.8),
        Event(T0 + 101.5, 1, "b", "worker_failed", {"rank": 1, "signal": "SIGKILL", "exit_code": None}),
        frozen(102.5, 2, 0.1),
        ended(204.0, 2, "succeeded", ran=101.0, first_step=1.0, last_step=101.0, steps=126, healthy_step=0.8),
        closed(204.0, 2),
    ]
    incidents = {i.what: i for i in account_of(events).incidents}
    slow = incidents["round 1: steps slower than the job's healthy step"]
    assert slow.seconds == pytest.approx(0.2 * 100.5, abs=0.01)  # its training: 1.0 s to the kill's round end
    assert slow.parts == ((Spent.STRAGGLER, slow.seconds),)
    failed = incidents["round 1: rank 1 on b failed (signal SIGKILL)"]
    assert Spent.STRAGGLER not in dict(failed.parts)  # the kill did not make round 1's steps slow
    named = account_of(replaced_straggler()).incidents  # a named straggler's round: its drag is its incident's
    assert [i.what for i in named if "slower than" in i.what] == []
    assert dict(named[0].parts)[Spent.STRAGGLER] == pytest.approx(0.5 * 13.5, abs=0.01), named[0]


def test_a_named_straggler_s_incident_holds_the_drag_from_when_it_was_slow_and_not_the_round_s_other_slow_steps():
    # round 1: 10 % slower than its healthy 1 s steps all along (load: 72 steps to 80 s), and a rank at
    # half speed from 80 s (named at 90 s, slow for 10 s: 9 steps more), its node replaced at 100 s
    events = [
        frozen(0.0, 1, 0.0),
        Event(T0 + 90.0, 1, "b", "straggler", {"rank": 1, "score": 0.5, "slow_for": 10.0}),
        ended(101.0, 1, "replaced", ran=100.5, first_step=0.5, last_step=100.0, steps=82, healthy_step=1.0, kept=True),
        frozen(101.5, 2, 0.1),
        ended(302.0, 2, "succeeded", ran=200.0, first_step=0.5, last_step=200.0, steps=200, healthy_step=1.0),
        closed(302.0, 2),
    ]
    account = account_of(events)
    incidents = {i.what: i for i in account.incidents}
    straggled = next(i for what, i in incidents.items() if "straggled" in what)
    slow = incidents["round 1: steps slower than the job's healthy step"]
    stretch = dict(straggled.parts)[Spent.STRAGGLER]
    assert slow.seconds > 0 and stretch == pytest.approx(0.5 * 20.0, abs=0.3)  # half of 80 s to the round's end
    round_1 = sum(s.drag for s in account.segments if s.round == 1)
    assert stretch + slow.seconds == pytest.approx(round_1, abs=0.01)  # nothing lost or counted twice
    before = sum(s.drag for s in account.segments if s.round == 1 and s.end <= T0 + 80.0)  # the load before it
    assert slow.seconds == pytest.approx(before, abs=0.01)


def test_step_times_give_their_median_and_healthy_step_within_a_twentieth_of_a_percent():
    times = StepTimes()
    for step in (0.061, 0.0605, 0.062, 5.0, 0.0615):
        times.add(step)
    times.add(0.06, 2)  # a read that found two new heartbeats
    assert times.count == 7 and times.median() == pytest.approx(0.061, rel=0.0005)
    assert times.healthy() == pytest.approx((0.061 + 0.0605 + 0.062 + 0.0615 + 0.12) / 6, rel=0.0005)  # 5 s: a stall
    other = StepTimes()
    other.add(0.2, 10)
    both = StepTimes.combined([times, other])  # the steps of two workers
    assert both.count == 17 and both.median() == pytest.approx(0.2, rel=0.0005)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        times.add(bad)
    times.add(1.0, 0)
    assert times.count == 7 and StepTimes().median() is None and StepTimes().healthy() is None


def test_a_jittery_round_s_healthy_step_is_its_mean_and_its_stalls_are_not_in_it():
    times = StepTimes()
    times.add(0.050, 60)  # a healthy job's steps: most at 50 ms, some at 70 (jitter, not loss)
    times.add(0.070, 40)
    assert times.median() == pytest.approx(0.050, rel=0.0005)
    assert times.healthy() == pytest.approx(0.058, rel=0.0005)  # its rate: a median would call 14 % lost
    times.add(0.074, 2)  # up to STALL times the median: still jitter
    times.add(0.100, 3)  # a half-speed stretch, and a fault's pause: stalls, left to the drag
    times.add(3.0)
    assert times.median() == pytest.approx(0.050, rel=0.0005)
    assert times.healthy() == pytest.approx((3.0 + 2.8 + 0.148) / 102, rel=0.0005)


def test_a_round_whose_record_is_missing_is_unknown_not_rendezvous():
    events = [
        frozen(0.0, 1, 0.0),
        frozen(60.0, 2, 1.0),  # round 1's nodes recorded nothing (both died)
        ended(100.0, 2, "succeeded", ran=38.5, first_step=1.0, last_step=38.0, steps=100, step=90),
        closed(100.0, 2),
    ]
    lost = account_of(events).lost
    assert lost[Spent.UNKNOWN] == pytest.approx(59.0) and lost.get(Spent.RENDEZVOUS) == pytest.approx(1.0)


def test_the_lowest_group_rank_s_record_is_the_round_s():
    events = [
        frozen(0.0, 1, 0.0),
        ended(30.0, 1, "succeeded", rank=1, ran=29.0, first_step=9.0, last_step=28.0, steps=20),
        ended(30.0, 1, "succeeded", rank=0, ran=29.0, first_step=1.0, last_step=28.0, steps=20),
        closed(30.0, 1),
    ]
    assert account_of(events).lost[Spent.START] == pytest.approx(1.0 + 0.5)


def test_windows_give_each_stretch_its_goodput():
    events = [
        frozen(10.0, 1, 10.0),  # 10 s waiting
        ended(20.5, 1, "succeeded", ran=10.0, stop=0.5, first_step=0.0, last_step=10.0, steps=20),
        closed(20.5, 1),
    ]
    windows = account_of(events).windows(2)  # of 10.25 s each: training from 10.0 to 20.0
    assert [w[2] for w in windows] == pytest.approx([0.25 / 10.25, 9.75 / 10.25])


def test_the_round_record_s_details_are_offsets_from_the_workers_start():
    marks = RoundMarks(100.0, 130.0, 130.4, first=102.0, last=129.5, steps=77, healthy=0.3571234, save=(70, 5125.0))
    # the same instant: monotonic 131.0 is 5131.0 on the wall clock: the workers started at 5100.0
    details = round_details(marks, outcome="failed", group_rank=0, now_wall=5131.0, now=131.0)
    assert details == {
        "outcome": "failed",
        "group_rank": 0,
        "ran": 30.0,
        "stop": 0.4,
        "steps": 77,
        "step": 70,
        "first_step": 2.0,
        "last_step": 29.5,
        "healthy_step": 0.357123,
        "saved": 25.0,
    }
    old = round_details(
        RoundMarks(100.0, 130.0, 130.4, save=(10, 5000.0)), outcome="failed", group_rank=1, now_wall=5131.0, now=131.0
    )
    assert old["step"] == 10 and "saved" not in old and "first_step" not in old  # a save of an earlier round
    assert "healthy_step" not in old


def test_the_page_has_a_mark_for_every_record_a_segment_for_every_stretch_and_nothing_fetched():
    from launcher.goodput.page import page

    events = killed_once()
    account = account_of(events)
    html = page(account, "job <1>", generated=T0)
    assert html.count('class="mark"') == len(events)
    assert html.count('class="segment"') == len(account.segments)
    assert "job &lt;1&gt;" in html and "<script" not in html and "http" not in html.replace("http-equiv", "")
    assert 'id="goodput">' + f"{account.goodput * 100:.1f} %" in html


def test_the_table_names_the_goodput_the_causes_and_the_costliest_first():
    from launcher.goodput.text import report_lines

    events = killed_once()
    lines = report_lines(account_of(events), "job-1")
    assert lines[0] == "job job-1: 1 min 41 s from the first node's arrival, 2 rounds, closed"
    assert lines[1] == "goodput 85.6 % (1 min 26 s of training)"
    assert any(line.startswith("steps redone since the last save") and "10.00" in line for line in lines), lines
    first = next(line for line in lines if line.strip().startswith("1."))
    assert "round 1: rank 1 on b failed (signal SIGKILL)" in first, lines


def test_under_inprocess_a_fault_s_survivors_keep_their_steps_nothing_is_redone_from_the_save():
    events = [
        frozen(0.0, 1, 0.0),
        ended(50.5, 1, "failed", ran=50.0, first_step=1.0, last_step=49.9, steps=250, saved=40.0, kept=True),
        frozen(51.0, 2, 0.3),
        ended(101.0, 2, "succeeded", ran=49.5, first_step=0.2, last_step=49.0, steps=240, step=430, kept=True),
        closed(101.0, 2),
    ]
    assert Spent.REDONE not in account_of(events).lost


def test_a_round_s_work_goes_into_its_marks_field_by_field():
    work = RoundWork(first=102.0, last=129.5, beats=77, healthy=0.36, own=21.5)
    marks = RoundMarks(100.0, 130.0, 130.4, **work.marks())
    assert (marks.first, marks.last, marks.steps, marks.healthy, marks.own) == (102.0, 129.5, 77, 0.36, 21.5)
    assert RoundMarks(100.0, 130.0, 130.4, **RoundWork().marks()) == RoundMarks(100.0, 130.0, 130.4)
    assert round_details(marks, outcome="succeeded", group_rank=0, now_wall=5131.0, now=131.0)["own_work"] == 21.5
    assert "own_work" not in round_details(
        RoundMarks(100.0, 130.0, 130.4), outcome="succeeded", group_rank=0, now_wall=5131.0, now=131.0
    )
