"""Operating a job from anywhere: its history in etcd, and elastic-ctl close / restart / reset."""

from __future__ import annotations

import json
import signal
import time

import psutil

import elastic
from tests.readme_quotes import history_shape, quoted_output

from .cli_helpers import finish, run, run_id, start, wait_for
from .test_restart_count import COUNTED, _by_restart, _seen


def _agent(endpoints, rdzv_id, out, nnodes="2", fail="", run_for=60, extra=(), conf="last_call_timeout=1"):
    return start(
        [
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "2",
            "--stop-grace",
            "2",
            "--rdzv-endpoint",
            endpoints,
            "--rdzv-id",
            rdzv_id,
            "--local-addr",
            "127.0.0.1",
            "--rdzv-conf",
            conf,
            *extra,
            COUNTED,
            out,
            "--fail",
            fail,
            "--run",
            str(run_for),
        ]
    )


REAPER = "the agent died; its reaper killed the workers and revoked the lease"


def _departures_as_one(rows):
    """A killed agent's departure is recorded once, by whichever saw it first: its reaper
    (node left, its reason) or its peers' verdict (node lost, the node, their reason, who said it).
    The docs quote the reaper's; the peers' counts as the same row."""
    return [(r[0], "node left", REAPER) if r[1] == "node lost" else r for r in rows]


def _ctl(*args, endpoints, rdzv_id):
    return run([*args, "--rdzv-endpoint", endpoints, "--rdzv-id", rdzv_id], tool_name="elastic-ctl")


def test_history_shows_a_failure_a_node_loss_and_an_operator_close_in_order(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    rdzv_id = run_id()
    agents = [_agent(etcd_endpoints, rdzv_id, out, nnodes="2:3", fail="1@0")]
    time.sleep(0.5)
    agents += [_agent(etcd_endpoints, rdzv_id, out, nnodes="2:3", fail="1@0") for _ in range(2)]
    try:
        wait_for(lambda: len(_by_restart(out).get(1, {})) == 3, 30, what="the group restarted after rank 1 failed")
        agents[2].send_signal(signal.SIGKILL)
        wait_for(lambda: any(r["world_size"] == 2 for r in _seen(out)), 20, what="a round of 2 after the kill")
        asked = time.monotonic()
        closed = _ctl("close", "--reason", "maintenance window", endpoints=etcd_endpoints, rdzv_id=rdzv_id)
        results = [finish(agent, timeout=30) for agent in agents[:2]]
        stopped_in = time.monotonic() - asked
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    assert closed.returncode == 0 and closed.stdout.startswith(f"closed job {rdzv_id} at round "), closed
    assert [code for code, _ in results] == [4, 4], results
    assert all("the job was closed by an operator: maintenance window" in text for _, text in results)
    assert stopped_in <= 2 + 2, f"close took {stopped_in:.1f}s to stop the job (stop grace 2 s)"
    print(f"\nelastic-ctl close: both agents exited 4, {stopped_in:.2f} s after the command started (stop grace 2 s)")
    table = _ctl("history", endpoints=etcd_endpoints, rdzv_id=rdzv_id)
    print("\n" + table.stdout)
    quoted = quoted_output("elastic-ctl history")
    assert _departures_as_one(history_shape(table.stdout.splitlines())) == history_shape(quoted), (table.stdout, quoted)
    for internal in ("round_frozen", "worker_failed", "job_closed", "=", "joined_count", "up "):
        assert internal not in table.stdout, f"history shows {internal!r}, a record's own term:\n{table.stdout}"
    events = json.loads(_ctl("history", "--json", endpoints=etcd_endpoints, rdzv_id=rdzv_id).stdout)
    killed = [e for e in events if e["kind"] in ("node_left", "node_lost") and e["round"] == 2]
    assert len(killed) == 1, f"the killed agent's departure was recorded {len(killed)} times: {killed}"
    kinds = [e["kind"] for e in events]
    first = {kind: kinds.index(kind) for kind in reversed(kinds)}
    first.setdefault("node_left", first.get("node_lost"))
    assert (
        first["round_frozen"]
        < first["worker_failed"]
        < first["group_restarted"]
        < first["node_left"]
        < first["job_closed"]
    ), kinds
    failed = next(e for e in events if e["kind"] == "worker_failed")
    assert (failed["rank"], failed["exit_code"]) == (1, 1) and failed["host"]
    assert {"time", "round", "node", "kind"} <= set(failed) and "signal" not in failed
    died = [e for e in events if e["kind"] == "node_left" and "the agent died" in e.get("reason", "")]
    lost = [e for e in events if e["kind"] == "node_lost" and "connection was closed" in e.get("reason", "")]
    assert died or lost, "neither the killed agent's reaper nor its peers recorded its death"
    close = next(e for e in events if e["kind"] == "job_closed")
    assert (close["reason"], close["by"]) == ("maintenance window", "operator")
    status = _ctl("status", endpoints=etcd_endpoints, rdzv_id=rdzv_id)
    assert "closed" in status.stdout and "reason: maintenance window" in status.stdout


def test_restart_starts_a_new_round_without_using_a_restart(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    rdzv_id = run_id()
    agents = [_agent(etcd_endpoints, rdzv_id, out, run_for=4) for _ in range(2)]
    try:
        wait_for(lambda: len(_seen(out)) == 2, 30, what="2 workers")
        asked = _ctl("restart", "--reason", "take in the spare", endpoints=etcd_endpoints, rdzv_id=rdzv_id)
        wait_for(lambda: len(_seen(out)) == 4, 30, what="the workers of the new round")
        results = [finish(agent, timeout=30) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    assert asked.returncode == 0 and "round 2 is forming (take in the spare); the restart count stays 0" in asked.stdout
    assert [code for code, _ in results] == [0, 0], results
    assert {r["restart"] for r in _seen(out)} == {0}
    assert all("take in the spare: re-rendezvous" in text for _, text in results)


def test_reset_is_refused_while_nodes_live_and_frees_the_id_after(etcd_endpoints, tmp_path):
    out = str(tmp_path)
    rdzv_id = run_id()
    agent = _agent(etcd_endpoints, rdzv_id, out, nnodes="1", run_for=3)
    wait_for(lambda: len(_seen(out)) == 1, 30, what="the worker")
    refused = _ctl("reset", endpoints=etcd_endpoints, rdzv_id=rdzv_id)
    assert refused.returncode == 1 and "has 1 live node: stop it first, or reset with --force" in refused.stderr
    assert finish(agent, timeout=30)[0] == 0
    again = run(["--nnodes", "1", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id, COUNTED, out])
    assert again.returncode == 0, again.stderr  # the same command runs again, as with c10d (a new run)
    done = _ctl("reset", "--rdzv-conf", "bogus=1", endpoints=etcd_endpoints, rdzv_id=rdzv_id)
    assert done.returncode == 0 and done.stdout.startswith(f"reset job {rdzv_id}: deleted its "), done
    assert done.stdout.rstrip().endswith(f"under /elastic/{rdzv_id}/")
    assert done.stderr.count("ignoring unknown --rdzv-conf key 'bogus'") == 1, done.stderr
    assert run(["--nnodes", "1", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id, COUNTED, out]).returncode == 0


def test_write_commands_on_a_job_that_does_not_exist_say_so_and_exit_1(etcd_endpoints):
    for args in (["close", "--reason", "x"], ["restart"], ["reset"], ["history"]):
        result = _ctl(*args, endpoints=etcd_endpoints, rdzv_id="no-such-job")
        assert result.returncode == 1, (args, result)
        assert result.stderr.strip() == f"elastic-ctl: no job 'no-such-job' at {etcd_endpoints} (under /elastic)"


def test_log_format_json_makes_every_agent_line_a_json_object_and_leaves_worker_lines(etcd_endpoints, tmp_path):
    result = run(
        [
            "--log-format",
            "json",
            "--nnodes",
            "1",
            "--max-restarts",
            "1",
            "--rdzv-endpoint",
            etcd_endpoints,
            "--rdzv-id",
            run_id(),
            "--local-addr",
            "127.0.0.1",
            COUNTED,
            str(tmp_path),
            "--fail",
            "0@0",
        ]
    )
    assert result.returncode == 0, result.stderr
    agent_lines = [line for line in result.stderr.splitlines() if line.startswith("{")]
    assert "elastic-run:" not in result.stderr
    records = [json.loads(line) for line in agent_lines]
    assert records and all(set(r) == {"time", "level", "source", "message"} for r in records)
    assert any("restarting the workers (1/1)" in r["message"] for r in records)
    assert "planned failure of rank 0 at restart 0" in result.stderr  # the worker's own line, as it wrote it


def test_history_follow_prints_new_records_until_the_job_closes(etcd_endpoints, tmp_path):
    import subprocess

    from .cli_helpers import tool

    out = str(tmp_path)
    rdzv_id = run_id()
    agent = _agent(etcd_endpoints, rdzv_id, out, nnodes="1")
    try:
        wait_for(lambda: len(_seen(out)) == 1, 30, what="the worker")
        follow = subprocess.Popen(
            [
                tool("elastic-ctl"),
                "history",
                "--follow",
                "--json",
                "--timeout",
                "30",
                "--rdzv-endpoint",
                etcd_endpoints,
                "--rdzv-id",
                rdzv_id,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)
        _ctl("close", "--reason", "done for today", endpoints=etcd_endpoints, rdzv_id=rdzv_id)
        printed, errors = follow.communicate(timeout=20)
        assert finish(agent, timeout=30)[0] == 4
    finally:
        if agent.poll() is None:
            agent.kill()
    assert follow.returncode == 0, errors
    kinds = [json.loads(line)["kind"] for line in printed.splitlines()]
    assert kinds[0] == "round_frozen" and kinds[-1] == "job_closed", kinds


def test_list_and_status_name_each_jobs_outcome(etcd_endpoints, tmp_path):
    """succeeded, failed, closed by an operator, and stopped: every agent stopped by SIGTERM, which
    leaves the job open for others, is no longer 'running' once no agent of it is alive -- status,
    list, watch, get_state and --json say since when; an agent lost without a word (SIGKILL) makes
    that a lower bound."""
    ids = {name: run_id() for name in ("succeeded", "failed", "operator", "stopped", "lost")}
    done = _agent(etcd_endpoints, ids["succeeded"], str(tmp_path), nnodes="1", run_for=0)
    failed = _agent(etcd_endpoints, ids["failed"], str(tmp_path), nnodes="1", fail="0@0,0@1,0@2")
    closing = _agent(etcd_endpoints, ids["operator"], str(tmp_path), nnodes="1")
    stopping = _agent(etcd_endpoints, ids["stopped"], str(tmp_path), nnodes="1")
    lost = _agent(etcd_endpoints, ids["lost"], str(tmp_path), nnodes="1", conf="last_call_timeout=1,lease_ttl=3")
    try:
        results = [finish(done, 30), finish(failed, 30)]
        assert [code for code, _ in results] == [0, 1], results
        for name in ("operator", "stopped", "lost"):
            wait_for(lambda name=name: _status(etcd_endpoints, ids[name]) == "running", 30, what=f"{name}'s round")
        assert _ctl("close", "--reason", "done", endpoints=etcd_endpoints, rdzv_id=ids["operator"]).returncode == 0
        before = time.time()
        stopping.send_signal(signal.SIGTERM)
        _machine_lost(lost)  # agent, reaper and workers at once: no word from it; its lease runs out
        assert finish(closing, 30)[0] == 4 and finish(stopping, 30)[0] == 143
        after = time.time()
        wait_for(lambda: elastic.get_state(etcd_endpoints, ids["lost"]).outcome == "stopped", 30, what="lost's lease")
        listed = run(["list", "--rdzv-endpoint", etcd_endpoints, "--json"], tool_name="elastic-ctl")
        table = run(["list", "--rdzv-endpoint", etcd_endpoints], tool_name="elastic-ctl").stdout
        outcomes = {row["run_id"]: row for row in json.loads(listed.stdout)}
        statuses = {
            name: _ctl("status", endpoints=etcd_endpoints, rdzv_id=rid).stdout.splitlines()[0]
            for name, rid in ids.items()
        }
        watched = _ctl("watch", "--timeout", "1", endpoints=etcd_endpoints, rdzv_id=ids["stopped"]).stdout
    finally:
        for agent in (done, failed, closing, stopping, lost):
            if agent.poll() is None:
                agent.kill()
    print("\n" + "\n".join(statuses.values()) + "\n" + table + watched)
    finished = elastic.get_state(etcd_endpoints, ids["succeeded"]).nodes
    assert finished and all(node.finished for node in finished), finished  # a finished job's nodes finished
    expected = {
        "succeeded": "succeeded",
        "failed": "failed",
        "operator": "closed by an operator",
        "stopped": "stopped (no live agent since ",
        "lost": "stopped (no live agent since some time after ",
    }
    for name, outcome in expected.items():
        assert outcomes[ids[name]]["outcome"] == outcome.split(" (")[0], outcomes
        assert statuses[name].startswith(f"job {ids[name]}: {outcome}"), statuses[name]
    assert "1 node left no word: its lease ran out" in statuses["lost"], statuses["lost"]
    view = elastic.get_state(etcd_endpoints, ids["stopped"])
    assert before <= view.stopped_since <= after and view.stopped_silent == 0, view
    assert view.stopped == outcomes[ids["stopped"]]["stopped"] and view.stopped.startswith("no live agent since ")
    assert (
        outcomes[ids["lost"]]["stopped_since"] < before
        and elastic.get_state(etcd_endpoints, ids["lost"]).stopped_silent == 1
    )
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert " stopped since " in rows[ids["stopped"]] and " stopped after " in rows[ids["lost"]], table
    assert rows[ids["failed"]].endswith("(exit code 1) and no restart was left (2/2)"), table  # which rank, and why
    assert " rank 0 on node " in rows[ids["failed"]] and rows[ids["operator"]].endswith(" done"), table
    assert watched.startswith(f"job {ids['stopped']}: stopped (no live agent since "), watched
    assert "OLDEST HEARTBEAT" not in watched, watched  # status asks the agents for it; watch does not


def _machine_lost(agent) -> None:
    """SIGKILL to the agent and every process under it at once, as when its machine dies."""
    processes = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]
    for process in processes:
        process.kill()


def _status(endpoints: str, rid: str) -> str | None:
    view = elastic.get_state(endpoints, rid)
    return view.status if view is not None else None
