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
            def run(self, environ, *, after_failure=False, started=None):
                script.did.append(("check", "after a failure") if after_failure else ("check",))
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
            record=lambda kind, round_, **details: self.did.append(("record", kind, *details.values())),
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
    assert script.did[-1] == ("check", "after a failure")  # the quick check: the job waits for it
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
        record=lambda kind, round_, **details: None,
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


# A stand-in for pynvml with NVML's names and errors, and one for torch: NVML and CUDA cannot run here
# (no GPU; tests/gpu runs the probe on a real one). What each device reports comes from STANDIN.
_STANDINS = {
    "pynvml.py": """
import json, os
spec = json.loads(os.environ["STANDIN"])
class NVMLError(Exception):
    def __init__(self, value):
        self.value = value
    def __str__(self):
        return {3: "Not Supported", 15: "GPU is lost", 12: "NVML Shared Library Not Found"}[self.value]
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_GPU_IS_LOST = 3, 15
NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
def _answer(i, query, default):
    value = spec.get(str(i), {}).get(query, default)
    if value in ("unsupported", "lost"):
        raise NVMLError(3 if value == "unsupported" else 15)
    return value
def nvmlInit():
    if spec.get("runs"):  # each probe that reaches NVML writes its pid
        with open(spec["runs"], "a") as runs:
            runs.write(f"{os.getpid()}\\n")
    if spec.get("slow_counters") and "--counters" in __import__("sys").argv:
        __import__("time").sleep(spec["slow_counters"])
    if spec.get("no_library"):
        raise NVMLError(12)
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return _answer(i, "handle", i)
class _Value: pass
class _Field: pass
def nvmlDeviceGetFieldValues(h, fields):
    assert fields == [230], fields
    field, field.value = _Field(), _Value()
    field.nvmlReturn, field.value.uiVal = 0, _answer(h, "action", 0)
    return [field]
def nvmlDeviceGetTotalEccErrors(h, kind, counter): return _answer(h, "ecc", 0)
def nvmlDeviceGetRemappedRows(h): return _answer(h, "remapped", [0, 0, 0, 0])
def nvmlDeviceGetRetiredPagesPendingStatus(h): return _answer(h, "retired", 0)
""",
    "torch.py": """
class cuda:
    @staticmethod
    def device_count(): return 0
""",
}


def _standin_env(tmp_path, spec: dict) -> dict:
    import json

    for name, text in _STANDINS.items():
        (tmp_path / name).write_text(text)
    return {**os.environ, "PYTHONPATH": str(tmp_path), "STANDIN": json.dumps(spec)}


def _probe(tmp_path, spec: dict, *args: str):
    import subprocess
    import sys

    from launcher.nodecheck import _GPU_PROBE

    env = _standin_env(tmp_path, spec)
    done = subprocess.run([sys.executable, _GPU_PROBE, *args], env=env, capture_output=True, text=True, timeout=30)
    return done.returncode, (done.stderr.strip() if done.returncode else done.stdout.strip())


@pytest.mark.parametrize(
    "spec, said",
    [
        ({"1": {"ecc": 3}}, "GPU 1: 3 uncorrected ECC errors since the driver loaded"),
        ({"0": {"action": 1}}, "GPU 0: the driver asks for a GPU reset"),
        ({"1": {"action": 2}}, "GPU 1: the driver asks for a node reboot"),
        ({"1": {"remapped": [0, 1, 1, 0]}}, "GPU 1: remapped rows wait for a GPU reset"),
        ({"0": {"remapped": [0, 1, 0, 1]}}, "GPU 0: a row remapping failed"),
        ({"0": {"retired": 1}}, "GPU 0: retired pages wait for a GPU reset"),
        ({"1": {"handle": "lost"}}, "GPU 1: NVML cannot reach it (GPU is lost)"),
        ({"0": {"ecc": "lost"}}, "GPU 0: NVML cannot reach it (GPU is lost)"),
    ],
)
def test_the_gpu_probe_fails_a_device_by_what_nvml_says_before_any_matmul(tmp_path, spec, said):
    assert _probe(tmp_path, spec) == (1, said)
    assert _probe(tmp_path, spec, "--counters") == (1, said)  # the quick check after a failure too


def test_the_gpu_probe_skips_what_a_gpu_does_not_support_and_after_a_failure_runs_no_matmul_where_nvml_answers(
    tmp_path,
):
    unsupported = {"ecc": "unsupported", "remapped": "unsupported", "retired": "unsupported"}
    spec = {"0": unsupported, "1": {**unsupported, "action": 0}}
    assert _probe(tmp_path, spec) == (0, "NVML: clean; a matmul ran on 0 devices")
    assert _probe(tmp_path, spec, "--counters") == (0, "NVML: 2 devices clean")
    # no NVML library (a container without it): the matmul decides, after a failure too
    assert _probe(tmp_path, {"no_library": True}, "--counters") == (0, "NVML: not here; a matmul ran on 0 devices")


def _gpu_gate(tmp_path, spec: dict) -> tuple[HealthGate, list[str]]:
    said: list[str] = []
    gate = HealthGate(
        NodeChecks(gpus=True),  # as on a node with /dev/nvidia0
        _standin_env(tmp_path, spec),
        say=said.append,
        record=lambda kind, round_, **details: None,
        step_out=lambda why: None,
        closed=lambda: True,
        healthy=lambda ok: None,
        sleep=lambda seconds: None,
    )
    return gate, said


def _pids(path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_the_gpu_check_after_a_failure_starts_as_the_round_ends_and_its_answer_is_awaited_not_asked_again(tmp_path):
    """The agent starts it when its round ends on a failure (the workers still stopping); the
    check after the failure waits for that one's answer -- one probe, not a second."""
    import time

    runs = tmp_path / "runs"
    gate, said = _gpu_gate(tmp_path, {"1": {"ecc": 2}, "runs": str(runs)})
    gate.round_failing()
    deadline = time.monotonic() + 20
    while not _pids(runs) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(_pids(runs)) == 1  # running before anyone asked for its answer
    assert gate.after_failure("rank 3 failed") is True  # unhealthy: the failure uses no restart
    assert said == [
        "rank 3 failed; this node is unhealthy: the GPU check failed: GPU 1: 2 uncorrected ECC errors since the "
        "driver loaded; it takes no rank (no restart used) and checks again in 5 s"
    ]
    assert len(_pids(runs)) == 1
    runs.unlink()  # a healthy node: restarted as usual, after one probe too
    healthy, _ = _gpu_gate(tmp_path, {"runs": str(runs)})
    healthy.round_failing()
    assert healthy.after_failure("rank 0 failed") is False and len(_pids(runs)) == 1


def test_a_gpu_check_started_for_a_failure_that_needs_none_is_killed_before_the_next_round(tmp_path):
    """A peer's worker failed, or a peer was lost: no check follows, and the one started as the
    round ended is killed (with what it started) before this node joins the next round."""
    import time

    import psutil

    runs = tmp_path / "runs"
    gate, _ = _gpu_gate(tmp_path, {"runs": str(runs), "slow_counters": 60})
    gate.round_failing()
    deadline = time.monotonic() + 20
    while not _pids(runs) and time.monotonic() < deadline:
        time.sleep(0.02)
    (pid,) = _pids(runs)
    started = time.monotonic()
    gate.before_round()  # its first check (the full one) passes at once; the slow one is dropped
    assert time.monotonic() - started < 10 and not psutil.pid_exists(pid)
