"""The lighthouse's quorum rules (pure) and the quorum being formed (with a fake clock and issue
step): what torchft's own tests do not cover -- shrink_only, the majority rule, a join wait with
several replica groups, ids that go on from the last one issued, a leader that is fenced."""

from __future__ import annotations

import threading
import time

import pytest

from lighthouse import wire
from lighthouse.book import Fenced, Issued, decode_issued, encode_issued
from lighthouse.forming import Forming, Withdrawn
from lighthouse.quorum import Asked, Rules, decide, healthy, next_id

RULES = Rules(min_replicas=2, join_timeout=10.0, heartbeat_timeout=5.0, quorum_tick=0.01)


def asked(*ids: str, at: float = 0.0, shrink: str = "") -> dict[str, Asked]:
    return {rid: Asked(rid, at, shrink_only=rid in shrink) for rid in ids}


def heard(*ids: str, at: float = 0.0) -> dict[str, float]:
    return dict.fromkeys(ids, at)


def test_healthy_is_heard_within_the_heartbeat_timeout():
    assert healthy({"a": 0.0, "b": 4.0}, now=5.0, timeout=5.0) == {"b"}


def test_no_quorum_below_min_replicas():
    d = decide(1.0, asked("a"), heard("a"), None, RULES)
    assert d.members is None and "need min_replicas 2" in d.reason


def test_all_healthy_joined_forms_at_once_in_replica_id_order():
    d = decide(1.0, asked("b", "a"), heard("a", "b"), None, RULES)
    assert d.members == ("a", "b") and d.reason.startswith("Valid quorum found")


def test_majority_rule_refuses_half_of_the_healthy_groups():
    """Two of four heartbeating groups may not form a quorum, whatever the join timeout says."""
    d = decide(100.0, asked("a", "b", at=0.0), heard("a", "b", "c", "d", at=99.0), None, RULES)
    assert d.members is None and "at least half of 4 healthy workers" in d.reason
    d = decide(100.0, asked("a", "b", "c", at=0.0), heard("a", "b", "c", "d", at=99.0), None, RULES)
    assert d.members == ("a", "b", "c")


def test_join_wait_for_stragglers_with_several_groups():
    groups = heard("a", "b", "c", "d", "e", at=5.0)
    waiting = decide(6.0, asked("a", "b", "c", at=1.0), groups, None, RULES)
    assert waiting.members is None and "waiting for 2 healthy but not participating stragglers" in waiting.reason
    # the timeout counts from the first request, not the last
    late = {**asked("a", at=1.0), **asked("b", "c", at=10.5)}
    assert decide(11.0, late, heard("a", "b", "c", "d", "e", at=10.9), None, RULES).members == ("a", "b", "c")
    # a straggler that stops heartbeating is not waited for
    assert decide(
        10.5, asked("a", "b", "c", at=6.0), {**heard("a", "b", "c", at=10.0), "d": 5.4, "e": 5.4}, None, RULES
    ).members == ("a", "b", "c")


def test_fast_path_when_every_previous_member_asked_again_even_below_min_replicas():
    d = decide(1.0, asked("a"), heard("a", "b"), ("a",), RULES)
    assert d.members == ("a",) and d.reason.startswith("Fast quorum")
    # newcomers ride along on the fast path
    assert decide(1.0, asked("a", "c"), heard("a", "b", "c"), ("a",), RULES).members == ("a", "c")


def test_shrink_only_keeps_newcomers_out():
    d = decide(1.0, asked("a", "b", "new", shrink="a"), heard("a", "b", "new"), ("a", "b"), RULES)
    assert d.members == ("a", "b") and "shrink_only=True" in d.reason
    # a shrink with a previous member gone: only the remaining previous members
    d = decide(
        20.0, asked("a", "b", "new", shrink="b", at=0.0), heard("a", "b", "new", at=19.0), ("a", "b", "c"), RULES
    )
    assert d.members == ("a", "b")


def test_ids_advance_on_member_change_or_commit_failures_only():
    assert next_id(0, None, ("a",), False) == 1
    assert next_id(4, ("a", "b"), ("b", "a"), False) == 4
    assert next_id(4, ("a", "b"), ("a",), False) == 5
    assert next_id(4, ("a", "b"), ("a", "b"), True) == 5


def _within(seconds: float = 10.0) -> float:
    """A deadline on the monotonic clock: a test that fails does not leave a waiter behind forever."""
    return time.monotonic() + seconds


def member(rid: str, step: int = 0, failures: int = 0, shrink: bool = False):
    return wire.QuorumMember(
        replica_id=rid, step=step, commit_failures=failures, shrink_only=shrink, address=f"m-{rid}"
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_record_round_trips_and_rejects_garbage():
    issued = Issued(7, (member("a", 3), member("b", 3)), 1.5)
    back, lease = decode_issued(encode_issued(issued, 42), "k")
    assert (back.quorum_id, back.replica_ids, back.members[0].step, lease) == (7, ("a", "b"), 3, 42)
    for raw in (
        b"not json",
        b'{"quorum_id": "7", "members": []}',
        b'{"quorum_id": -1, "members": []}',
        b'{"members": []}',
    ):
        with pytest.raises(Exception, match="not a lighthouse quorum record"):
            decode_issued(raw, "k")


def test_ids_go_on_from_the_previous_leaders_record():
    calls: list[tuple[int, bool]] = []
    clock = Clock()
    issue = lambda i, new: calls.append((i.quorum_id, new))  # noqa: E731
    forming = Forming(Rules(min_replicas=1), Issued(41, (member("a"),)), issue, clock=clock)
    assert forming.quorum(member("a", 5), deadline=_within()).quorum_id == 41  # same members: no new id, no write
    clock.now += 6  # a is silent past the heartbeat timeout
    assert forming.quorum(member("b", 5), deadline=_within()).quorum_id == 42  # changed: written
    assert calls == [(41, False), (42, True)]


def test_a_group_left_out_asks_again_for_the_next_quorum():
    """A newcomer kept out by shrink_only is in the next quorum, without asking again itself."""
    rules = Rules(min_replicas=1, join_timeout=60.0, heartbeat_timeout=5.0, quorum_tick=0.01)
    forming = Forming(rules, Issued(1, (member("a"), member("b"))), lambda i, new: None)
    for rid in ("a", "b", "new"):
        forming.heard(rid)
    got: dict[str, tuple[int, tuple[str, ...]]] = {}

    def ask(m) -> None:
        issued = forming.quorum(m, _within())
        got[m.replica_id] = (issued.quorum_id, issued.replica_ids)

    def together(*members) -> None:
        threads = [threading.Thread(target=ask, args=(m,), daemon=True) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)

    newcomer = threading.Thread(target=ask, args=(member("new"),), daemon=True)
    newcomer.start()
    newcomer.join(0.1)
    assert "new" not in got  # one of three heartbeating groups: no majority
    together(member("a", 1, shrink=True), member("b", 1))
    assert got["a"] == got["b"] == (1, ("a", "b"))  # shrink_only: same members, same id
    assert "new" not in got
    together(member("a", 2), member("b", 2))
    newcomer.join(5)
    assert got["new"] == got["a"] == (2, ("a", "b", "new"))


def test_the_issue_itself_puts_the_left_out_back_before_any_waiter_wakes():
    """Left out of a quorum, a group is asking for the next one at once, not when its waiter wakes:
    a quorum decided before that (the others asking again first) would leave it out once more."""
    clock = Clock()
    rules = Rules(min_replicas=1, join_timeout=60.0, heartbeat_timeout=1000.0, quorum_tick=0.01)
    forming = Forming(rules, Issued(1, (member("a"), member("b"), member("x"))), lambda i, new: None, clock=clock)
    for rid in ("a", "b", "new", "x"):  # x heartbeats but does not ask: no fast path, a join wait
        forming.heard(rid)
    outcomes: list[object] = []

    def ask(m) -> None:
        try:
            outcomes.append(forming.quorum(m, clock.now + 1000))
        except Fenced as why:
            outcomes.append(why)

    asking = [
        threading.Thread(target=ask, args=(m,), daemon=True)
        for m in (member("new"), member("a", 1, shrink=True), member("b", 1))
    ]
    for thread in asking:
        thread.start()
    wait_until = time.monotonic() + 5
    while "[3/3 participants healthy]" not in forming.status()[0]:
        assert time.monotonic() < wait_until, forming.status()[0]
        time.sleep(0.01)
    with forming._cond:  # no waiter runs until this block ends
        clock.now += 61  # past the join timeout: (a, b) is issued here, shrink_only leaves new out
        forming.tick()
        assert [m.replica_id for m in forming.status()[1].members] == ["a", "b"]
        assert "[1/1 participants healthy]" in forming.status()[0]  # new already asks for the next
    forming.stop(Fenced("the test is over"))  # new's waiter ends
    for thread in asking:
        thread.join(5)
    assert len(outcomes) == 3 and sum(isinstance(o, Fenced) for o in outcomes) == 1


def test_a_fenced_leader_tells_every_waiter_and_issues_nothing():
    issued: list[int] = []

    def issue(i: Issued, new: bool) -> None:
        raise Fenced("claim lost")

    forming = Forming(Rules(min_replicas=1), None, issue)
    with pytest.raises(Fenced):
        forming.quorum(member("a"), deadline=_within())
    assert forming.stopped is not None and not issued
    with pytest.raises(Fenced):
        forming.quorum(member("b"), deadline=_within())


def test_a_request_times_out_at_its_deadline_with_the_reason():
    clock = Clock()
    forming = Forming(RULES, None, lambda i, new: None, clock=clock)
    with pytest.raises(TimeoutError, match="need min_replicas 2"):
        forming.quorum(member("a"), deadline=clock.now)


def test_a_new_leader_hears_heartbeats_before_a_slow_path_quorum():
    clock = Clock()
    rules = Rules(min_replicas=1, quorum_tick=0.01)
    forming = Forming(
        rules, Issued(3, (member("gone"),)), lambda i, new: None, settle_until=clock.now + 0.3, clock=clock
    )
    got: list[int] = []
    asking = threading.Thread(
        target=lambda: got.append(forming.quorum(member("a"), clock.now + 10).quorum_id), daemon=True
    )
    asking.start()
    asking.join(0.2)
    assert not got and "hearing the replicas' heartbeats" in forming.status()[0]
    clock.now += 0.31
    asking.join(5)
    assert got == [4]


def test_the_fast_path_does_not_wait_for_a_new_leader_to_settle():
    clock = Clock()
    forming = Forming(
        Rules(min_replicas=1), Issued(3, (member("a"),)), lambda i, new: None, settle_until=clock.now + 60, clock=clock
    )
    assert forming.quorum(member("a", 1), deadline=clock.now + 1).quorum_id == 3  # (step 1: not a retry)


def test_a_request_whose_caller_went_away_is_in_no_quorum():
    """b asked, then its call was cancelled (its replica died): the quorum formed when a and c ask
    must not name b, which would never hear of it while a and c wait for it in their allreduce."""
    clock = Clock()
    rules = Rules(min_replicas=1, join_timeout=60.0, heartbeat_timeout=1000.0, quorum_tick=0.01)
    forming = Forming(rules, Issued(1, (member("a"), member("b"), member("c"))), lambda i, new: None, clock=clock)
    for rid in ("a", "c"):
        forming.heard(rid)
    outcomes: list[object] = []

    def ask(m, gone=None) -> None:
        try:
            outcomes.append(forming.quorum(m, clock.now + 1000, gone))
        except Withdrawn as why:
            outcomes.append(why)

    def asking(*members, gone=None, waiting: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=ask, args=(m, gone), daemon=True) for m in members]
        for thread in threads:
            thread.start()
        wait_until = time.monotonic() + 5
        while f"[{waiting}/{waiting} participants healthy][3 heartbeating]" not in forming.status()[0]:
            assert time.monotonic() < wait_until, forming.status()[0]
            time.sleep(0.01)
        return threads

    b, gone = member("b", 1), threading.Event()
    (b_asks,) = asking(b, gone=gone, waiting=1)
    gone.set()
    forming.withdraw(b)
    b_asks.join(5)
    assert len(outcomes) == 1 and isinstance(outcomes[0], Withdrawn)
    others = asking(member("a", 1), member("c", 1), waiting=2)  # b still heartbeats: a join wait
    clock.now += 61
    forming.tick()
    for thread in others:
        thread.join(5)
    assert [(o.quorum_id, o.replica_ids) for o in outcomes[1:]] == [(2, ("a", "c"))] * 2


def test_only_the_request_that_ended_is_withdrawn():
    """b's old call ends after b asked again with a new one: the new one stays asked."""
    forming = Forming(Rules(min_replicas=2, quorum_tick=0.01), None, lambda i, new: None)
    old, new = member("b"), member("b")
    got: list[tuple[str, ...]] = []
    asking = threading.Thread(target=lambda: got.append(forming.quorum(new, _within()).replica_ids), daemon=True)
    asking.start()
    asking.join(0.1)
    forming.withdraw(old)
    assert forming.quorum(member("a"), _within()).replica_ids == ("a", "b")
    asking.join(5)
    assert got == [("a", "b")]


def test_a_request_whose_answer_was_lost_gets_the_same_quorum_again():
    """The replica relaying b's answer died after the quorum was issued: b's Manager sends the same
    request again and must get that quorum (a is in its allreduce with b), not wait for a next one
    that a, waiting for b, will never ask for. Another step or failure count is a new request."""
    forming = Forming(Rules(min_replicas=2, quorum_tick=0.01), Issued(1, (member("a"), member("b"))), lambda i, n: None)
    got: list[Issued] = []
    asking = threading.Thread(target=lambda: got.append(forming.quorum(member("b", 7), _within())), daemon=True)
    asking.start()
    assert forming.quorum(member("a", 7), _within()).replica_ids == ("a", "b")
    asking.join(5)
    again = forming.quorum(member("b", 7), _within(0.5))  # b's retry, a not asking: the same quorum at once
    assert again is got[0] and again.quorum_id == 1
    for retry in (member("b", 8), member("b", 7, failures=1)):
        with pytest.raises(TimeoutError):  # a new request: it waits for a
            forming.quorum(retry, time.monotonic() + 0.2)


def test_a_fenced_leader_does_not_answer_a_retry_from_its_last_quorum():
    """A leader frozen past its lease, thawed with x's retry waiting: x must not get the quorum
    in its memory (another leader may have issued a higher id since); it is told Fenced."""
    fenced = threading.Event()

    def issue(i: Issued, new: bool) -> None:
        if fenced.is_set():
            raise Fenced("claim lost")

    forming = Forming(Rules(min_replicas=1), Issued(1, (member("x"),)), issue)
    assert forming.quorum(member("x"), _within()).quorum_id == 1  # a retry, confirmed: the same quorum
    fenced.set()
    with pytest.raises(Fenced):
        forming.quorum(member("x"), _within())
    assert forming.stopped is not None
