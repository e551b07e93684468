"""Peer probes without sockets or etcd: the wire, the timing, the probed node's contact deadline,
the watcher's silence clocks, the ring of who probes whom, and the safety rule that ties them:
a node's own deadline always comes ``margin`` before any watcher can call it dead."""

import json
import random

import pytest

from launcher.peers.contact import ContactLog, Silence
from launcher.peers.wire import parse, ping, pong, timing
from launcher.restart import change_line, loss_line
from rendezvous.errors import RendezvousSettingsError, RendezvousStateError
from rendezvous.job.ranktable import Target, bucket_of, decode_bucket, encode_buckets, watch_lists
from rendezvous.job.state import Cause, JobState, JobStatus, NodeInfo, Participant
from rendezvous.rounds.decide import LiveNode, restart_count
from rendezvous.settings import RendezvousSettings

T = timing(1.5)


def test_the_default_timing_pings_six_times_a_timeout_and_fences_a_third_of_it_early():
    assert (T.timeout, T.interval, T.fence_after, T.margin) == (1.5, 0.25, 1.0, 0.5)


def test_probe_lines_round_trip_and_anything_else_is_not_one():
    assert parse(ping(7, 42).rstrip(b"\n")) == ("ping", 7, 42)
    assert parse(pong(7, 43).rstrip(b"\n")) == ("pong", 7, 43)
    for junk in (b"", b"ping", b"ping 1", b"pong a 1", b"GET / HTTP/1.1", b"ping -1 2", b"ping 1 2 3"):
        assert parse(junk) is None, junk


def test_the_contact_deadline_starts_at_the_first_answer_and_moves_only_with_acknowledged_ones():
    log = ContactLog(T.fence_after)
    assert log.deadline(3) is None  # nobody probes yet: no deadline from the peers
    first = log.answer(3, now=10.0)
    assert log.deadline(3) == 11.0
    second = log.answer(3, now=10.25)
    assert log.deadline(3) == 11.0  # sent, not known to have arrived
    assert log.acknowledged(3, second) and log.deadline(3) == 11.25
    assert not log.acknowledged(3, first)  # an older acknowledgment never moves it back
    assert not log.acknowledged(4, second)  # another round's
    assert not log.acknowledged(3, 999)  # never sent
    assert log.heard_for(3, now=12.0) == pytest.approx(1.75)
    log.forget_before(4)
    assert log.deadline(3) is None


def test_a_watcher_judges_only_a_peer_it_heard_and_then_by_silence_or_a_closed_connection():
    s = Silence(["a", "b"], T, now=0.0)
    s.closed("a")  # refused before it ever answered: a misconfiguration, not a death
    s.tick(0.25)
    assert s.dead(5.0) == {} and not s.lagging(5.0)
    s = Silence(["a", "b"], T, now=0.0)
    s.heard("a", 0.1)
    s.heard("b", 0.1)
    s.tick(0.25)
    s.heard("b", 0.25)
    s.tick(0.5)
    s.closed("b")
    assert s.dead(0.5) == {"b": "its agent's probe connection was closed"}
    assert s.lagging(0.5) and not s.answered_since(0.2)
    s.heard("b", 0.6)  # it answered again on a new connection
    t = 0.5
    while t < 1.6:
        t += 0.25
        s.tick(t)
        s.heard("b", t)
    assert list(s.dead(t)) == ["a"] and "no answer to probes for 1.6 s" in s.dead(t)["a"]


def test_a_watcher_that_looked_late_does_not_count_the_time_it_did_not_look():
    s = Silence(["a"], T, now=0.0)
    s.heard("a", 0.0)
    s.tick(0.25)
    s.tick(3.0)  # this watcher was starved (or frozen) for 2.75 s
    assert s.dead(3.0) == {}
    # counted: the 0.5 s until its late turn was due, then the time from that turn on
    assert s.dead(3.99) == {}
    assert "a" in s.dead(4.0)


def test_a_node_s_deadline_comes_a_margin_before_its_watchers_all_call_it_dead():
    """Two watchers probe one node over links that drop pings and answers and go dead at random:
    whenever both call it dead (its lease would be ended), its contact deadline was already
    ``margin`` in the past -- it fenced itself first."""
    agreed = sum(_simulate(seed) for seed in range(300))
    assert agreed > 100  # the verdict was reached (and checked) in many of the runs


def _simulate(seed: int) -> bool:
    rng = random.Random(seed)
    log = ContactLog(T.fence_after)
    watchers = {w: Silence(["x"], T, now=0.0) for w in ("w1", "w2")}
    received = dict.fromkeys(watchers, 0)
    loss = {w: rng.random() * 0.5 for w in watchers}
    dead_from = {w: rng.uniform(0.5, 6.0) if rng.random() < 0.8 else float("inf") for w in watchers}
    answers_lost_from = {w: rng.uniform(0.5, dead_from[w]) if rng.random() < 0.5 else dead_from[w] for w in watchers}
    verdicts: dict[str, float] = {}
    agreed = False
    now = 0.0
    while now < 10.0:
        now = round(now + T.interval * rng.uniform(0.6, 1.0), 4)
        for w, silence in watchers.items():
            silence.tick(now)
            if w in verdicts or now >= dead_from[w] or rng.random() < loss[w]:
                pass  # the ping is lost
            else:
                log.acknowledged(1, received[w])
                seq = log.answer(1, now)
                if now < answers_lost_from[w] and rng.random() >= loss[w]:  # else the answer is lost
                    received[w] = seq
                    silence.heard("x", now + rng.uniform(0.0, 0.05))
            if w not in verdicts and silence.dead(now):
                verdicts[w] = now
        if len(verdicts) == len(watchers):  # every watcher agrees: the lease is ended now
            deadline = log.deadline(1)
            assert deadline is not None and deadline <= now - T.margin + 1e-9, (deadline, now, verdicts)
            agreed = True
            break
    return agreed


def test_each_node_probes_its_next_two_in_group_rank_order_and_so_has_two_watchers():
    people = [Participant(n, i, "h", 1) for i, n in enumerate("abcde")]
    probes = {p.node: (f"h:{1000 + i}", 100 + i) for i, p in enumerate(people)}
    lists = watch_lists(people, probes)
    assert [t.node for t in lists["a"]] == ["b", "c"] and [t.node for t in lists["e"]] == ["a", "b"]
    assert lists["d"][0] == Target("e", "h:1004", 104, 2)
    watched = [t.node for ts in lists.values() for t in ts]
    assert all(watched.count(n) == 2 for n in "abcde")  # O(N): two probes a node
    assert {n: [t.node for t in ts] for n, ts in watch_lists(people[:2], probes).items()} == {"a": ["b"], "b": ["a"]}
    assert watch_lists(people[:1], probes) == {"a": ()}
    del probes["c"]  # an agent that answers no probes is in no ring
    assert [t.node for t in watch_lists(people, probes)["b"]] == ["d", "e"]


def test_a_row_carries_its_watch_list_and_a_malformed_one_is_a_state_error():
    people = [Participant(n, i, "h", 1) for i, n in enumerate("abc")]
    lists = watch_lists(people, {p.node: (f"h:{2000 + i}", 7 + i) for i, p in enumerate(people)})
    values = encode_buckets(people, 1, lists)
    rows = {p.participant.node: p for p in decode_bucket(values[bucket_of("a", 1)], "bucket")}
    assert rows["a"].watch == lists["a"] and rows["c"].watch == lists["c"]
    assert decode_bucket(encode_buckets(people, 1)[0], "b")[0].watch == ()  # no probes: rows as before
    for bad in ([["b", "h:1", 7]], [["b", "nohost", 7, 2]], [["b", "h:1", "7", 2]], [["b", "h:1", 7, 0]], "b"):
        with pytest.raises(RendezvousStateError, match="watch list"):
            decode_bucket(f'[["a",0,"h",1,0,{json.dumps(bad)}]]'.encode(), "bucket 0")


def test_a_node_record_names_its_probe_endpoint_only_when_it_has_one():
    info = NodeInfo("a", 1, "h", 1, 1, probe="10.0.0.1:4321")
    assert NodeInfo.decode(info.encode()).probe == "10.0.0.1:4321"
    assert b"probe" not in NodeInfo("a", 1, "h", 1, 1).encode()
    with pytest.raises(RendezvousStateError, match="probe"):
        NodeInfo.decode(info.encode().replace(b"10.0.0.1:4321", b"10.0.0.1"))


# -- blame: a failure that comes with a peer's loss -------------------------------------------------
def _frozen(members, restarts=0):
    return JobState(
        run_id="job",
        round=4,
        status=JobStatus.RUNNING,
        min_nodes=1,
        max_nodes=4,
        participants=tuple(Participant(n, i, "h", 1) for i, n in enumerate(members)),
        master_addr="h",
        master_port=1,
        restarts=restarts,
        max_restarts=0,
    )


def test_a_failure_reported_in_a_round_whose_peers_found_a_participant_dead_uses_no_restart():
    failed = [LiveNode(NodeInfo(n, 5, "h", 1, 1, failed_round=4), i) for i, n in enumerate("ab")]
    assert restart_count(_frozen("abc", restarts=2), failed, 5, peers_lost=True) == 2  # c's machine died
    assert restart_count(_frozen("abc", restarts=2), failed, 5) == 3  # c left otherwise: a worker failure


def test_every_node_says_the_same_line_for_a_lost_node():
    class Monitor:
        cause = Cause(lost=("c",), waiting=2)

    line = change_line(_frozen("abc"), Monitor(), lease_lost=False, restarts=0, budget=0)
    assert (
        line
        == loss_line(("c",), 0, 0)
        == ("node c left the round (agent gone or silent): re-rendezvous, no restart used (0/0)")
    )


def test_peer_probes_are_on_by_default_off_with_a_short_renew_deadline_and_their_keys_are_checked():
    assert RendezvousSettings("j").peer_window == 1.5
    assert RendezvousSettings("j", lease_ttl=3).peer_window == 0  # the lease is nearly as quick
    assert RendezvousSettings.from_conf("j", 1, 2, "peer_timeout=0").peer_window == 0
    assert RendezvousSettings.from_conf("j", 1, 2, "peer_timeout=3,probe_port=7000").probe_port == 7000
    for bad in ("peer_timeout=0.1", "peer_timeout=-1", "probe_port=70000", "probe_addr=nohost", "probe_addr=:1"):
        with pytest.raises(RendezvousSettingsError):
            RendezvousSettings.from_conf("j", 1, 2, bad)


def test_a_watcher_s_goodbye_takes_the_round_s_deadline_off():
    log = ContactLog(T.fence_after)
    log.answer(2, now=5.0)
    log.release(2)  # it withdrew its accusation and stopped watching: no verdict can come for round 2
    assert log.deadline(2) is None
    log.answer(3, now=6.0)
    assert log.deadline(3) == 7.0  # the next round's watchers are another matter
    assert parse(b"bye 2 0") == ("bye", 2, 0)
