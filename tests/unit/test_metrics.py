"""The agent's metrics through a real prometheus-client registry (no endpoint, no etcd)."""

from __future__ import annotations

from launcher.runner import RoundOutcome, RoundResult
from launcher.telemetry.metrics import PrometheusTelemetry
from rendezvous.job.state import FailureKind


def _value(telemetry: PrometheusTelemetry, name: str, **labels: str) -> float | None:
    return telemetry.registry.get_sample_value(name, {"run_id": "job", "node": "n", **labels})


def test_the_budget_is_known_before_the_first_round_and_the_state_has_a_state_label():
    telemetry = PrometheusTelemetry("job", "n", max_restarts=3)
    assert _value(telemetry, "elastic_job_max_restarts") == 3.0
    assert _value(telemetry, "elastic_agent_state", state="init") == 1.0
    telemetry.state("running")
    assert _value(telemetry, "elastic_agent_state", state="running") == 1.0
    assert _value(telemetry, "elastic_agent_state", state="init") == 0.0


def test_the_restart_cause_is_the_jobs_a_failure_elsewhere_is_not_a_membership_change():
    elsewhere = RoundResult(
        RoundOutcome.MEMBERSHIP_CHANGED,
        failure="rank 3 on node b failed (exit code 1)",
        failure_kind=FailureKind.WORKER,
    )
    hung = RoundResult(RoundOutcome.MEMBERSHIP_CHANGED, failure="rank 1 on node b hung", failure_kind=FailureKind.HANG)
    assert (elsewhere.cause, hung.cause) == ("worker_failure", "hang")
    assert RoundResult(RoundOutcome.MEMBERSHIP_CHANGED).cause == "membership_change"
    telemetry = PrometheusTelemetry("job", "n")
    telemetry.restarted(elsewhere.cause)
    telemetry.hung("deadlock")
    assert _value(telemetry, "elastic_restarts_total", cause="worker_failure") == 1.0
    assert _value(telemetry, "elastic_restarts_total", cause="membership_change") == 0.0
    assert _value(telemetry, "elastic_hangs_total", culprit="deadlock") == 1.0
