"""When a job lost its last agent, from its history (rendezvous.job.stopped), without etcd."""

from __future__ import annotations

from rendezvous.job.history import Event
from rendezvous.job.state import JobState, JobStatus
from rendezvous.job.stopped import Stopped, stopped_from

NOON = 1_800_000_000.0 - 1_800_000_000.0 % 86400 + 12 * 3600  # 12:00:00 UTC of some day


def _state(status=JobStatus.RUNNING, round_=2, size=3):
    return JobState("job", round_, status, 1, 3, size=size)


def _events(*specs):
    return [Event(NOON + at, round_, node, kind) for at, round_, node, kind in specs]


def test_every_node_said_it_left_gives_the_last_ones_time():
    events = _events(
        (0, 2, "c", "round_frozen"), (60, 2, "a", "node_left"), (62, 2, "b", "node_left"), (64, 2, "c", "node_left")
    )
    found = stopped_from(_state(), events)
    assert found == Stopped(NOON + 64, 0)
    assert found.describe(NOON + 100) == "no live agent since 12:01:04 UTC"


def test_a_silent_node_makes_the_time_a_lower_bound_and_is_counted():
    events = _events((0, 2, "c", "round_frozen"), (60, 2, "a", "node_left"), (5, 1, "b", "node_left"))
    found = stopped_from(_state(), events)
    assert found == Stopped(NOON + 60, 2)  # b's record is of round 1: it says nothing of round 2
    text = found.describe(NOON + 100)
    assert text == "no live agent since some time after 12:01:00 UTC; 2 nodes left no word: their leases ran out"


def test_while_the_next_round_forms_the_records_of_the_round_before_count():
    events = _events((0, 2, "a", "node_left"), (1, 2, "b", "node_left"))
    assert stopped_from(_state(JobStatus.JOINING, round_=3, size=2), events) == Stopped(NOON + 1, 0)


def test_no_record_says_so_and_another_day_shows_its_date():
    assert stopped_from(_state(), []).describe(NOON) == "no live agent (the job's history does not say since when)"
    assert Stopped(NOON, 0).describe(NOON + 86400).startswith("no live agent since 20")
