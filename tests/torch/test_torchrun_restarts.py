"""A torchrun job on the ``etcd-v3`` handler resumes every time a worker is SIGKILLed (run under one
torch; tests/parity/test_plugin_store.py shows the cause without a race, under both).

Two real torchrun agents, a real etcd and the DDP script of the benchmarks (``examples/ddp_steps.py``:
gloo, a save every step, each step padded to a second as a data loader's wait would). When rank 1's
worker dies, its agent restarts for a new round (a restart counted) while the other node's worker,
between two steps, is healthy: that agent restarts for the new round too, uncounted. The two agents'
restart counts then differ, and torch's shared agent store prefixes each worker's keys by its own
count, so the new workers never met (gloo's ``connectFullMesh`` refused, then quiet). The handler
gives each round's workers a store of their own (``rendezvous.torchrun.plugin._StorePerRound``);
every kill here must be followed by steps of new processes on both ranks, and the job must finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "examples" / "ddp_steps.py")
KILLS = 3
RESUMES_WITHIN = 120  # seconds from a kill to steps of new processes on both ranks (6-7 s here alone)


def _agent(etcd: str, run_id: str, work: Path, name: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    args += ["--max-restarts", str(KILLS), "--monitor-interval", "0.1", "--rdzv-backend", "etcd-v3"]
    args += ["--rdzv-endpoint", etcd, "--rdzv-id", run_id, "--rdzv-conf", "last_call_timeout=1"]
    args += [SCRIPT, "--steps", "14", "--save-every", "1", "--step-time", "1"]
    args += ["--checkpoint", str(work / "save.pt"), "--timeline", str(work)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCH_DISABLE_SHARE"))}
    log = open(work / f"{name}.log", "w")  # noqa: SIM115 -- the agent writes it until it ends
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _events(work: Path) -> list[dict]:
    found = []
    for path in work.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                pass  # a line cut short by the kill
    return sorted(found, key=lambda e: e["t"])


def _stepping_since(work: Path, since: float) -> dict[int, dict] | None:
    """Each rank's newest step by a process started after ``since`` (None until both ranks have one)."""
    fresh = {e["pid"] for e in _events(work) if e["event"] == "started" and e["t"] > since}
    steps = {e["rank"]: e for e in _events(work) if e["event"] == "step" and e["pid"] in fresh}
    return steps if set(steps) == {0, 1} else None


def _wait_for(predicate, within: float, what: str, story):
    deadline = time.monotonic() + within
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}\n{story()}"
        time.sleep(0.1)
    return value


def test_a_worker_sigkilled_three_times_resumes_each_time_and_the_job_finishes(tmp_path, etcd_endpoints):
    run_id = f"restarts-{uuid.uuid4().hex[:8]}"
    agents = [_agent(etcd_endpoints, run_id, tmp_path, f"node{i}") for i in (0, 1)]

    def story() -> str:
        said = [f"--- node{i}:\n{(tmp_path / f'node{i}.log').read_text()[-3000:]}" for i in (0, 1)]
        return "\n".join([*said, f"restart counts: {sorted({(e['rank'], e['restart']) for e in _events(tmp_path)})}"])

    resumed, since = [], 0.0
    try:
        for kill in range(KILLS):
            steps = _wait_for(
                lambda s=since: _stepping_since(tmp_path, s), RESUMES_WITHIN, f"steps after kill {kill}", story
            )
            if kill:
                resumed.append(max(e["t"] for e in steps.values()) - since)
            victim = steps[1]["pid"]
            since = time.time()
            os.kill(victim, signal.SIGKILL)
        steps = _wait_for(lambda: _stepping_since(tmp_path, since), RESUMES_WITHIN, f"steps after kill {KILLS}", story)
        resumed.append(max(e["t"] for e in steps.values()) - since)
        codes = [agent.wait(timeout=60) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(10)
    counts = sorted({(e["rank"], e["restart"]) for e in _events(tmp_path)})
    print(
        f"\nrank 1's worker SIGKILLed {KILLS} times: both ranks stepped again {[round(r, 2) for r in resumed]} s later"
    )
    print(f"(rank, TORCHELASTIC_RESTART_COUNT) seen: {counts}")
    assert codes == [0, 0], story()
    assert max(e["step"] for e in _events(tmp_path) if e["event"] == "step") == 14
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
