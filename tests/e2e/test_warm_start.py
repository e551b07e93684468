"""Warm starts: workers forked from the agent's pre-started interpreter get what a plain start gives
them (compared field by field with --no-warm-start), reseeded generators, their exit code and a
traceback of their own frames, and die with their agent. The first start may be plain (the
interpreter may still be importing), so each test looks at a restart, which is forked for sure."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil
import pytest

from .cli_helpers import records, run, tool, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "workers", "warm_probe.py")
PER_RUN = ("TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "ELASTIC_HEARTBEAT_FILE")


def _job(out, *options: str, flags=("--fail-first",)) -> subprocess.CompletedProcess:
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *options, PROBE, str(out), *flags]
    return run(args, timeout=120)


@pytest.mark.parametrize("numpy_too", [False, True], ids=["stdlib", "numpy"])
def test_a_forked_worker_is_started_as_a_plain_one_but_warm(tmp_path, numpy_too):
    if numpy_too:
        pytest.importorskip("numpy")
    preload = "decimal,numpy,numpy.random" if numpy_too else "decimal"
    warm_out, cold_out = tmp_path / "warm", tmp_path / "cold"
    warm_out.mkdir()
    cold_out.mkdir()
    flags = ("--fail-first", "--matmul")
    warm = _job(warm_out, "--preload", preload, flags=flags)
    cold = _job(cold_out, "--no-warm-start", flags=flags)
    assert warm.returncode == 0 and cold.returncode == 0, (warm.stderr, cold.stderr)
    forked, fresh = records(str(warm_out), 1), records(str(cold_out), 1)
    assert all(r["preloaded"]["decimal"] for r in forked.values()), "the restart was not forked warm"
    assert not any(r["preloaded"]["decimal"] for r in fresh.values())
    for rank in (0, 1):
        a, b = forked[rank], fresh[rank]
        for name in ("session_leader", "group_leader", "pdeathsig", "stdin", "cwd", "main", "main_name", "path0"):
            assert a[name] == b[name], (name, a[name], b[name])
        assert a["argv"][0] == b["argv"][0] and a["argv"][2:] == b["argv"][2:]  # [1] is each run's directory
        assert a["handlers"] == b["handlers"]
        assert a["pdeathsig"] == signal.SIGKILL and a["stdin"] == "/dev/null" and a["main_name"] == "__main__"
        keep = lambda env: {k: v for k, v in env.items() if k not in PER_RUN}  # noqa: E731
        assert keep(a["env"]).keys() == keep(b["env"]).keys()
        assert {k: v for k, v in keep(a["env"]).items() if "tmp" not in v} == {
            k: v for k, v in keep(b["env"]).items() if "tmp" not in v
        }
        if numpy_too:
            assert a["matmul"] == b["matmul"] == 512.0  # OpenBLAS's threads survived the fork
    assert forked[0]["random"] != forked[1]["random"]
    if numpy_too:
        assert forked[0]["numpy"] != forked[1]["numpy"], "numpy's global generator was not reseeded"


def test_a_forked_worker_ends_with_its_own_exit_code_and_its_own_traceback(tmp_path):
    code = _job(tmp_path, "--preload", "decimal", flags=("--exit", "3"))
    assert code.returncode == 1
    assert all(r["preloaded"]["decimal"] for r in records(str(tmp_path), 1).values())
    assert "exit code 3" in code.stderr, code.stderr
    raised = _job(tmp_path, "--preload", "decimal", flags=("--raise",))
    assert raised.returncode == 1
    assert "ValueError: the probe was told to raise" in raised.stderr + raised.stdout
    assert 'warm_probe.py", line' in raised.stderr + raised.stdout
    assert "zygote.py" not in raised.stderr + raised.stdout and "runpy" not in raised.stderr + raised.stdout


def test_a_forked_worker_and_its_interpreter_die_with_the_agent(tmp_path):
    agent = subprocess.Popen(
        [tool("elastic-run"), "--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "--preload", "decimal"]
        + [PROBE, str(tmp_path), "--fail-first", "--run", "120"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        worker = wait_for(lambda: records(str(tmp_path), 1).get(0), 60, what="the forked restart")
        assert worker["preloaded"]["decimal"]
        warm = [p for p in psutil.Process(agent.pid).children() if "zygote.py" in " ".join(p.cmdline())]
        assert len(warm) == 1
        agent.kill()
        agent.wait(10)
        gone = lambda: not psutil.pid_exists(worker["pid"]) and not warm[0].is_running()  # noqa: E731
        wait_for(gone, 10, what="the worker and the warm interpreter to die with the agent")
    finally:
        if agent.poll() is None:
            agent.kill()
