"""follow_round: what a follower concludes from its watch events alone (no etcd)."""

from rendezvous.backend import STATE_HEADER
from rendezvous.membership import JobKeys, Snapshot, follow_round
from rendezvous.state import JobState, JobStatus, Participant
from rendezvous.watch import EventType, WatchEvent

KEYS = JobKeys("/elastic", "job")


def _snapshot(revision=10):
    joining = JobState("job", 1, JobStatus.JOINING, 2, 2)
    return Snapshot(joining, 9, (), revision, "a")


def _state_put(state, revision):
    return WatchEvent(EventType.PUT, KEYS.state.encode(), STATE_HEADER + state.encode(), revision, 3)


RUNNING = JobState("job", 1, JobStatus.RUNNING, 2, 2, (Participant("a", 0, "h", 1), Participant("b", 1, "h", 1)), "h", 1)


def test_a_new_state_on_the_watch_is_the_state_now_with_its_token():
    after = follow_round(KEYS, _snapshot(), [_state_put(RUNNING, 12)])
    assert after == Snapshot(RUNNING, 12, (), 12, "a")


def test_the_last_of_several_states_wins():
    forming = JobState("job", 1, JobStatus.JOINING, 2, 2, last_call_at=5.0)
    after = follow_round(KEYS, _snapshot(), [_state_put(forming, 11), _state_put(RUNNING, 13)])
    assert after.state == RUNNING and after.token == 13


def test_events_a_read_already_showed_change_nothing():
    snapshot = _snapshot(revision=20)
    assert follow_round(KEYS, snapshot, [_state_put(RUNNING, 15)]) is snapshot


def test_a_deleted_node_key_or_a_resync_needs_a_read():
    gone = WatchEvent(EventType.DELETE, KEYS.node("a").encode(), b"", 12)
    assert follow_round(KEYS, _snapshot(), [_state_put(RUNNING, 11), gone]) is None
    assert follow_round(KEYS, _snapshot(), [WatchEvent(EventType.RESYNC, revision=30)]) is None


def test_a_deleted_or_corrupt_state_needs_a_read():
    deleted = WatchEvent(EventType.DELETE, KEYS.state.encode(), b"", 12)
    corrupt = WatchEvent(EventType.PUT, KEYS.state.encode(), STATE_HEADER + b"{nope", 12)
    assert follow_round(KEYS, _snapshot(), [deleted]) is None
    assert follow_round(KEYS, _snapshot(), [corrupt]) is None
