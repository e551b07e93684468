"""torchrun 2.13's options that act on the agent: --signals-to-handle, --event-log-handler,
--logs-specs with a class from the torchrun.logs_specs entry points."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from .cli_helpers import HERE, PROBE, records, run, tool, wait_for

SIGNALLED = os.path.join(HERE, "workers", "signalled.py")


def test_a_signal_named_in_signals_to_handle_stops_the_job_and_reaches_the_workers(tmp_path):
    agent = subprocess.Popen(
        [
            tool("elastic-run"),
            "--standalone",
            "--nproc-per-node",
            "2",
            "--signals-to-handle",
            "SIGTERM,SIGUSR1",
            "--shutdown-timeout",
            "5",
            SIGNALLED,
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: all((tmp_path / f"{r}.ready").exists() for r in (0, 1)), 30, what="both workers ready")
        started = time.monotonic()
        agent.send_signal(signal.SIGUSR1)
        _, err = agent.communicate(timeout=20)
    finally:
        agent.kill()
    assert agent.returncode == 128 + signal.SIGUSR1, err
    assert [(tmp_path / f"{r}.signal").read_text() for r in (0, 1)] == ["SIGUSR1", "SIGUSR1"]
    print(
        f"\nSIGUSR1 to the agent: both workers got SIGUSR1; agent exit {agent.returncode} "
        f"{time.monotonic() - started:.2f} s after the signal"
    )


@pytest.mark.parametrize(
    "how", [["--shutdown-timeout", "2"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"}], ids=["option", "environment"]
)
def test_workers_that_ignore_the_stop_signal_are_killed_after_theshutdown_timeout(tmp_path, how):
    import psutil

    options, env = (how, {}) if isinstance(how, list) else ([], how)
    agent = subprocess.Popen(
        [tool("elastic-run"), "--standalone", "--nproc-per-node", "2", *options, SIGNALLED, str(tmp_path), "--stay"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**{k: v for k, v in os.environ.items() if k != "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}, **env},
    )
    try:
        wait_for(lambda: all((tmp_path / f"{r}.ready").exists() for r in (0, 1)), 30, what="both workers ready")
        pids = [int((tmp_path / f"{r}.ready").read_text()) for r in (0, 1)]
        workers = [psutil.Process(pid) for pid in pids]
        started = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        wait_for(lambda: all((tmp_path / f"{r}.signal").exists() for r in (0, 1)), 5, what="SIGTERM to reach both")
        _, alive = psutil.wait_procs(workers, timeout=10)
        killed_after = time.monotonic() - started
        _, err = agent.communicate(timeout=20)
    finally:
        agent.kill()
    assert not alive, "a worker that ignores SIGTERM outlived the shutdown timeout"
    assert [(tmp_path / f"{r}.signal").read_text() for r in (0, 1)] == ["SIGTERM", "SIGTERM"]
    assert 2.0 <= killed_after <= 3.5, f"SIGKILL came {killed_after:.2f} s after SIGTERM (timeout 2 s)"
    assert agent.returncode == 128 + signal.SIGTERM, err
    print(f"\nworkers that ignore SIGTERM: SIGKILLed {killed_after:.2f} s after it (shutdown timeout 2 s, {how})")


def test_the_shutdown_timeout_is_30_s_unless_set_as_torchrun(monkeypatch):
    from launcher.options.values import shutdown_timeout

    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert shutdown_timeout(None) == 30.0
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7")
    assert shutdown_timeout(None) == 7.0
    assert shutdown_timeout(3.0) == 3.0


def test_event_log_handler_console_prints_each_event_as_a_json_object(tmp_path):
    result = run(["--standalone", "--event-log-handler", "console", "--nproc-per-node", "1", PROBE, str(tmp_path)])
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    names = [e["name"] for e in events]
    assert "elastic.round_frozen" in names and "elastic.node_left" in names
    assert all(
        e["source"] == "AGENT" and isinstance(e["timestamp"], int) and "run_round" in e["metadata"] for e in events
    )
    quiet = run(["--standalone", "--nproc-per-node", "1", PROBE, str(tmp_path)])  # null: none
    assert not [line for line in quiet.stderr.splitlines() if line.startswith("{")]


@pytest.fixture
def logs_specs_plugin(tmp_path, monkeypatch):
    """A LogsSpecs class registered as entry point ``flat`` of group torchrun.logs_specs."""
    pytest.importorskip("torch")
    site = tmp_path / "site"
    package = site / "flatlogs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent('''
        import os
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs


        class FlatLogs(DefaultLogsSpecs):
            """torch's default layout, plus a marker file naming each attempt it was asked about."""

            def reify(self, envs):
                dest = super().reify(envs)
                with open(os.path.join(self.root_log_dir, "asked"), "a") as handle:
                    handle.write(envs[0]["TORCHELASTIC_RESTART_COUNT"] + "\\n")
                return dest
    ''')
    )
    info = site / "flatlogs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flatlogs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torchrun.logs_specs]\nflat = flatlogs:FlatLogs\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return site


def test_logs_specs_uses_the_named_entry_points_layout(tmp_path, logs_specs_plugin):
    logs = tmp_path / "logs"
    result = run(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--logs-specs",
            "flat",
            "--log-dir",
            str(logs),
            "--redirects",
            "3",
            PROBE,
            str(tmp_path),
        ],
        env={"PYTHONPATH": os.environ["PYTHONPATH"]},
    )
    assert result.returncode == 0, result.stderr
    assert "worker rank" not in result.stdout  # redirected by the class's own rules
    (asked,) = logs.rglob("asked")
    assert asked.read_text() == "0\n"
    for rank in (0, 1):  # torch's DefaultLogsSpecs layout: <log dir>/<run id>_<random>/attempt_0/<rank>/
        (out,) = logs.rglob(f"attempt_0/{rank}/stdout.log")
        assert f"worker rank {rank} of 2" in out.read_text()
    for rank, record in records(str(tmp_path)).items():  # the error file the class chose, exported to the worker
        assert record["env"]["TORCHELASTIC_ERROR_FILE"] == str(next(logs.rglob(f"attempt_0/{rank}")) / "error.json")
