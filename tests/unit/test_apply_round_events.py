"""apply_round_events: what the rounds conclude from their watch events alone (no etcd)."""

from dataclasses import replace

from rendezvous.etcd.watch import EventType, WatchEvent
from rendezvous.job.keys import STATE_HEADER, JobKeys
from rendezvous.job.state import JobState, JobStatus, NodeInfo, Participant
from rendezvous.rounds.decide import LiveNode
from rendezvous.rounds.snapshot import Snapshot, apply_round_events, lacks_table

KEYS = JobKeys("/elastic", "job")


def _snapshot(revision=10):
    joining = JobState("job", 1, JobStatus.JOINING, 2, 2)
    return Snapshot(joining, 9, (), revision, "a")


def _state_put(state, revision):
    return WatchEvent(EventType.PUT, KEYS.state.encode(), STATE_HEADER + state.encode(), revision, 3)


RUNNING = JobState("job", 1, JobStatus.RUNNING, 2, 2, "h", 1, table="1-aa", size=2, world=2, buckets=1)


def test_a_new_state_on_the_watch_is_the_state_now_with_its_token():
    after = apply_round_events(KEYS, _snapshot(), [_state_put(RUNNING, 12)])
    assert after == Snapshot(RUNNING, 12, (), 10, "a")


def test_the_last_of_several_states_wins():
    forming = JobState("job", 1, JobStatus.JOINING, 2, 2, last_call_at=5.0)
    after = apply_round_events(KEYS, _snapshot(), [_state_put(forming, 11), _state_put(RUNNING, 13)])
    assert after.state == RUNNING and after.token == 13


def test_events_a_read_already_showed_change_nothing():
    snapshot = _snapshot(revision=20)
    gone = WatchEvent(EventType.DELETE, KEYS.node("a").encode(), b"", 18)
    assert apply_round_events(KEYS, snapshot, [_state_put(RUNNING, 15), gone]) == snapshot


def test_a_state_older_than_the_one_applied_does_not_replace_it():
    # Two key ranges on one watch: the state range may deliver late, the token guards the order.
    forming = JobState("job", 1, JobStatus.JOINING, 2, 2, last_call_at=5.0)
    newer = apply_round_events(KEYS, _snapshot(), [_state_put(RUNNING, 14)])
    assert apply_round_events(KEYS, newer, [_state_put(forming, 12)]).state == RUNNING


def _node(name, round_=1):
    return NodeInfo(node=name, round=round_, addr="h", local_world_size=1, master_port=1)


def _node_event(kind, name, revision, create_revision):
    value = _node(name).encode() if kind is EventType.PUT else b""
    return WatchEvent(kind, KEYS.node(name).encode(), value, revision, create_revision)


def test_the_coordinators_snapshot_follows_node_puts_and_deletions():
    snapshot = Snapshot(None, None, (LiveNode(_node("a"), 5), LiveNode(_node("b"), 6)), 10, "a", all_nodes=True)
    events = [
        _node_event(EventType.PUT, "c", 11, 11),
        _node_event(EventType.DELETE, "a", 12, 0),
        WatchEvent(EventType.PUT, KEYS.nodes.encode() + b"stray", b"not json", 13, 13),
    ]
    after = apply_round_events(KEYS, snapshot, events)
    assert sorted(n.info.node for n in after.nodes) == ["b", "c"]
    assert after.coordinator == "a" and after.all_nodes and after.revision == 10  # the coordinator key says who


def test_the_coordinator_key_changing_needs_a_read():
    gone = WatchEvent(EventType.DELETE, KEYS.coordinator.encode(), b"", 12)
    assert apply_round_events(KEYS, _snapshot(), [gone]) is None


def test_the_coordinator_keeps_the_participants_it_read_until_a_state_names_another_table():
    members = (Participant("a", 0, "h", 1), Participant("b", 1, "h", 1))
    snapshot = Snapshot(replace(RUNNING, participants=members), 9, (LiveNode(_node("a"), 5),), 10, "a", all_nodes=True)
    finishing = apply_round_events(KEYS, snapshot, [_state_put(replace(RUNNING, finishing=True), 11)])
    assert finishing.state.finishing and finishing.state.participants == members
    other = apply_round_events(KEYS, snapshot, [_state_put(replace(RUNNING, round=2, table="2-bb"), 11)])
    assert other.state.table == "2-bb" and other.state.participants == () and lacks_table(other)
    assert not lacks_table(finishing)


def test_a_followers_snapshot_needs_a_read_for_any_node_event():
    assert apply_round_events(KEYS, _snapshot(), [_node_event(EventType.PUT, "c", 11, 11)]) is None


def test_a_deleted_node_key_or_a_resync_needs_a_read():
    gone = WatchEvent(EventType.DELETE, KEYS.node("a").encode(), b"", 12)
    assert apply_round_events(KEYS, _snapshot(), [_state_put(RUNNING, 11), gone]) is None
    assert apply_round_events(KEYS, _snapshot(), [WatchEvent(EventType.RESYNC, revision=30)]) is None


def test_a_deleted_or_corrupt_state_needs_a_read():
    deleted = WatchEvent(EventType.DELETE, KEYS.state.encode(), b"", 12)
    corrupt = WatchEvent(EventType.PUT, KEYS.state.encode(), STATE_HEADER + b"{nope", 12)
    assert apply_round_events(KEYS, _snapshot(), [deleted]) is None
    assert apply_round_events(KEYS, _snapshot(), [corrupt]) is None


def test_a_node_key_whose_value_is_no_node_record_is_taken_out_as_a_read_would():
    from rendezvous.rounds.snapshot import apply_node_event

    nodes = {"a": LiveNode(_node("a"), 5)}
    apply_node_event(KEYS, nodes, WatchEvent(EventType.PUT, KEYS.node("a").encode(), b"garbage", 12, 5))
    assert nodes == {}
    apply_node_event(KEYS, nodes, _node_event(EventType.PUT, "b", 13, 13))
    assert list(nodes) == ["b"] and nodes["b"].create_revision == 13
