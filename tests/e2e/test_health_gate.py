"""The health gate end to end (real agents, real etcd): a node whose --health-check fails takes
no rank and a hot spare runs in its place; a node whose check starts failing after its own workers
failed steps out of the job's rounds without using a restart."""

from __future__ import annotations

import json
import os
import time

from .cli_helpers import HERE, agent_args, finish, json_records, run, run_id, start, wait_for, wait_joined

COUNTED = os.path.join(HERE, "workers", "counted.py")


def _agent(endpoints: str, rdzv_id: str, out: str, *, check: str = "", fail: str = "", run_for: float = 3.0):
    args = agent_args(endpoints, rdzv_id, "2", nproc=1, conf="last_call_timeout=1") + ["--max-restarts", "3"]
    args += ["--health-check", check] if check else []
    return start([*args, COUNTED, out, "--fail", fail, "--run", str(run_for)])


def _history(endpoints: str, rdzv_id: str) -> list[dict]:
    shown = run(["history", "--rdzv-endpoint", endpoints, "--rdzv-id", rdzv_id, "--json"], tool_name="elastic-ctl")
    return json.loads(shown.stdout)


def test_a_node_whose_health_check_fails_takes_no_rank_and_a_spare_takes_its_place(etcd_endpoints, tmp_path):
    out, rdzv_id = str(tmp_path), run_id()
    sick = _agent(etcd_endpoints, rdzv_id, out, check='echo "checking /scratch"; echo "/scratch is full"; exit 1')
    time.sleep(1.0)  # it would coordinate and take group rank 0, were it healthy
    healthy = [_agent(etcd_endpoints, rdzv_id, out, run_for=8.0) for _ in range(2)]  # past its second check

    def status() -> str:
        shown = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id], tool_name="elastic-ctl")
        return shown.stdout if "unhealthy, out of the rounds: " in shown.stdout else ""

    shown = wait_for(status, 20, interval=0.5, what="elastic-ctl status to name the unhealthy node")
    assert "(--health-check failed: /scratch is full)" in shown, shown
    results = [finish(agent, 60) for agent in [*healthy, sick]]
    outputs = [text for _, text in results]
    assert [code for code, _ in results] == [0, 0, 0], outputs
    workers = json_records(out, "*.json", "at")
    assert len(workers) == 2 and {w["world_size"] for w in workers} == {2}, workers  # the two healthy nodes
    line = "this node is unhealthy: --health-check failed: /scratch is full; it takes no rank (no restart used)"
    assert line in outputs[2] and "round 1: group rank" not in outputs[2], outputs[2]
    recorded = [e for e in _history(etcd_endpoints, rdzv_id) if e["kind"] == "node_unhealthy"]
    assert [e["reason"] for e in recorded] == ["--health-check failed: /scratch is full"], recorded


def test_a_node_that_turns_unhealthy_after_its_workers_failed_steps_out_without_using_a_restart(
    etcd_endpoints, tmp_path
):
    """b's check fails once its rank-1 worker has started (its record is there); that worker exits 1:
    b steps out, and the round c (a hot spare) fills runs at restart count 0."""
    out, rdzv_id = str(tmp_path), run_id()
    a = _agent(etcd_endpoints, rdzv_id, out, fail="1@0")
    wait_joined(etcd_endpoints, rdzv_id, 1)  # a coordinates: group rank 0; b's worker is rank 1
    b = _agent(etcd_endpoints, rdzv_id, out, fail="1@0", check=f"! ls {out}/0-1-*.json >/dev/null 2>&1")
    wait_joined(etcd_endpoints, rdzv_id, 2)  # c comes last: the hot spare
    c = _agent(etcd_endpoints, rdzv_id, out, run_for=1.0)
    results = [finish(agent, 90) for agent in (a, b, c)]
    outputs = [text for _, text in results]
    assert [code for code, _ in results] == [0, 0, 0], outputs
    assert "failed (exit code 1); this node is unhealthy: --health-check failed: exit code 1" in outputs[1], outputs[1]
    assert "restarting the workers" not in outputs[1] and outputs[1].count("round 1: group rank 1") == 1, outputs[1]
    started = json_records(out, "*.json", "at")
    # the round without b used no restart: every worker ran at restart 0 -- b's rank 1, then c's (a's
    # first worker may be stopped before it writes its record: under load, b's fails first)
    assert all(r["restart"] == 0 for r in started) and len([r for r in started if r["rank"] == 1]) == 2, started
    kinds = [e["kind"] for e in _history(etcd_endpoints, rdzv_id)]
    assert "node_unhealthy" in kinds and kinds.index("node_unhealthy") > kinds.index("worker_failed"), kinds


def test_a_node_still_unhealthy_at_its_join_timeout_exits_200_worth_a_retry_elsewhere(tmp_path):
    args = ["--standalone", "--rdzv-conf", "join_timeout=3", "--health-check", 'echo "GPU 3 missing"; exit 1']
    done = run([*args, COUNTED, str(tmp_path)], timeout=30)
    assert done.returncode == 200, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "elastic-run: this node stayed unhealthy for 3 s (join timeout 3 s): --health-check failed: GPU 3 missing "
        "[exit 200: worth a retry]"
    ), done.stderr
    assert not json_records(str(tmp_path), "*.json", "at")  # no worker ran


STEPS = os.path.join(os.path.dirname(HERE), "hangs", "workers", "steps.py")


def test_a_node_whose_worker_hung_and_whose_check_then_fails_steps_out_without_using_a_restart(
    etcd_endpoints, tmp_path
):
    """b's rank 1 stops in step 3 of the first attempt (no heartbeat); b's check fails once that
    rank's heartbeat record exists: after the hang verdict b steps out, and the round the hot spare
    c fills runs at restart count 0 (where c's rank 1 hangs again, a restart this time)."""
    out, rdzv_id = str(tmp_path), run_id()
    worker = [STEPS, "--out", out, "--steps", "8", "--step", "0.1", "--hang", "1:3", "--gloo"]

    def agent(*extra: str):
        args = agent_args(etcd_endpoints, rdzv_id, "2", nproc=1, conf="last_call_timeout=1")
        return start([*args, "--max-restarts", "3", "--heartbeat-timeout", "2", *extra, *worker])

    a = agent()
    wait_joined(etcd_endpoints, rdzv_id, 1)  # a coordinates: group rank 0; b's worker is rank 1
    b = agent("--health-check", f"! test -e {out}/1.0.beat")
    wait_joined(etcd_endpoints, rdzv_id, 2)  # c comes last: the hot spare
    c = agent()
    results = [finish(p, 120) for p in (a, b, c)]
    outputs = [text for _, text in results]
    assert [code for code, _ in results] == [0, 0, 0], outputs
    assert " hung; this node is unhealthy: --health-check failed: exit code 1" in outputs[1], outputs[1]
    assert "resuming the workers" not in outputs[1] and "restarting the workers" not in outputs[1], outputs[1]
    spare_rounds = [line for line in outputs[2].splitlines() if "group rank 1 of 2 nodes" in line]
    assert spare_rounds, outputs[2]  # c took b's place
    restarts = [line for text in outputs for line in text.splitlines() if "restarting the workers (" in line]
    assert all("(1/3)" in line for line in restarts) and restarts, restarts  # only c's own hang used one
