"""Warm starts: workers forked from the agent's pre-started interpreter get what a plain start gives
them (compared field by field with --no-warm-start), reseeded generators, their exit code and a
traceback of their own frames, and die with their agent. Each test looks at a restart's worker
(forked from the interpreter that forked the first start's too) beside a plain one's."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from .cli_helpers import records, run, tool, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "workers", "warm_probe.py")
PER_RUN = (
    "TORCHELASTIC_RUN_ID",
    "MASTER_PORT",
    "TORCHELASTIC_ERROR_FILE",
    "ELASTIC_HEARTBEAT_FILE",
    "ELASTIC_CHECKPOINT_MEMORY",
    "ELASTIC_INPROCESS",
)


def _job(out, *options: str, flags=("--fail-first",), program: str = PROBE) -> subprocess.CompletedProcess:
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *options, program, str(out), *flags]
    return run(args, timeout=120)


FORMS = {  # how the worker is started: its options before the program, and the program
    "script": ((), PROBE),
    "module": (("-m",), "tests.e2e.workers.warm_probe"),
    "run-path": (("--run-path",), PROBE),
}


@pytest.mark.parametrize(
    "form, numpy_too", [("script", False), ("script", True), ("module", False), ("run-path", False)]
)
def test_a_forked_worker_is_started_as_a_plain_one_but_warm(tmp_path, form, numpy_too):
    if numpy_too:
        pytest.importorskip("numpy")
    preload = "decimal,numpy,numpy.random" if numpy_too else "decimal"
    warm_out, cold_out = tmp_path / "warm", tmp_path / "cold"
    warm_out.mkdir()
    cold_out.mkdir()
    options, program = FORMS[form]
    flags = ("--fail-first", "--matmul")
    warm = _job(warm_out, *options, "--preload", preload, flags=flags, program=program)
    cold = _job(cold_out, *options, "--no-warm-start", flags=flags, program=program)
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
        named = lambda record, out: record["cmdline"].replace(str(out), "OUT")  # noqa: E731
        assert named(a, warm_out) == named(b, cold_out), "ps, top and pgrep -f see another command line"
        assert a["comm"] == b["comm"]
        assert a["gc"] == b["gc"] is True  # the collector on, as in any interpreter
        assert a["frozen"] > 1000 and b["frozen"] == 0, "the warm interpreter's objects are not frozen"
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
    shown = raised.stderr + raised.stdout
    assert "zygote.py" not in shown and "program.py" not in shown and "runpy" not in shown, shown
    killed = _job(tmp_path, "--preload", "decimal", flags=("--fail-first", "--signal", "SIGTERM"))
    assert killed.returncode == 1 and all(r["preloaded"]["decimal"] for r in records(str(tmp_path), 1).values())
    assert "  killed by SIGTERM at " in killed.stderr and "exit code -" not in killed.stderr, killed.stderr[-2000:]


def test_pgrep_finds_every_forked_worker_by_its_script(tmp_path):
    agent = subprocess.Popen(
        [tool("elastic-run"), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "decimal"]
        + [PROBE, str(tmp_path), "--fail-first", "--run", "120"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        forked = wait_for(lambda: len(records(str(tmp_path), 1)) == 2 and records(str(tmp_path), 1), 60)
        assert all(r["preloaded"]["decimal"] for r in forked.values()), "the restart was not forked warm"
        found = subprocess.run(["pgrep", "-f", "--", f" -u {PROBE} {tmp_path}"], capture_output=True, text=True)
        assert {int(pid) for pid in found.stdout.split()} == {r["pid"] for r in forked.values()}
    finally:
        agent.kill()
        agent.wait(10)


@pytest.mark.parametrize("flag, within", [("--stuck-teardown", 8), ("--linger-thread", 25)])
def test_a_forked_worker_whose_interpreter_would_never_exit_still_ends_and_so_does_the_job(tmp_path, flag, within):
    """A finalizer that waits forever at the interpreter's teardown (as a destructor waiting for a
    thread of the warm interpreter that the fork did not copy): a forked worker does not run that
    teardown. A non-daemon thread that never ends: given up 10 s after the program ended, said."""
    started = time.monotonic()
    done = _job(tmp_path, "--preload", "decimal", flags=("--fail-first", flag))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert all(r["preloaded"]["decimal"] for r in records(str(tmp_path), 1).values())
    assert took < within, f"the job took {took:.1f} s to end"
    if flag == "--linger-thread":
        assert "the program ended (exit code 0) but its process had not exited 10 s later" in done.stderr
        assert "threads still running: lingering" in done.stderr


def test_a_forked_worker_flushes_what_it_left_open_and_a_dead_weak_proxy_does_not_fail_its_exit(tmp_path):
    done = _job(tmp_path, "--preload", "decimal", flags=("--fail-first", "--unflushed"))
    assert done.returncode == 0, done.stderr
    assert all(r["preloaded"]["decimal"] for r in records(str(tmp_path), 1).values())
    for rank in (0, 1):
        assert (tmp_path / f"1-{rank}.unflushed").read_text() == "written at exit\n"


def test_a_forked_worker_flushes_a_file_the_warm_interpreter_opened(tmp_path):
    # the module's file is opened before the fork, so its object is one the interpreter froze; the
    # interpreter imports with the cyclic collector off (a fifth less CPU for torch's imports)
    log = tmp_path / "preopened.log"
    env = {"PYTHONPATH": os.path.join(HERE, "workers"), "PREOPENED": str(log)}
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "decimal,preopened"]
    done = run([*args, PROBE, str(tmp_path), "--fail-first", "--preopened"], timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert all(r["preloaded"]["decimal"] for r in records(str(tmp_path), 1).values())
    assert {"1-0", "1-1"} <= set(log.read_text().split()), log.read_text()
    assert log.read_text().startswith("collector-off\n"), "the warm interpreter imported with the collector on"


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
        warm = [p for p in psutil.Process(agent.pid).children() if "warm interpreter" in " ".join(p.cmdline())]
        assert len(warm) == 1
        agent.kill()
        agent.wait(10)
        gone = lambda: not psutil.pid_exists(worker["pid"]) and not warm[0].is_running()  # noqa: E731
        wait_for(gone, 10, what="the worker and the warm interpreter to die with the agent")
    finally:
        if agent.poll() is None:
            agent.kill()


def _children(pid: int) -> dict[int, tuple[float, str]]:
    """The process's children now that have a command line: pid -> (when it started, that line)."""
    found = {}
    try:
        for child in psutil.Process(pid).children():
            try:
                line = " ".join(child.cmdline())
                if line:  # none while it execs, or once it has ended (a zombie until reaped)
                    found[child.pid] = (child.create_time(), line)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return found


def test_the_warm_interpreter_starts_before_the_agent_s_own_helpers_and_is_the_only_one(tmp_path):
    """Started from the command line as typed (launcher.cli.early), before the agent's imports and its
    reaper; the agent adopts it: one warm interpreter over the whole run, and the workers forked from it."""
    agent = subprocess.Popen(
        [tool("elastic-run"), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "decimal"]
        + [PROBE, str(tmp_path), "--fail-first"],
        stdout=(log := open(tmp_path / "agent.log", "w")),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    said = lambda: (tmp_path / "agent.log").read_text()  # noqa: E731
    seen: dict[int, tuple[float, str]] = {}
    try:
        deadline = time.monotonic() + 60
        while agent.poll() is None and time.monotonic() < deadline:
            seen.update(_children(agent.pid))
            time.sleep(0.01)
        assert agent.wait(30) == 0, said()
    finally:
        if agent.poll() is None:
            agent.kill()
        log.close()
    warm = {pid: at for pid, (at, line) in seen.items() if "zygote.py" in line or "warm interpreter" in line}
    reapers = [at for at, line in seen.values() if "reaper" in line]
    assert len(warm) == 1, f"warm interpreters started: {sorted(seen.values())}\n{said()}"
    assert reapers and min(warm.values()) < min(reapers), f"{sorted(seen.values())}\n{said()}"
    restarted = records(str(tmp_path), 1)
    assert restarted and all(r["preloaded"]["decimal"] for r in restarted.values()), f"not forked warm: {said()}"


def test_a_torch_program_gets_torch_preloaded_without_cuda_and_each_worker_its_own_seed(tmp_path):
    """No --preload: the program imports torch, so its workers are forked with torch and
    torch._dynamo imported (a restart's first line finds them), CUDA untouched, seeds their own."""
    pytest.importorskip("torch")
    program = os.path.join(HERE, "workers", "torch_probe.py")
    warm_out, cold_out = tmp_path / "warm", tmp_path / "cold"
    warm_out.mkdir()
    cold_out.mkdir()
    warm = run(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", program, str(warm_out)], timeout=180)
    cold = run(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--no-warm-start", program, str(cold_out)],
        timeout=180,
    )
    assert warm.returncode == 0 and cold.returncode == 0, (warm.stderr, cold.stderr)
    forked, fresh = records(str(warm_out), 1), records(str(cold_out), 1)
    assert all(r["preloaded"] for r in forked.values()), forked
    assert not any(r["preloaded"] for r in fresh.values())
    assert not any(r["cuda_initialized"] for r in forked.values())
    assert forked[0]["seed"] != forked[1]["seed"] and forked[0]["rand"] != forked[1]["rand"]


def test_an_interpreter_that_dies_or_a_module_that_will_not_import_is_one_line_and_the_job_runs(tmp_path):
    (tmp_path / "dies_on_import.py").write_text("import os\nos._exit(7)\n")
    env = {"PYTHONPATH": str(tmp_path)}
    out = tmp_path / "out"
    out.mkdir()
    args = ["--standalone", "--nproc-per-node", "1", PROBE, str(out)]
    died = run(["--preload", "dies_on_import", *args], timeout=120, env=env)
    assert died.returncode == 0, died.stderr
    assert "warm start off: the warm interpreter exited" in died.stderr
    assert records(str(out), 0)[0]["preloaded"]["decimal"] is False  # started plainly
    missing = run(["--preload", "decimal,no_such_module_here", *args], timeout=120, env=env)
    assert missing.returncode == 0, missing.stderr
    assert "warm start: could not import no_such_module_here (ModuleNotFoundError" in missing.stderr
    assert records(str(out), 0)[0]["preloaded"]["decimal"] is True  # the rest was preloaded
