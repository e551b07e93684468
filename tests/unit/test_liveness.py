"""The probes' answers from a snapshot of the agent, without an agent."""

from __future__ import annotations

from launcher.telemetry.liveness import STALL, AgentSnapshot, liveness, readiness


def _snap(**changes) -> AgentSnapshot:
    base = dict(
        state="running",
        since_turn=0.1,
        round=3,
        world_size=4,
        group_rank=1,
        has_lease=True,
        lease_age=0.4,
        renew_deadline=14.0,
        workers_running=2,
    )
    return AgentSnapshot(**{**base, **changes})


def test_a_running_agent_with_a_fresh_lease_is_live_and_ready():
    assert liveness(_snap()) == (True, "ok: running, lease renewed 0.4 s ago")
    assert readiness(_snap()) == (True, "ready: 2 workers running in round 3 (world size 4, group rank 1)")


def test_a_stalled_loop_or_a_lapsed_lease_is_not_live_and_says_why():
    assert liveness(_snap(since_turn=STALL + 1)) == (
        False,
        f"not live: the agent's loop has not turned for {STALL + 1:.1f} s (state running)",
    )
    ok, text = liveness(_snap(lease_age=15.0))
    assert not ok and text.startswith("not live: no lease renewal for 15.0 s (renew deadline 14 s)")


def test_before_a_round_or_between_rounds_it_is_live_but_not_ready():
    waiting = _snap(state="rendezvous", round=None, has_lease=False, workers_running=0)
    assert liveness(waiting) == (True, "ok: rendezvous")
    assert readiness(waiting) == (False, "not ready: rendezvous, 0 workers running")
    assert readiness(_snap(state="restarting", workers_running=0)) == (
        False,
        "not ready: restarting (round 3), 0 workers running",
    )
