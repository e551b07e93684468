"""``elastic-ctl history``'s rows in words (``launcher.cli.history_text``): no record's own terms."""

from __future__ import annotations

from launcher.cli.history_text import details_text, event_words


def test_a_round_formed_says_its_workers_nodes_times_and_who_joined_and_left():
    details = {
        "world_size": 8,
        "nodes": 2,
        "joined": ["a", "b"],
        "joined_count": 11,
        "left": [],
        "left_count": 0,
        "formed_in": 0.5,
        "up": 1.25,
    }
    assert event_words("round_frozen") == "round formed"
    assert details_text("round_frozen", details) == (
        "8 workers on 2 nodes, formed in 0.5 s, 1.25 s after its agent started; joined: a, b and 9 more"
    )
    assert details_text("round_frozen", {"world_size": 1, "nodes": 1, "left": ["c"], "left_count": 1}) == (
        "1 workers on 1 node; left: c"
    )


def test_a_failure_says_rank_host_and_how_it_ended():
    assert details_text("worker_failed", {"rank": 1, "host": "h", "exit_code": 3}) == "rank 1 on h: exit code 3"
    signalled = {"rank": 0, "host": "h", "signal": "SIGKILL", "message": "boom"}
    assert details_text("worker_failed", signalled) == "rank 0 on h: signal SIGKILL: boom"


def test_restarts_closes_and_departures_read_as_sentences():
    assert details_text("group_restarted", {"restart_count": 1, "max_restarts": 3}) == "restart 1 of 3"
    assert details_text("job_closed", {"reason": "the job finished", "by": "agent", "failed": False}) == (
        "the job finished"
    )
    assert details_text("job_closed", {"reason": "x", "by": "operator", "failed": True}) == "failed: x (by operator)"
    assert details_text("node_lost", {"node": "n", "reason": "gone", "by": "m"}) == "n: gone (said by m)"


def test_a_kind_without_its_own_wording_still_has_no_underscores_or_equals():
    assert event_words("some_new_kind") == "some new kind"
    text = details_text("some_new_kind", {"slowest_pair_ms": 3, "names": ["a", "b"], "ok": True})
    assert text == "slowest pair ms 3; names a, b; ok yes"
