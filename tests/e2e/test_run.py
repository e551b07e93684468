"""elastic-run end to end: real agents, real workers, real etcd."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import time

import psutil
import pytest

import elastic
from launcher.workers.env import EXPORTED
from tests.hangs.helpers import Agent

from .cli_helpers import PROBE, agent_args, finish, records, run, run_id, start, tool, wait_for


def test_standalone_gives_every_rank_the_torchrun_environment(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = run(
        ["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"), PROBE, str(out)],
        env={"USER_SETTING": "kept"},
    )
    assert result.returncode == 0, result.stderr
    found = records(str(out))
    assert sorted(found) == [0, 1]
    run_ids = set()
    for rank, record in found.items():
        env = record["env"]
        assert set(EXPORTED) <= set(env)
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
        assert env["ROLE_NAME"] == "default" and env["ROLE_RANK"] == str(rank)
        assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the agent hosts the store, as torchrun's
        assert env["TORCHELASTIC_ERROR_FILE"].startswith(str(tmp_path / "logs"))
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(os.path.join("attempt_0", str(rank), "error.json"))
        assert env["OMP_NUM_THREADS"] == "1" and env["USER_SETTING"] == "kept"
        assert elastic.is_torchelastic_launched(env)
        run_ids.add(env["TORCHELASTIC_RUN_ID"])
    assert len(run_ids) == 1 and run_ids.pop().startswith("standalone-")
    assert found[0]["env"]["MASTER_PORT"] == found[1]["env"]["MASTER_PORT"]
    lines = result.stdout.splitlines()  # as torchrun: the workers' lines unchanged
    assert "worker rank 0 of 2 restart 0" in lines and "worker rank 1 of 2 restart 0" in lines


def test_users_omp_num_threads_is_kept(tmp_path):
    result = run(["--standalone", "--nproc-per-node", "1", PROBE, str(tmp_path)], env={"OMP_NUM_THREADS": "7"})
    assert result.returncode == 0, result.stderr
    assert records(str(tmp_path))[0]["env"]["OMP_NUM_THREADS"] == "7"


def test_three_agents_two_workers_each_get_unique_global_ranks(etcd_endpoints, tmp_path):
    rid = run_id()
    agents = [start(agent_args(etcd_endpoints, rid, "3") + [PROBE, str(tmp_path)]) for _ in range(3)]
    results = [finish(agent, timeout=60) for agent in agents]
    assert all(code == 0 for code, _ in results), results
    found = records(str(tmp_path), restart=0)
    assert sorted(found) == [0, 1, 2, 3, 4, 5]
    assert {r["env"]["WORLD_SIZE"] for r in found.values()} == {"6"}
    assert len({r["env"]["MASTER_ADDR"] + ":" + r["env"]["MASTER_PORT"] for r in found.values()}) == 1
    assert len({r["env"]["MASTER_PORT"] for r in found.values()}) == 1
    assert sorted(r["env"]["GROUP_RANK"] for r in found.values()) == ["0", "0", "1", "1", "2", "2"]
    state = elastic.get_state(etcd_endpoints, rid)
    assert state is not None and state.status == "closed" and state.reason == "the job finished"


def test_failed_worker_is_restarted_and_the_job_succeeds(tmp_path):
    result = run(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", PROBE, str(tmp_path), "--fail-until", "1"]
    )
    assert result.returncode == 0, result.stderr
    assert "failed (exit code 1); restarting the workers (1/2)" in result.stderr and "rank 1 on node " in result.stderr
    again = records(str(tmp_path), restart=1)
    assert sorted(again) == [0, 1]
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in again.values()} == {"1"}
    assert not os.path.exists(os.path.join(str(tmp_path), "2-0.json"))


def test_exhausted_restarts_print_a_summary_with_the_traceback(tmp_path):
    result = run(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", PROBE, str(tmp_path), "--fail-until", "5"]
    )
    assert result.returncode == 1
    err = result.stderr
    assert "failed after 1 of 1 restarts" in err
    assert "first failure: rank 1 (local rank 1)" in err
    assert "exit code 1 at " in err
    assert "error: ValueError: planned failure of rank 1 at restart 1" in err
    assert "traceback (from the error file):" in err
    assert 'raise ValueError(f"planned failure' in err
    agent = "\n".join(line for line in err.splitlines() if line.startswith("elastic-run:"))
    assert "Traceback" not in agent.split("traceback (from the error file):")[0]


def test_worker_without_error_file_gets_a_clear_note(tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    result = run(["--standalone", "--nproc-per-node", "1", str(script)])
    assert result.returncode == 1
    assert "rank 0 (local rank 0)" in result.stderr
    assert "killed by SIGSEGV" in result.stderr
    assert "a signal leaves no error file nor traceback" in result.stderr and "@elastic.record" not in result.stderr
    script.write_text("import sys\nsys.exit(3)\n")
    exited = run(["--standalone", "--nproc-per-node", "1", str(script)])
    assert "rank 0 wrote no error file: decorate" in exited.stderr, exited.stderr


def test_a_standalone_summary_names_only_what_outlives_the_run(tmp_path):
    """--standalone: its etcd and its temporary log directory end with the agent, so the summary
    names neither a path in that directory nor an elastic-ctl command for that etcd."""
    script = tmp_path / "die.py"
    script.write_text("import sys\nsys.exit(3)\n")
    result = run(["--standalone", "--nproc-per-node", "2", str(script)])
    assert result.returncode == 1 and "exit code 3" in result.stderr, result.stderr
    paths = re.findall(r"(/[\w.@-]+(?:/[\w.@-]+)+)", result.stderr)
    assert all(os.path.exists(path) for path in paths), paths  # no path into the removed log directory
    assert "elastic-ctl" not in result.stderr, result.stderr


def test_logs_tee_redirect_and_rank_filter(tmp_path):
    logs = tmp_path / "logs"
    result = run(
        [
            "--standalone",
            "--nproc-per-node",
            "3",
            "--log-dir",
            str(logs),
            "--tee",
            "3",
            "--redirects",
            "2:1",
            "--local-ranks-filter",
            "0,2",
            PROBE,
            str(tmp_path),
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "[default0]:worker rank 0 of 3 restart 0" in result.stdout.splitlines()  # teed: prefixed
    assert "[default1]:" not in result.stdout and "rank 1 of 3" not in result.stdout  # filtered
    assert "[default2]:worker rank 2 of 3 restart 0" in result.stdout.splitlines()  # tee wins over redirects
    (job_dir,) = logs.iterdir()
    assert job_dir.name.startswith("standalone-")
    (node_dir,) = job_dir.iterdir()
    for rank in range(3):
        text = (node_dir / "attempt_0" / str(rank) / "stdout.log").read_text()
        assert f"worker rank {rank} of 3 restart 0" in text


def test_the_prefix_template_option_names_the_host_and_rank_of_each_teed_line(tmp_path):
    """torchrun 2.14's --log-line-prefix-template; it wins over the environment's template."""
    env = {**os.environ, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[env]"}
    args = ["--standalone", "--nproc-per-node", "2", "--tee", "3"]
    result = run([*args, "--log-line-prefix-template", "${hostname}:${rank}: ", PROBE, str(tmp_path)], env=env)
    assert result.returncode == 0, result.stderr
    host = socket.gethostname()  # the short name, as torch 2.14 puts it in
    lines = result.stdout.splitlines()
    for rank in (0, 1):
        assert f"{host}:{rank}: worker rank {rank} of 2 restart 0" in lines, lines
    assert "[env]" not in result.stdout


def test_print_completion_writes_a_script_that_completes_elastic_runs_options_in_bash(tmp_path):
    """torchrun 2.14's --print-completion: the bash script, sourced in a real bash, completes an option."""
    script = run(["--print-completion", "bash"])
    assert script.returncode == 0 and "_ELASTIC_RUN_COMPLETE" in script.stdout, script.stderr
    (tmp_path / "complete.bash").write_text(script.stdout)
    probe = (
        f"source {tmp_path}/complete.bash; COMP_WORDS=(elastic-run --log-line); COMP_CWORD=1; "
        'COMPREPLY=(); _elastic_run_completion elastic-run; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    path = os.path.dirname(tool("elastic-run")) + os.pathsep + os.environ["PATH"]
    env = {**os.environ, "PATH": path}
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.split() == ["--log-line-prefix-template"], (done.stdout, done.stderr)
    refused = run(["--print-completion", "tcsh"])
    assert refused.returncode == 2 and "tcsh has no completion here" in refused.stderr, refused.stderr


def _worker_pids(out: str, count: int, restart: int = 0) -> dict[int, int]:
    found = wait_for(lambda: (r := records(out, restart)) and len(r) >= count and r, 30, what=f"{count} workers")
    return {rank: r["pid"] for rank, r in found.items()}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("trial", range(5))
def test_sigkilled_agent_takes_its_workers_and_the_others_go_on(etcd_endpoints, tmp_path, trial):
    rid = run_id()
    agents = [
        start(agent_args(etcd_endpoints, rid, "2:3") + [PROBE, str(tmp_path), "--run", "60", "--grandchild"])
        for _ in range(3)
    ]
    try:
        _worker_pids(str(tmp_path), 6)
        first = records(str(tmp_path), 0)
        victim = agents[trial % 3]
        children = [p.pid for p in psutil.Process(victim.pid).children(recursive=True)]
        victims = [r for r in first.values() if r["pid"] in children]
        assert len(victims) == 2, "each agent runs two workers"
        doomed = [r["pid"] for r in victims] + [r["grandchild"] for r in victims]
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        wait_for(lambda: not any(_alive(pid) for pid in doomed), 2.0, what="the killed agent's workers to die")
        # The two survivors re-rendezvous without a restart and start 2 x 2 workers.
        survivors = wait_for(
            lambda: (
                (
                    r := {
                        k: v
                        for k, v in records(str(tmp_path), 0).items()
                        if v["env"]["WORLD_SIZE"] == "4" and v["pid"] not in [x["pid"] for x in first.values()]
                    }
                )
                and len(r) == 4
                and r
            ),
            15,
            what="4 restarted workers",
        )
        recovery = time.monotonic() - killed_at
        assert sorted(survivors) == [0, 1, 2, 3]
        assert recovery < 6, f"recovery took {recovery:.1f}s"
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        for agent in agents:
            finish(agent, timeout=30)


def test_a_fourth_agent_scales_the_job_up(etcd_endpoints, tmp_path):
    rid = run_id()
    conf = "last_call_timeout=0.5"
    args = agent_args(etcd_endpoints, rid, "2:4", nproc=1, conf=conf) + [PROBE, str(tmp_path), "--run", "60"]
    agents = [start(args) for _ in range(3)]
    try:
        wait_for(
            lambda: len([r for r in records(str(tmp_path), 0).values() if r["env"]["WORLD_SIZE"] == "3"]) == 3,
            30,
            what="a round of 3",
        )
        agents.append(start(args))
        grown = wait_for(
            lambda: (
                (r := [x for x in records(str(tmp_path), 0).values() if x["env"]["WORLD_SIZE"] == "4"])
                and len(r) == 4
                and r
            ),
            30,
            what="a round of 4",
        )
        assert sorted(int(r["env"]["RANK"]) for r in grown) == [0, 1, 2, 3]
        state = elastic.get_state(etcd_endpoints, rid)
        assert state.status == "running" and len(state.nodes) == 4
    finally:
        for agent in agents:
            agent.send_signal(signal.SIGTERM)
        for agent in agents:
            finish(agent, timeout=30)


def test_sigterm_stops_workers_gracefully_and_leaves_the_job_open(etcd_endpoints, tmp_path):
    rid = run_id()
    agent = start(
        agent_args(etcd_endpoints, rid, "1:2", conf="last_call_timeout=0.5")
        + [PROBE, str(tmp_path), "--run", "60", "--trap-term"]
    )
    pids = _worker_pids(str(tmp_path), 2)
    agent.send_signal(signal.SIGTERM)
    code, output = finish(agent, timeout=20)
    assert code == 128 + signal.SIGTERM, output
    for rank in (0, 1):
        assert (tmp_path / f"0-{rank}.term").read_text() == "SIGTERM"
    assert not any(_alive(pid) for pid in pids.values())
    state = elastic.get_state(etcd_endpoints, rid)
    assert state is not None and state.status == "running"  # not closed: others may go on
    assert all(not node.alive for node in state.nodes)  # its lease was revoked at once


def test_elastic_ctl_status_shows_a_running_job(etcd_endpoints, tmp_path):
    rid = run_id()
    agent = start(agent_args(etcd_endpoints, rid, "1") + [PROBE, str(tmp_path), "--run", "30"])
    try:
        _worker_pids(str(tmp_path), 2)
        table = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rid], tool_name="elastic-ctl")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].startswith(f"job {rid}: running, round 1, world size 2, master 127.0.0.1:")
        assert lines[1].split() == ["NODE", "GROUP", "RANK", "ADDRESS", "WORKERS", "ALIVE", "OLDEST", "HEARTBEAT"]
        assert lines[2].split()[1:] == ["0", "127.0.0.1", "2", "yes", "-"]  # its workers never call elastic.heartbeat()
        as_json = run(
            ["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rid, "--json"], tool_name="elastic-ctl"
        )
        data = json.loads(as_json.stdout)
        assert data["status"] == "running" and data["world_size"] == 2 and data["nodes"][0]["alive"] is True
        assert data["nodes"][0]["heartbeat_age"] is None
        watched = run(
            ["watch", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rid, "--timeout", "0.5"], tool_name="elastic-ctl"
        )
        assert watched.returncode == 0 and watched.stdout.startswith(f"job {rid}: running")
    finally:
        agent.send_signal(signal.SIGTERM)
        finish(agent)
    missing = run(["status", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", "no-such-job"], tool_name="elastic-ctl")
    assert (
        missing.returncode == 1
        and missing.stderr.strip() == f"elastic-ctl: no job 'no-such-job' at {etcd_endpoints} (under /elastic)"
    )


def test_etcd_v2_is_an_alias_that_runs_on_the_v3_api(etcd_endpoints, tmp_path):
    result = run(
        [
            "--rdzv-backend",
            "etcd-v2",
            "--rdzv-endpoint",
            etcd_endpoints,
            "--rdzv-id",
            run_id(),
            "--local-addr",
            "127.0.0.1",
            PROBE,
            str(tmp_path),
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "--rdzv-backend etcd-v2: using etcd's v3 API (etcd 3.6 removed v2)" in result.stderr


def test_while_nodes_are_missing_a_progress_line_comes_every_10_s_with_the_join_timeout(etcd_endpoints, tmp_path):
    script = tmp_path / "w.py"
    script.write_text("pass\n")
    agent = Agent(
        ["--nnodes", "2", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", run_id(), "--local-addr", "127.0.0.1"]
        + ["--rdzv-conf", "join_timeout=60", str(script)]
    )
    try:
        wait_for(lambda: agent.count(r"nodes joined") >= 2, 20, interval=0.2, what="a second progress line")
        (first, line), (second, _) = [(at, text) for at, text in agent.lines if "nodes joined" in text][:2]
        assert re.fullmatch(
            r"elastic-run: round 1: 1/2 nodes joined \(min 2, max 2\), waiting for 1 more, join timeout in 5\d s", line
        ), line
        assert 9.0 <= second - first <= 11.5, f"{second - first:.1f} s between the lines"
    finally:
        agent.kill()


def test_a_console_closed_under_a_failing_job_changes_neither_what_etcd_records_nor_the_exit_code(
    etcd_endpoints, tmp_path
):
    """``elastic-run ... 2>&1 | head -1``: the chatty worker dies of its broken pipe, the job has no
    restart left, and the agent's summary goes to a closed pipe too. The job must still be closed as
    failed in etcd (not left running for the others to take for a lost node), and the agent exit 1."""
    chatty = tmp_path / "chatty.py"
    chatty.write_text("import time\nfor i in range(100000):\n    print('line', i, flush=True)\n    time.sleep(0.001)\n")
    rid = run_id()
    agent = start(["--nnodes", "1", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rid, str(chatty)])
    first = ""
    while not first.startswith("line "):  # the worker's first line: it writes to the pipe too
        ready, _, _ = select.select([agent.stdout], [], [], 30)  # a bounded wait for each line
        assert ready, "the worker printed nothing in 30 s"
        first = agent.stdout.readline()
    agent.stdout.close()  # as head -1 does after its line (here the worker's, not the agent's own)
    code = agent.wait(60)
    state = elastic.get_state(etcd_endpoints, rid)
    said = f"{state.status} ({state.reason})" if state else "gone"
    print(f"\nconsole closed after {first.strip()!r}: exit {code}, the job {said}")
    assert state is not None and state.status == "closed", state
    assert "no restart left" in state.reason or "failed" in state.reason, state.reason
    assert code == 1


def test_an_agent_killed_outright_leaves_no_temporary_directory(tmp_path):
    """SIGKILL to a --standalone agent: its reaper kills the workers, then removes the run's log
    root (where the error files go), the heartbeat directory and the local etcd's data."""
    script = tmp_path / "sleeper.py"
    seen = tmp_path / "env.json"
    script.write_text(
        "import json, os, sys, time\n"
        f"json.dump(dict(os.environ), open({str(seen)!r} + '.part', 'w'))\n"
        f"os.replace({str(seen)!r} + '.part', {str(seen)!r})\n"
        "time.sleep(60)\n"
    )
    agent = start(["--standalone", "--nproc-per-node", "1", str(script)])
    try:
        wait_for(seen.exists, 30, what="the worker's start")
        env = json.loads(seen.read_text())
        etcd = [p for p in psutil.Process(agent.pid).children(recursive=True) if p.name().startswith("etcd")]
        argv = etcd[0].cmdline()
        data = [argv[argv.index("--data-dir") + 1]]
        dirs = [
            os.path.dirname(os.path.dirname(os.path.dirname(env["TORCHELASTIC_ERROR_FILE"]))),  # <root>/attempt_0/0/
            os.path.dirname(env["ELASTIC_HEARTBEAT_FILE"]),
            os.path.dirname(data[0]),  # <data dir>/<member>
        ]
        assert all(os.path.basename(d).startswith("elastic-") and os.path.isdir(d) for d in dirs), dirs
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        wait_for(lambda: not any(os.path.exists(d) for d in dirs), 15, what=f"the removal of {dirs}")
    finally:
        if agent.poll() is None:
            agent.kill()
