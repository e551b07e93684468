"""The crash-loop breaker end to end (real agents, real etcd): a job that fails at the same step
every time is closed as a crash loop on every node, exit code 5, well before its --max-restarts;
a job that gets further between failures is never stopped by it."""

from __future__ import annotations

import json
import os

from .cli_helpers import HERE, agent_args, finish, json_records, run, run_id, start, wait_joined

CRASHING = os.path.join(HERE, "workers", "crashing.py")


def _pair(endpoints: str, out: str, *worker: str, max_restarts: int = 50) -> tuple[str, list]:
    rdzv_id = run_id()
    args = [*agent_args(endpoints, rdzv_id, "2", nproc=1, conf="last_call_timeout=1")]
    args += ["--max-restarts", str(max_restarts), CRASHING, out, *worker]
    first = start(args)
    wait_joined(endpoints, rdzv_id, 1)  # it coordinates: group rank 0, so rank 1 (the failing one) is the other node's
    return rdzv_id, [first, start(args)]


def _attempts(out: str) -> list[int]:
    return sorted({r["restart"] for r in json_records(out, "*.json", "at")})


def test_a_job_that_fails_at_the_same_step_every_time_is_closed_as_a_crash_loop_on_every_node(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    rdzv_id, agents = _pair(etcd_endpoints, out, "--fail-at", "5")
    results = [finish(agent, 120) for agent in agents]
    codes, outputs = [code for code, _ in results], [text for _, text in results]
    assert codes == [5, 5], outputs
    assert _attempts(out) == [0, 1, 2, 3], outputs  # the first failure got somewhere; the next three did not
    failing, other = outputs[1], outputs[0]
    summary = failing[failing.index("crash loop: 3 restarts in a row made no progress") :]
    assert "no worker beat more than 7 heartbeats in a round" in summary, summary
    for n in (1, 2, 3):
        assert f"  restart {n}: rank 1 on node " in summary and "failed (exit code 1)" in summary, summary
    assert "[exit 5: do not retry]" in failing.splitlines()[-1], failing[-2000:]
    assert "a crash loop, 3 restarts in a row made no progress (3/3)" in other, other[-2000:]
    assert "[exit 5: do not retry]" in other.splitlines()[-1], other[-2000:]
    shown = run(["history", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id, "--json"], tool_name="elastic-ctl")
    closed = [e for e in json.loads(shown.stdout) if e["kind"] == "job_closed"]
    assert closed and closed[0]["by"] == "crash-loop" and closed[0]["failed"] is True, shown.stdout


def test_a_job_that_gets_further_between_failures_is_never_stopped_by_the_breaker(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    _, agents = _pair(etcd_endpoints, out, "--fail-at", "4", "--resume", "--steps", "25", max_restarts=10)
    results = [finish(agent, 180) for agent in agents]
    assert [code for code, _ in results] == [0, 0], [text[-3000:] for _, text in results]
    starts = {r["restart"]: r["from"] for r in json_records(out, "*.json", "at") if r["rank"] == 1}
    assert len(starts) >= 5 and list(starts.values()) == sorted(starts.values()), starts  # 4+ restarts, each further
