"""torch's launch API cases (test/distributed/launcher/api_test.py) through torch's ``elastic_launch``
and ours (``elastic.launch``) side by side, each in a process of its own with the same config; only
the rendezvous differs: torch's c10d (or static) on a free port, ours etcd v3 on the test's etcd.

Not applicable here, each because it replaces torch's own classes with mocks: agent_raise_exception
(LocalElasticAgent.run mocked), launch_shutdown (the registry's handler mocked),
rdzv_handler_shutdown_on_agent_signal / _on_agent_error (both mocked), get_entrypoint_name (a private
helper of torch's). Their behaviour here: an agent stopped by a signal leaves the job open and one
whose workers failed closes it (tests/e2e/test_run.py, test_restart_count.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DRIVER = str(HERE / "workers" / "api_driver.py")
SCRIPT = str(HERE / "workers" / "touch.py")
SHELL = str(HERE / "workers" / "touch.sh")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(side: str, case: dict) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["TEST_SENTINEL_PARENT"] = "FOOBAR"
    return subprocess.Popen(
        [sys.executable, DRIVER, side, json.dumps(case)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def _finish(process: subprocess.Popen, timeout: float = 120) -> dict:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate(timeout=10)
        raise AssertionError(f"the launching process did not end within {timeout}s:\n{err[-2000:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, (process.returncode, err[-3000:])
    return json.loads(lines[-1][len("RESULT ") :])


def _configs(
    etcd: str,
    min_nodes: int,
    max_nodes: int,
    nproc: int,
    *,
    torch_backend: str = "c10d",
    run_id: str | None = None,
    **extra,
) -> tuple[dict, dict]:
    """(torch's, ours): torch's test config with only the rendezvous swapped."""
    rdzv = {"last_call_timeout": 1, "join_timeout": 60}
    base = {
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "nproc_per_node": nproc,
        "monitor_interval": 0.1,
        "start_method": "spawn",
        "max_restarts": 0,
        "run_id": run_id or uuid.uuid4().hex,
        **extra,
    }
    port = _free_port()
    theirs = {
        **base,
        "rdzv_backend": torch_backend,
        "rdzv_endpoint": f"127.0.0.1:{port}",
        "rdzv_configs": {"rank": 0} if torch_backend == "static" else dict(rdzv),
    }
    ours = {**base, "rdzv_backend": "etcd", "rdzv_endpoint": etcd, "rdzv_configs": dict(rdzv)}
    return theirs, ours


def _both(theirs: dict, ours: dict, timeout: float = 120) -> tuple[dict, dict]:
    processes = [_start("torch", theirs), _start("ours", ours)]
    return _finish(processes[0], timeout), _finish(processes[1], timeout)


@pytest.mark.parametrize(
    "entrypoint,args,nproc",
    [
        ("cmd:" + sys.executable, ["-u", SCRIPT, "--touch-file-dir={dir}"], 2),  # launch_script_python
        ("cmd:" + SHELL, ["{dir}"], 2),  # launch_script_bash
    ],
    ids=["script_python", "script_bash"],
)
def test_a_command_runs_on_every_rank_under_both(tmp_path, etcd_endpoints, entrypoint, args, nproc):
    dirs = {side: tmp_path / side for side in ("torch", "ours")}
    cases = {}
    for side, config in zip(dirs, _configs(etcd_endpoints, 1, 1, nproc)):
        dirs[side].mkdir()
        cases[side] = {"config": config, "entrypoint": entrypoint, "args": [a.format(dir=dirs[side]) for a in args]}
    theirs, ours = _both(cases["torch"], cases["ours"])
    assert "error" not in theirs and "error" not in ours, (theirs, ours)
    assert theirs["results"] == ours["results"] == [{str(r): None for r in range(nproc)}]
    assert sorted(os.listdir(dirs["torch"])) == sorted(os.listdir(dirs["ours"])) == [str(r) for r in range(nproc)]


def test_a_function_returns_each_ranks_value_under_both(etcd_endpoints):
    theirs_config, ours_config = _configs(etcd_endpoints, 1, 1, 2)
    theirs, ours = _both(
        {"config": theirs_config, "entrypoint": "fn:simple_rank_scale"},
        {"config": ours_config, "entrypoint": "fn:simple_rank_scale"},
    )
    assert theirs["results"] == ours["results"] == [{"0": 10, "1": 11}], (theirs, ours)


def test_a_function_of_the_callers_main_module_runs_under_both(etcd_endpoints):
    theirs_config, ours_config = _configs(etcd_endpoints, 1, 1, 2)
    theirs, ours = _both(
        {"config": theirs_config, "entrypoint": "main:rank_squared"},
        {"config": ours_config, "entrypoint": "main:rank_squared"},
    )
    assert theirs["results"] == ours["results"] == [{"0": 0, "1": 1}], (theirs, ours)


def test_a_gloo_all_reduce_returns_the_sum_under_both(etcd_endpoints):
    theirs_config, ours_config = _configs(etcd_endpoints, 1, 1, 2, torch_backend="static")  # dist_sum_with_static_rdzv
    theirs, ours = _both(
        {"config": theirs_config, "entrypoint": "fn:dist_sum"}, {"config": ours_config, "entrypoint": "fn:dist_sum"}
    )
    assert theirs["results"] == ours["results"] == [{"0": 1, "1": 1}], (theirs, ours)


def test_elastic_min_1_max_2_with_one_agent_runs_under_both(tmp_path, etcd_endpoints):
    cases = {}
    for side, config in zip(("torch", "ours"), _configs(etcd_endpoints, 1, 2, 2)):
        (tmp_path / side).mkdir()
        cases[side] = {
            "config": config,
            "entrypoint": "cmd:" + sys.executable,
            "args": ["-u", SCRIPT, f"--touch-file-dir={tmp_path / side}"],
        }
    theirs, ours = _both(cases["torch"], cases["ours"])
    assert "error" not in theirs and "error" not in ours, (theirs, ours)
    assert sorted(os.listdir(tmp_path / "torch")) == sorted(os.listdir(tmp_path / "ours")) == ["0", "1"]


def test_no_run_id_with_max_nodes_2_runs_under_both_on_a_random_id(etcd_endpoints):
    """torch's default run_id "" for an elastic config: a random id and a warning, not an error."""
    theirs_config, ours_config = _configs(etcd_endpoints, 1, 2, 2)
    theirs_config["run_id"] = ours_config["run_id"] = ""
    theirs, ours = _both(
        {"config": theirs_config, "entrypoint": "fn:simple_rank_scale"},
        {"config": ours_config, "entrypoint": "fn:simple_rank_scale"},
    )
    assert theirs["results"] == ours["results"] == [{"0": 10, "1": 11}], (theirs, ours)


def test_a_failing_worker_raises_child_failed_error_under_both(etcd_endpoints):
    theirs_config, ours_config = _configs(etcd_endpoints, 1, 2, 2)
    theirs, ours = _both(
        {"config": theirs_config, "entrypoint": "fn:function_with_bug"},
        {"config": ours_config, "entrypoint": "fn:function_with_bug"},
    )
    assert theirs["error"] == ours["error"] == "ChildFailedError", (theirs, ours)
    for side in (theirs, ours):  # both ranks raise at once: which failures are seen first is a race under both
        assert side["failures"] and set(side["failures"]) <= {"0", "1"}, side
        assert all(f == {"exitcode": 1} for f in side["failures"].values()), side
    assert "RuntimeError: test error" in ours["message"] and "function_with_bug" in ours["message"]


def test_multiple_agents_in_separate_processes_form_one_job_under_both(tmp_path, etcd_endpoints):
    run_id = uuid.uuid4().hex
    _two_agents_each(tmp_path, *_configs(etcd_endpoints, 2, 2, 1, run_id=run_id))


def test_a_c10d_config_of_two_agents_runs_unchanged_under_both(tmp_path):
    """torch's c10d config as it is (only its port differs): our agent on the endpoint's host serves
    an etcd there, the other joins it (``launcher.hosted``)."""
    theirs_config, _ = _configs("", 2, 2, 1, run_id=uuid.uuid4().hex)
    _two_agents_each(tmp_path, theirs_config, {**theirs_config, "rdzv_endpoint": f"127.0.0.1:{_free_port()}"})


def _two_agents_each(tmp_path, theirs_config: dict, ours_config: dict) -> None:
    processes = {}
    for side, config in (("torch", theirs_config), ("ours", ours_config)):
        (tmp_path / side).mkdir()
        case = {
            "config": config,
            "entrypoint": "cmd:" + sys.executable,
            "args": ["-u", SCRIPT, f"--touch-file-dir={tmp_path / side}"],
        }
        processes[side] = [_start(side, case) for _ in range(2)]
    outcomes = {side: [_finish(p, 150) for p in procs] for side, procs in processes.items()}
    for side, results in outcomes.items():
        assert all("error" not in r for r in results), (side, results)
        assert sorted(rank for r in results for rank in r["results"][0]) == ["0", "1"], (side, results)
    assert sorted(os.listdir(tmp_path / "torch")) == sorted(os.listdir(tmp_path / "ours")) == ["0", "1"]


def test_a_rank_that_fails_once_is_restarted_and_every_value_returned_under_both(tmp_path, etcd_endpoints):
    theirs_config, ours_config = _configs(etcd_endpoints, 1, 1, 2, max_restarts=1)
    cases = {}
    for side, config in (("torch", theirs_config), ("ours", ours_config)):
        (tmp_path / side).mkdir()
        cases[side] = {"config": config, "entrypoint": "fn:rank_and_restart", "args": [str(tmp_path / side)]}
    theirs, ours = _both(cases["torch"], cases["ours"])
    assert (tmp_path / "ours" / "failed-once").exists()
    assert theirs["results"] == ours["results"] == [{"0": [0, 1], "1": [1, 1]}], (theirs, ours)
    print(
        f"\nrank 1 failed once; after the restart the call returned {ours['results'][0]} "
        f"(torch: {theirs['results'][0]})"
    )


def test_launching_twice_from_one_process_leaves_nothing_behind():
    case = {
        "config": {"min_nodes": 1, "max_nodes": 1, "nproc_per_node": 2, "max_restarts": 0},
        "entrypoint": "fn:simple_rank_scale",
        "times": 2,
    }  # no endpoint: a local etcd, as --standalone
    ours = _finish(_start("ours", case))
    assert ours["results"] == [{"0": 10, "1": 11}] * 2, ours
    assert ours["children"] == [] and ours["env_changed"] == [], ours
    assert ours["extra_threads"] <= 2, ours  # grpc's and the stream loop's, kept for the next launch


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"min_nodes": 3, "max_nodes": 2}, "min_nodes"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"rdzv_backend": "zeus"}, "rdzv_backend"),
        ({"monitor_interval": 0}, "monitor_interval"),
        ({"start_method": "thread"}, "start_method"),
        ({"max_nodes": 2}, "rdzv_endpoint"),
        ({"shutdown_timeout": -5}, "shutdown_timeout"),
        ({"crash_loop_restarts": -1}, "crash_loop_restarts"),
        ({"progress_window": -2.0}, "progress_window"),
        ({"health_check": 7}, "health_check"),
    ],
)
def test_a_bad_config_field_is_one_value_error_naming_it(changes, field):
    from elastic.launch import LaunchConfig

    with pytest.raises(ValueError, match=rf"LaunchConfig\.{field}\b") as raised:
        LaunchConfig(**{"min_nodes": 1, "max_nodes": 1, "nproc_per_node": 1, **changes})
    assert "\n" not in str(raised.value)


def test_the_gray_failure_fields_reach_the_agent_as_elastic_runs_options_do(tmp_path):
    """LaunchConfig's crash-loop, health-check, straggler and pre-flight fields end in the agent's
    config exactly as elastic-run's options do (the plan both build)."""
    from elastic.launch import LaunchConfig
    from launcher.api import _request
    from launcher.config import CrashLoop
    from launcher.plan import build_plan

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=1, crash_loop_restarts=5, progress_window=60.0,
        health_check="test -d /tmp", replace_stragglers=True, preflight=True,
    )  # fmt: skip
    agent = build_plan(_request(config, [sys.executable, "-c", "pass"], str(tmp_path))).config
    assert agent.crash_loop == CrashLoop(5, 60.0)
    assert agent.replace_stragglers and agent.preflight
    assert agent.checks.command == "test -d /tmp"
    default = build_plan(_request(LaunchConfig(1, 1, 1), [sys.executable], str(tmp_path))).config
    assert default.crash_loop == CrashLoop() and not (default.replace_stragglers or default.preflight)


def test_torchs_test_launch_elastic_as_torch_writes_it_passes_through_our_api(tmp_path, etcd_endpoints):
    """torch's ``test_launch_elastic`` with its own config, untouched: run_id "" (a random id),
    min 1 / max 2 nodes, 4 workers, backend "etcd", no rendezvous settings -- so the round waits
    the default last call (30 s) for a second node that never comes, then runs with one."""
    config = {
        "min_nodes": 1,
        "max_nodes": 2,
        "nproc_per_node": 4,
        "run_id": "",
        "rdzv_endpoint": etcd_endpoints,
        "monitor_interval": 0.1,
        "rdzv_backend": "etcd",
        "start_method": "spawn",
        "max_restarts": 0,
        "rdzv_configs": {},
    }
    case = {
        "config": config,
        "entrypoint": "cmd:" + sys.executable,
        "args": ["-u", SCRIPT, f"--touch-file-dir={tmp_path}"],
    }
    result = _finish(_start("ours", case), timeout=90)
    assert "error" not in result, result
    assert sorted(os.listdir(tmp_path)) == ["0", "1", "2", "3"]  # torch's check_works_ran(world_size=4)
