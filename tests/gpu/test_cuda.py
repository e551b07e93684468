"""The project's CUDA paths on a real GPU (run where one is: skipped elsewhere with the reason):
warm-forked workers that start CUDA after the fork, elastic.checkpoint's CUDA tensors through a
restart, a GPU-side straggler seen by the CUDA events of ``elastic.watch_ddp``, and the health
gate's GPU check with the real NVML. One GPU is enough: the ranks of a job share it through gloo."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from launcher.nodecheck import _GPU_PROBE, NodeChecks
from tests.e2e.cli_helpers import agent_args, finish, json_records, run, run_id, start, wait_for
from tests.torch.test_stragglers import history, workers

HERE = os.path.dirname(os.path.abspath(__file__))
DDP = os.path.join(HERE, "workers", "cuda_ddp.py")
PACED = os.path.join(HERE, "workers", "cuda_paced.py")
# The workers keep their DDP model until main() returns, as the tutorials do; a teardown that deadlocks
# at exit is the agent's to end, after 10 s of doing nothing here (60 by default).
EXIT_STUCK = ["--exit-stuck-timeout", "10"]


def _steps(out: str, attempt: int, rank: int) -> list[tuple[int, float, float]]:
    with open(os.path.join(out, f"steps-{attempt}-{rank}.txt")) as handle:
        return [(int(s), float(t), float(c)) for s, t, c in (line.split() for line in handle if line.strip())]


def _smi(query: str) -> list[str]:
    """One nvidia-smi query (``--query-gpu=index``, ``--query-compute-apps=pid``): a value a line."""
    shown = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.split()


def test_warm_forked_workers_train_on_the_gpu_and_a_killed_ones_state_comes_back_on_the_gpu(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *EXIT_STUCK]
    done = run([*args, DDP, str(out), "30", "1", "12"], 240)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = {(r["attempt"], r["rank"]): r for r in json_records(str(out), "*.json", "rank")}
    assert set(seen) == {(0, 0), (0, 1), (1, 0), (1, 1)}, seen
    # the restart is forked from the warm interpreter (torch imported, CUDA not started there), and CUDA works after
    assert all(seen[(1, r)]["preloaded"] and not seen[(1, r)]["cuda_initialized"] for r in (0, 1)), seen
    # rank 1 died right after saving step 12: it loads that save, its tensors on the GPU, the same values
    saved = {step: check for step, _, check in _steps(str(out), 0, 1)}
    loaded = seen[(1, 1)]["loaded"]
    assert loaded["step"] == 12 and loaded["devices"] == ["cuda:0"], loaded
    assert loaded["checksum"] == saved[12], (loaded, saved[12])
    assert seen[(1, 0)]["loaded"]["devices"] == ["cuda:0"], seen[(1, 0)]
    # both ranks go on to the end; DDP keeps their models equal
    ends = [_steps(str(out), 1, r)[-1] for r in (0, 1)]
    assert [e[0] for e in ends] == [29, 29] and ends[0][2] == ends[1][2], ends
    with open(out / "killed") as handle:
        killed = float(handle.read())
    print(f"\na killed worker cost {_steps(str(out), 1, 1)[0][1] - killed:.2f} s to its next step on the GPU")
    pids = {r["pid"] for r in seen.values()}
    on_gpu = {int(p) for p in _smi("--query-compute-apps=pid") if p.isdigit()}
    assert not any(psutil.pid_exists(p) for p in pids) and not pids & on_gpu


def test_a_rank_whose_gpu_work_is_slow_is_named_a_straggler_by_its_cuda_events(etcd_endpoints, tmp_path):
    """Rank 2's forward queues 60 ms of GPU work its CPU never waits for: its wall clock sees the
    same 20 ms as the others', only the CUDA events of watch_ddp see the difference."""
    out, rdzv_id = str(tmp_path), run_id()
    agent = start([*agent_args(etcd_endpoints, rdzv_id, "1", nproc=3), *EXIT_STUCK, PACED, out])
    try:
        wait_for(lambda: len([w for w in workers(out) if len(w["steps"]) > 5]) == 3, 90, 0.5, "3 ranks stepping")
        time.sleep(8.0)  # the paces settle, healthy: a false verdict would come now
        assert not [e for e in history(etcd_endpoints, rdzv_id) if e["kind"] == "straggler"]
        open(os.path.join(out, "slow-2"), "w").close()
        slowed_at = time.monotonic()
        found = wait_for(
            lambda: [e for e in history(etcd_endpoints, rdzv_id) if e["kind"] == "straggler"], 40, 1.0, "a straggler"
        )
        took = time.monotonic() - slowed_at
    finally:
        open(os.path.join(out, "stop"), "w").close()
        code, text = finish(agent, 60)
    assert code == 0, text[-4000:]
    print(f"\nnamed {took:.1f} s after its GPU work slowed: {found[0]}")
    assert [e["rank"] for e in found] == [2] and 0.0 < found[0]["score"] < 0.6, found  # 20 ms of 80: 0.25


def test_the_health_gates_gpu_check_passes_a_healthy_gpu_with_the_real_nvml_and_after_a_failure_reads_its_counters():
    """The check a node runs before its first round (NVML's counters, then a matmul) and the one it
    runs while the job waits after its own workers failed (the counters alone): both pass on a
    healthy GPU with the real NVML (nvidia-ml-py: the [gpu] extra)."""
    checks = NodeChecks().for_node(())
    assert checks.gpus  # a node with /dev/nvidia0 checks its GPUs
    took = {}
    for after_failure in (False, True):
        started = time.monotonic()
        assert checks.run(os.environ, after_failure=after_failure) is None
        took[after_failure] = time.monotonic() - started
    said = {args: _said(args) for args in ((), ("--counters",))}
    print(f"\nthe GPU check took {took[False]:.2f} s, after a failure {took[True]:.2f} s: {said}")
    devices = len(_smi("--query-gpu=index"))
    assert said[()] == f"NVML: clean; a matmul ran on {devices} devices", said
    assert said[("--counters",)] == f"NVML: {devices} devices clean", said


def _said(args: tuple[str, ...]) -> str:
    done = subprocess.run([sys.executable, _GPU_PROBE, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
