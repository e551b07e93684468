"""The health gate without etcd: the checks' reasons, the back-off, and the gate's steps (when it
checks, what it says and records, when it steps out and lets the node join again)."""

from __future__ import annotations

import os

import pytest

from launcher.nodecheck import HealthGate, NodeChecks, backoff, check_dirs, reason_of


def test_a_failed_check_says_its_last_line_or_its_exit_code():
    assert reason_of("--health-check", 1, "checking\n/scratch is full\n\n") == "--health-check failed: /scratch is full"
    assert reason_of("--health-check", 3, "") == "--health-check failed: exit code 3"
    assert [backoff(i) for i in range(7)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]


def test_the_command_runs_with_the_given_environment_and_its_output_is_the_reason(tmp_path):
    env = {"PATH": os.environ["PATH"], "SCRATCH": str(tmp_path)}
    assert NodeChecks(command='test -d "$SCRATCH"').run(env) is None
    failing = NodeChecks(command='echo "no GPU 3 on $SCRATCH"; exit 4').run(env)
    assert failing == f"--health-check failed: no GPU 3 on {tmp_path}"


def test_a_directory_that_cannot_be_written_or_is_full_fails(tmp_path):
    assert check_dirs([str(tmp_path / "logs" / "new")]) is None  # made if missing
    blocked = tmp_path / "file"
    blocked.write_text("x")
    assert check_dirs([str(blocked / "sub")]).startswith(f"{blocked / 'sub'} cannot be written")
    assert "MiB free (at least" in check_dirs([str(tmp_path)], min_free=1 << 62)


class _Script:
    """The gate's callbacks, recording what it did; the checks fail ``failures`` times, then pass."""

    def __init__(self, failures: int, job_exists: bool = True) -> None:
        self.failures, self.job_exists = failures, job_exists
        self.did: list[tuple] = []

    def checks(self) -> NodeChecks:
        script = self

        class Checks(NodeChecks):
            def run(self, environ):
                script.did.append(("check",))
                if script.failures:
                    script.failures -= 1
                    return "--health-check failed: sick"
                return None

        return Checks()

    def gate(self) -> HealthGate:
        return HealthGate(
            self.checks(),
            {},
            say=lambda line: self.did.append(("say", line)),
            record=lambda kind, **details: self.did.append(("record", kind, *details.values())),
            step_out=lambda why: self.did.append(("step_out", why)),
            closed=lambda: self.job_exists,
            healthy=lambda ok: self.did.append(("healthy", ok)),
            sleep=lambda seconds: self.did.append(("sleep", seconds)),
        )


def test_a_healthy_node_is_checked_once_before_its_first_round_only():
    script = _Script(0)
    gate = script.gate()
    gate.before_round()
    gate.before_round()
    assert script.did == [("check",)]


def test_an_unhealthy_node_steps_out_says_it_once_records_it_and_joins_when_it_passes():
    script = _Script(2)
    gate = script.gate()
    gate.before_round()
    kinds = [d[0] for d in script.did]
    assert kinds == [
        "check",
        "say",
        "healthy",
        "step_out",
        "record",
        "sleep",
        "check",
        "sleep",
        "check",
        "say",
        "record",
        "healthy",
    ]
    assert script.did[1][1].startswith("this node is unhealthy: --health-check failed: sick; it takes no rank")
    assert script.did[4] == ("record", "node_unhealthy", "--health-check failed: sick")
    assert [d[1] for d in script.did if d[0] == "sleep"] == [5.0, 10.0]
    assert script.did[-2] == ("record", "node_healthy") and script.did[-1] == ("healthy", True)


def test_a_failure_of_its_own_workers_checks_again_and_an_unhealthy_node_uses_no_restart():
    script = _Script(0)
    gate = script.gate()
    gate.before_round()
    assert gate.after_failure("rank 1 failed") is False  # healthy: restart as usual
    script.failures = 1
    assert gate.after_failure("rank 1 failed") is True
    assert ("say", "rank 1 failed; this node is unhealthy: --health-check failed: sick; it takes no rank "
            "(no restart used) and checks again in 5 s") in script.did  # fmt: skip
    gate.before_round()  # waits out the failure, then passes
    assert script.did[-1] == ("healthy", True)


def test_no_record_before_the_job_exists_and_a_closed_job_ends_the_wait():
    script = _Script(1, job_exists=False)
    script.gate().before_round()
    assert not [d for d in script.did if d[:2] == ("record", "node_unhealthy")]

    class Closed(Exception):
        pass

    def closed():
        raise Closed

    gate = HealthGate(_Script(5).checks(), {}, say=print, record=print, step_out=print, closed=closed, healthy=print)
    with pytest.raises(Closed):
        gate.before_round()


def test_status_names_a_node_whose_last_health_record_says_unhealthy():
    from rendezvous.job.history import Event, unhealthy_nodes

    events = [
        Event(1.0, 1, "a", "node_unhealthy", {"reason": "disk full"}),
        Event(2.0, 1, "b", "node_unhealthy", {"reason": "no GPU"}),
        Event(3.0, 2, "a", "node_healthy", {}),
        Event(4.0, 2, "c", "worker_failed", {"rank": 1}),
    ]
    assert unhealthy_nodes(events) == (("b", "no GPU"),)
    assert unhealthy_nodes(events[:1]) == (("a", "disk full"),)


def test_a_node_unhealthy_past_its_join_timeout_gives_up_worth_a_retry_elsewhere():
    from rendezvous.errors import RendezvousTimeoutError

    script = _Script(100)
    gate = HealthGate(
        script.checks(),
        {},
        say=lambda line: None,
        record=lambda kind, **details: None,
        step_out=lambda why: None,
        closed=lambda: True,
        healthy=lambda ok: None,
        sleep=lambda seconds: script.did.append(("sleep", seconds)),
        patience=30.0,
    )
    with pytest.raises(
        RendezvousTimeoutError, match=r"stayed unhealthy for 30 s \(join timeout 30 s\): --health-check failed: sick"
    ):
        gate.before_round()
    assert [d[1] for d in script.did if d[0] == "sleep"] == [5.0, 10.0, 15.0]  # the last pause ends at the timeout


def test_the_gpu_probe_fails_a_device_whose_nvml_counters_show_uncorrected_errors_or_pages_pending(tmp_path):
    """NVML cannot run here (no GPU): a stand-in ``pynvml`` with NVML's names, first on the path of the
    probe's child interpreter, reports 3 uncorrected ECC errors on device 1; the probe stops there,
    before torch, with that reason. With clean counters it goes on (to torch: not run here)."""
    import subprocess
    import sys
    import textwrap

    from launcher.nodecheck import _GPU_PROBE

    def probe(ecc_on_1: int, pending_on_0: int) -> subprocess.CompletedProcess:
        (tmp_path / "pynvml.py").write_text(
            textwrap.dedent(
                f"""
                class NVMLError(Exception): pass
                NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
                def nvmlInit(): pass
                def nvmlDeviceGetCount(): return 2
                def nvmlDeviceGetHandleByIndex(i): return i
                def nvmlDeviceGetTotalEccErrors(h, kind, counter): return {ecc_on_1} if h == 1 else 0
                def nvmlDeviceGetRetiredPagesPendingStatus(h): return {pending_on_0} if h == 0 else 0
                """
            )
        )
        code = _GPU_PROBE.split("import torch")[0] + "print('counters clean')\n"
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)

    bad = probe(3, 0)
    assert bad.returncode == 1 and bad.stderr.strip() == "GPU 1: 3 uncorrected ECC errors, retired pages pending: False"
    pending = probe(0, 1)
    assert pending.returncode == 1 and "GPU 0: 0 uncorrected ECC errors, retired pages pending: True" in pending.stderr
    clean = probe(0, 0)
    assert clean.returncode == 0 and clean.stdout.strip() == "counters clean"
