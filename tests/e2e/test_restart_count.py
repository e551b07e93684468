"""One job, one restart count: every worker of a round sees the same TORCHELASTIC_RESTART_COUNT,
whichever node's worker failed, and --max-restarts is the job's budget, not each node's."""

from __future__ import annotations

import json
import os
import re
import time

from .cli_helpers import HERE, finish, json_records, run, run_id, start, wait_for

COUNTED = os.path.join(HERE, "workers", "counted.py")


def _agent(
    endpoints, rdzv_id, out, *, nnodes="2", max_restarts=2, fail="", run_for=0.5, conf="last_call_timeout=1", nproc=1
):
    return start(
        [
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            str(max_restarts),
            "--rdzv-endpoint",
            endpoints,
            "--rdzv-id",
            rdzv_id,
            "--local-addr",
            "127.0.0.1",
            "--rdzv-conf",
            conf,
            COUNTED,
            out,
            "--fail",
            fail,
            "--run",
            str(run_for),
        ]
    )


def _seen(out: str) -> list[dict]:
    return json_records(out, "*.json", "at")


def _by_restart(out: str) -> dict[int, dict[int, int]]:
    """restart count -> {rank: how many workers of that rank saw it}"""
    table: dict[int, dict[int, int]] = {}
    for record in _seen(out):
        row = table.setdefault(record["restart"], {})
        row[record["rank"]] = row.get(record["rank"], 0) + 1
    return table


def _ordered_pair(etcd_endpoints, rdzv_id, out, **options):
    """Two agents; the first is started first, so it coordinates and gets group rank 0."""
    first = _agent(etcd_endpoints, rdzv_id, out, **options)
    time.sleep(0.5)
    return first, _agent(etcd_endpoints, rdzv_id, out, **options)


def _restart_said(output: str, count: str) -> bool:
    """Whether a node said the job restarts with ``count`` (e.g. "1/2"): as the node whose workers
    were stopped says it, or as one whose workers had already finished when the failure reached it
    (0.5 s of work: under CI's load either node may be first)."""
    return f"restarting the workers ({count})" in output or f"the job restarts ({count}); rejoining" in output


def test_after_rank_0_fails_every_rank_of_the_next_round_sees_restart_count_1(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    agents = _ordered_pair(etcd_endpoints, run_id(), out, fail="0@0")
    results = [finish(agent, timeout=60) for agent in agents]
    assert [code for code, _ in results] == [0, 0], results
    table = _by_restart(out)
    print(f"\nTORCHELASTIC_RESTART_COUNT each rank saw, by round: {table}")
    assert table == {0: {0: 1, 1: 1}, 1: {0: 1, 1: 1}}
    for _, output in results:  # every node says what happened, not only the failing one
        assert "rank 0 on node " in output and "failed (exit code 1)" in output, output
        assert _restart_said(output, "1/2"), output
        assert "waiting to join" not in output
    assert all(r["max_restarts"] == 2 for r in _seen(out))


def test_failures_on_two_nodes_consume_one_shared_budget(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    agents = _ordered_pair(etcd_endpoints, run_id(), out, fail="0@0,1@1")
    results = [finish(agent, timeout=60) for agent in agents]
    assert [code for code, _ in results] == [0, 0], results
    table = _by_restart(out)
    assert table == {0: {0: 1, 1: 1}, 1: {0: 1, 1: 1}, 2: {0: 1, 1: 1}}, table
    for _, output in results:
        assert _restart_said(output, "1/2") and _restart_said(output, "2/2"), output


def test_an_exhausted_budget_ends_the_job_on_every_node_with_the_same_exit_code(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    agents = _ordered_pair(etcd_endpoints, run_id(), out, max_restarts=1, fail="0@0,1@1", run_for=30)
    results = [finish(agent, timeout=60) for agent in agents]
    assert [code for code, _ in results] == [1, 1], results
    # rank 1 failed last; which agent has it: the first usually (started 0.5 s sooner), not always under load
    by_rank = {int(re.search(r"round 2: group rank (\d) of 2", output).group(1)): output for _, output in results}
    failing, other = by_rank[1], by_rank[0]
    assert "failed after 1 of 1 restarts" in failing, failing
    assert "the job failed: rank 1 on node " in other and "no restart was left (1/1)" in other, other
    assert max(_by_restart(out)) == 1


def test_a_node_joining_after_a_restart_gets_the_current_count_and_a_scale_event_leaves_it(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    rdzv_id = run_id()
    first = _agent(etcd_endpoints, rdzv_id, out, nnodes="1:2", fail="0@0", run_for=6)
    wait_for(lambda: 1 in _by_restart(out), 30, what="the restarted worker")
    late = _agent(etcd_endpoints, rdzv_id, out, nnodes="1:2", max_restarts=5, run_for=6)
    results = [finish(agent, timeout=60) for agent in (first, late)]
    assert [code for code, _ in results] == [0, 0], results
    seen = _seen(out)
    after = [r for r in seen if r["world_size"] == 2]
    assert after and {r["restart"] for r in after} == {1}, seen
    assert {r["max_restarts"] for r in after} == {2}, "the job's budget, not the late agent's"
    assert "--max-restarts 5 differs from the job's 2 (the first agent's); following the job's" in results[1][1]
    assert "joined: re-rendezvous" in results[0][1], results[0][1]


def test_a_node_started_with_other_options_than_the_jobs_says_which_in_one_line_each(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    rdzv_id = run_id()
    first = _agent(etcd_endpoints, rdzv_id, out, nnodes="1:2", run_for=6)
    wait_for(lambda: _seen(out), 30, what="the first node's worker")
    late = _agent(etcd_endpoints, rdzv_id, out, nnodes="1:3", max_restarts=5, nproc=2, run_for=6)
    results = [finish(agent, timeout=60) for agent in (first, late)]
    assert [code for code, _ in results] == [0, 0], results
    said = results[1][1]
    for line in (
        "--nnodes 1:3 differs from the job's 1:2 (its coordinator's); the rounds follow the job's",
        "--max-restarts 5 differs from the job's 2 (the first agent's); following the job's",
        "--nproc-per-node 2 differs from other nodes': the job runs 3 workers on 2 nodes",
    ):
        assert said.count(line) == 1, said
    assert "differs" not in results[0][1].replace("--nproc-per-node 1 differs", ""), results[0][1]


def test_status_shows_the_restart_count_and_the_budget(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    rdzv_id = run_id()
    agent = _agent(etcd_endpoints, rdzv_id, out, nnodes="1", fail="0@0", run_for=5)
    wait_for(lambda: 1 in _by_restart(out), 30, what="the restarted worker")
    table = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id], tool_name="elastic-ctl")
    as_json = run(
        ["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id, "--json"], tool_name="elastic-ctl"
    )
    finish(agent, timeout=30)
    assert "restarts 1/2" in table.stdout.splitlines()[0], table.stdout
    data = json.loads(as_json.stdout)
    assert (data["restarts"], data["max_restarts"]) == (1, 2)
