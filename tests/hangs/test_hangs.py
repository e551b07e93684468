"""Hung ranks, with real agents, real workers and a real etcd: the rank that stopped first is named
on every node, its stack is shown, the job restarts (or, with no restart left, fails) -- and long
phases, fast steps and workers that never call the API get what they should.

Each test prints the figures it measured (detection latency from the culprit's last heartbeat to
the restart line on each node)."""

from __future__ import annotations

import json
import re

from rendezvous.etcd.client import EtcdClient
from rendezvous.job.history import read_history
from rendezvous.job.keys import DEFAULT_KEY_PREFIX, JobKeys
from tests.e2e.cli_helpers import run, run_id, wait_for

from .helpers import Agent, done, last_beat, steps_args

HUNG = r"rank (\d+) on node \S+ hung: .*restarting the workers \(1/3\)"


def _two_agents(endpoints: str, rdzv_id: str, *options_and_worker: str) -> list[Agent]:
    args = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-endpoint",
        endpoints,
        "--rdzv-id",
        rdzv_id,
        "--local-addr",
        "127.0.0.1",
        "--rdzv-conf",
        "last_call_timeout=1",
        *options_and_worker,
    ]
    return [Agent(args), Agent(args)]


def _two_agent_job(endpoints: str, expect: list[int], *options_and_worker: str) -> list[Agent]:
    """A two-agent job run to its end, each agent exiting as ``expect`` says."""
    agents = _two_agents(endpoints, run_id(), *options_and_worker)
    codes = _finish(agents, 120)
    assert codes == expect, [a.output for a in agents]
    return agents


def _finish(agents: list[Agent], timeout: float) -> list[int]:
    try:
        return [agent.wait(timeout) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()


def test_a_rank_that_stops_is_named_on_both_nodes_with_its_stack_and_the_job_restarts_once(etcd_endpoints, tmp_path):
    out, rdzv_id, timeout = str(tmp_path), run_id(), 4.0
    agents = _two_agents(
        etcd_endpoints,
        rdzv_id,
        "--max-restarts",
        "3",
        "--heartbeat-timeout",
        str(timeout),
        *steps_args(out, "--gloo", "--hang", "1:5", "--steps", "10"),
    )
    codes = _finish(agents, 120)
    assert codes == [0, 0], [a.output for a in agents]
    culprit_node = next(a for a in agents if 1 in a.ranks())
    stopped = last_beat(out, 1)
    for agent in agents:
        at, line = agent.first(HUNG)
        assert re.search(HUNG, line).group(1) == "1", line  # rank 1, never its blocked peer
        assert agent.count(r"hung: ") == 1, agent.output
        assert at - stopped <= timeout + 2.0, (
            f"the restart line came {at - stopped:.1f} s after rank 1's last heartbeat"
        )
        print(
            f"\n{'culprit' if agent is culprit_node else 'peer'} node: {line}\n"
            f"  {at - stopped:.2f} s from rank 1's last heartbeat (timeout {timeout:g} s)"
        )
    assert culprit_node.count(r"stacks of hung rank 1") == 1, culprit_node.output
    assert culprit_node.count(r"line \d+ in stuck_in_step") >= 1, culprit_node.output
    assert done(out) == {(0, 1), (1, 1)}, ("the job should restart once and then finish", [a.output for a in agents])
    client = EtcdClient(etcd_endpoints, timeout=5)
    try:
        events, _ = read_history(client, JobKeys(DEFAULT_KEY_PREFIX, rdzv_id).root)
    finally:
        client.close()
    hung = [e for e in events if e.kind == "worker_hung"]
    assert len(hung) == 1 and hung[0].details["rank"] == 1 and "stuck_in_step" in hung[0].details["stack"], hung


def test_a_deadlock_in_a_gloo_collective_is_found_and_both_stacks_are_shown(etcd_endpoints, tmp_path):
    """Rank 1 skips an all_reduce and waits for a message rank 0 never sends: both sit in gloo. Steps of
    no work: both ranks beat as the last all_reduce returns, so their heartbeats are a tie."""
    out = str(tmp_path)
    agents = _two_agent_job(
        etcd_endpoints,
        [0, 0],
        "--max-restarts",
        "3",
        "--heartbeat-timeout",
        "4",
        *steps_args(out, "--skip", "1:4", "--steps", "8", "--step", "0"),
    )
    for agent in agents:
        _, line = agent.first(HUNG)
        # both stopped right after the same heartbeat: the line says so rather than guess
        assert re.search(r"ranks? [01] stopped within \d+ ms of it: a deadlock", line), line
        print(f"\n{line}")
    holder = next(a for a in agents if 1 in a.ranks())
    other = next(a for a in agents if a is not holder)
    assert holder.count(r"in waiting_for_a_message_never_sent") >= 1, holder.output
    assert other.count(r"in all_reduce") >= 1, other.output
    assert done(out) == {(0, 1), (1, 1)}, [a.output for a in agents]


def test_a_long_phase_within_its_own_timeout_raises_no_alarm(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    agent = Agent(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "--heartbeat-timeout",
            "2",
            *steps_args(out, "--phase", "all:3:6:30", "--steps", "8"),
        ]
    )
    assert _finish([agent], 90) == [0], agent.output
    assert agent.count("hung") == 0 and agent.count("restarting") == 0, agent.output
    assert done(out) == {(0, 0), (1, 0)}, agent.output
    print("\n6 s in phase 'checkpoint' (timeout 30 s) under --heartbeat-timeout 2: no alarm, no restart")


def test_fast_steps_teach_a_timeout_of_seconds_not_the_default(etcd_endpoints, tmp_path):
    """Steps of 0.2 s and no --heartbeat-timeout: the learned timeout is the floor (5 s), not 900 s."""
    out = str(tmp_path)
    agent = Agent(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            *steps_args(out, "--gloo", "--hang", "1:15", "--steps", "25"),
        ]
    )
    assert _finish([agent], 90) == [0], agent.output
    at, line = agent.first(HUNG)
    latency = at - last_beat(out, 1)
    assert re.search(HUNG, line).group(1) == "1", line
    assert "timeout 5.0 s" in line, line
    assert 5.0 <= latency <= 8.0, f"{latency:.1f} s from the last heartbeat to the restart line"
    assert done(out) == {(0, 1), (1, 1)}, agent.output
    print(f"\n{line}\n  {latency:.2f} s after rank 1's last heartbeat (learned from 0.2 s steps)")


def test_hangs_that_spend_the_budget_fail_the_job_on_every_node_naming_the_culprit(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    agents = _two_agent_job(
        etcd_endpoints,
        [1, 1],
        "--max-restarts",
        "1",
        "--heartbeat-timeout",
        "3",
        *steps_args(out, "--gloo", "--hang", "1:3", "--every-attempt", "--steps", "8"),
    )
    for agent in agents:
        named = {m.group(1) for _, line in agent.lines for m in [re.search(r"rank (\d+) on node \S+ hung", line)] if m}
        assert named == {"1"}, agent.output
        assert agent.count(r"failed after 1 of 1 restarts|the job failed: rank 1 on node \S+ hung") >= 1, agent.output
    assert not done(out), [a.output for a in agents]
    print("\n" + "\n".join(a.first(r"failed after|the job failed")[1] for a in agents))


def test_a_worker_that_never_calls_the_api_is_left_alone(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    agent = Agent(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--heartbeat-timeout",
            "1",
            *steps_args(out, "--no-api", "--step", "0.5", "--steps", "8"),
        ]
    )
    assert _finish([agent], 90) == [0], agent.output
    assert agent.count("hung") == 0, agent.output
    assert done(out) == {(0, 0), (1, 0)}, agent.output


def test_work_after_the_last_step_is_no_hang_once_another_node_finished(etcd_endpoints, tmp_path):
    """Rank 0's node finishes; rank 1 saves for 6 s after its last heartbeat, past --heartbeat-timeout 2."""
    out = str(tmp_path)
    agents = _two_agent_job(
        etcd_endpoints,
        [0, 0],
        "--max-restarts",
        "3",
        "--heartbeat-timeout",
        "2",
        *steps_args(out, "--tail", "1:6", "--steps", "10"),
    )
    assert all(a.count("hung") == 0 for a in agents), [a.output for a in agents]
    assert done(out) == {(0, 0), (1, 0)}, [a.output for a in agents]


def test_elastic_ctl_status_shows_each_nodes_oldest_heartbeat_while_the_job_runs(etcd_endpoints, tmp_path):
    out, rdzv_id = str(tmp_path), run_id()
    agents = _two_agents(etcd_endpoints, rdzv_id, *steps_args(out, "--steps", "40"))
    try:

        def status() -> dict:
            shown = run(
                ["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id, "--json"], tool_name="elastic-ctl"
            )
            return json.loads(shown.stdout) if shown.returncode == 0 else {}

        wait_for(
            lambda: len([n for n in status().get("nodes", []) if n["heartbeat_age"] is not None]) == 2,
            20,
            interval=0.5,
            what="both nodes' heartbeat ages in elastic-ctl status",
        )
        nodes = status()["nodes"]
        assert all(0 <= n["heartbeat_age"] < 7 and n["heartbeat_rank"] in (0, 1) for n in nodes), nodes
        table = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id], tool_name="elastic-ctl").stdout
        assert table.splitlines()[1].split()[-2:] == ["OLDEST", "HEARTBEAT"] and table.count(" s ago (rank ") == 2, (
            table
        )
        print("\n" + table)
    finally:
        assert _finish(agents, 60) == [0, 0], [a.output for a in agents]
