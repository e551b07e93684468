"""When a new launch of a closed job's id begins a new run of it (``ending.rerun_refused``), and
which records are the newest run's (``history.last_run``): pure, without etcd."""

from __future__ import annotations

from rendezvous.job.history import RERUN, Event, last_run
from rendezvous.job.state import CLOSED_BY_OPERATOR, JobState, JobStatus, Keep
from rendezvous.rounds.ending import rerun_refused


def _closed(closed_at: float | None = 1000.0, **changes) -> JobState:
    keep = Keep(lease=7, retention=3600, closed_at=closed_at)
    return JobState("job", 4, JobStatus.CLOSED, 1, 2, reason="the job finished", keep=keep, **changes)


def test_a_launch_after_the_close_with_no_node_of_the_old_run_alive_runs_again():
    assert rerun_refused(_closed(), launched_at=1000.5, live_nodes=0) is None
    assert rerun_refused(_closed(failed=True), launched_at=1000.5, live_nodes=0) is None  # fixed, run again


def test_a_node_launched_before_the_close_is_a_late_node_of_that_run_and_never_runs_it_again():
    why, waits = rerun_refused(_closed(), launched_at=999.0, live_nodes=0)
    assert not waits and why == "this node was launched 1.0 s before it closed: a late node of that run"
    assert rerun_refused(_closed(), launched_at=1000.0, live_nodes=0)[1] is False  # at the same instant: late


def test_a_node_of_the_old_run_still_alive_is_waited_for():
    assert rerun_refused(_closed(), launched_at=1005.0, live_nodes=2) == (
        "2 node(s) of the finished run are still alive",
        True,
    )


def test_an_operator_close_and_a_state_without_its_close_time_are_never_run_again():
    assert rerun_refused(_closed(closed_by=CLOSED_BY_OPERATOR), 2000.0, 0) == ("an operator closed it", False)
    assert rerun_refused(_closed(closed_at=None), 2000.0, 0) == ("its state does not say when it closed", False)


def test_the_newest_run_is_what_follows_the_last_rerun_record():
    def event(t: float, kind: str) -> Event:
        return Event(t, 1, "n", kind)

    once = [event(1, "round_frozen"), event(2, "job_closed")]
    assert last_run(once) == once
    twice = [*once, event(3, RERUN), event(4, "round_frozen"), event(5, "job_closed")]
    assert last_run(twice) == twice[3:]
    assert last_run([*twice, event(6, RERUN)]) == []
