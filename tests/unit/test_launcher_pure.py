"""The launcher's pure parts: option parsing, log routing, error files, summaries, progress lines."""

from __future__ import annotations

import json
import os
import sys

import pytest

import elastic
from launcher.agent import progress_line
from launcher.errorfile import read_error, write_error
from launcher.errors import UsageError
from launcher.logs import STDERR, STDOUT, parse_ranks_filter, parse_std, plan_stream
from launcher.options import NodeRange, parse_nnodes, parse_nproc_per_node, parse_rdzv_backend, worker_argv
from launcher.summary import failure_summary
from launcher.workers import GroupState, GroupStatus, WorkerFailure
from rendezvous.handler import Progress


@pytest.mark.parametrize("text,expected", [("1", (1, 1)), ("4", (4, 4)), ("2:3", (2, 3)), (" 1:8 ", (1, 8))])
def test_nnodes(text, expected):
    assert parse_nnodes(text) == NodeRange(*expected)


@pytest.mark.parametrize("text", ["0", "3:2", "abc", "1:", ":2", "-1", "1:2:3", "1.5"])
def test_bad_nnodes(text):
    with pytest.raises(UsageError):
        parse_nnodes(text)


def test_gpus_are_the_installed_ones_that_cuda_visible_devices_shows():
    from launcher.options import _gpu_count

    assert _gpu_count(4, None) == 4
    assert _gpu_count(4, "0,1") == 2
    assert _gpu_count(2, "0,1,2") == 2, "CUDA stops at the first device that does not exist"
    assert _gpu_count(0, "0,1,2") == 0
    assert _gpu_count(4, "1,-1,2") == 1 and _gpu_count(4, "") == 0
    assert _gpu_count(2, "GPU-aaaa,GPU-bbbb,GPU-cccc") == 2


def test_nproc_per_node(monkeypatch):
    assert parse_nproc_per_node("3") == 3
    assert parse_nproc_per_node("cpu") == len(os.sched_getaffinity(0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")  # this machine has no GPU: nothing is visible
    assert parse_nproc_per_node("auto") == len(os.sched_getaffinity(0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert parse_nproc_per_node("auto") == len(os.sched_getaffinity(0))
    with pytest.raises(UsageError, match="no GPU"):
        parse_nproc_per_node("gpu")
    for bad in ("0", "many", "-2"):
        with pytest.raises(UsageError):
            parse_nproc_per_node(bad)


def test_rdzv_backend_names():
    assert parse_rdzv_backend("etcd") == parse_rdzv_backend("ETCD-V3") == "etcd-v3"
    with pytest.raises(UsageError, match="c10d"):
        parse_rdzv_backend("c10d")


def test_worker_argv_like_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert worker_argv(str(script), ["--lr", "1"], python="py") == ["py", "-u", str(script), "--lr", "1"]
    assert worker_argv("pkg.train", ["x"], module=True, python="py") == ["py", "-u", "-m", "pkg.train", "x"]
    assert worker_argv("true", ["a"], no_python=True) == ["true", "a"]
    run_path = worker_argv(str(script), ["a"], run_path=True, python="py")
    assert run_path[:3] == ["py", "-u", "-c"] and run_path[4:] == [str(script), "a"]
    with pytest.raises(UsageError, match="does not exist"):
        worker_argv(str(tmp_path / "missing.py"), [])


def test_redirect_and_tee_values():
    assert parse_std("3", "-r") == 3 and parse_std(None, "-r") == 0
    assert parse_std("0:1,1:2", "-t") == {0: 1, 1: 2}
    for bad in ("4", "x", "0:9", "a:1", "0:"):
        with pytest.raises(UsageError):
            parse_std(bad, "--tee")
    assert parse_ranks_filter("0, 2") == frozenset({0, 2}) and parse_ranks_filter("") is None


def test_stream_routing():
    # redirect: file only; tee: console and file; filter: hides from the console only
    assert plan_stream(0, STDOUT, 1, 0, None) == plan_stream(0, STDOUT, 3, 0, None)
    assert plan_stream(0, STDOUT, 1, 0, None).console is False and plan_stream(0, STDOUT, 1, 0, None).file
    assert plan_stream(0, STDERR, 1, 0, None).console and not plan_stream(0, STDERR, 1, 0, None).file
    teed = plan_stream(1, STDERR, 0, {1: 2}, None)
    assert teed.console and teed.file
    assert not plan_stream(2, STDERR, 0, {1: 2}, None).file
    hidden = plan_stream(3, STDOUT, 0, 3, frozenset({0}))
    assert not hidden.console and hidden.file


def test_error_file_round_trip_in_torchs_layout(tmp_path):
    path = str(tmp_path / "deep" / "error.json")
    try:
        raise KeyError("missing")
    except KeyError as exc:
        write_error(exc, path)
    with open(path) as handle:
        data = json.load(handle)
    assert set(data) == {"message"} and set(data["message"]) == {"message", "extraInfo"}
    assert set(data["message"]["extraInfo"]) == {"py_callstack", "timestamp"}
    assert isinstance(data["message"]["extraInfo"]["timestamp"], str)
    record = read_error(path)
    assert record.message == "KeyError: 'missing'" and "raise KeyError" in record.traceback and record.timestamp > 0


def test_error_file_older_layout_and_garbage(tmp_path):
    older = tmp_path / "old.json"
    older.write_text(json.dumps({"message": "Segfault", "timestamp": 1700000000}))
    assert read_error(str(older)).message == "Segfault"
    garbage = tmp_path / "bad.json"
    garbage.write_text("Fatal Python error: Segmentation fault\n")
    assert read_error(str(garbage)) is None and read_error(str(tmp_path / "none.json")) is None


def test_record_writes_the_exception_and_re_raises(tmp_path, monkeypatch):
    path = tmp_path / "err.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @elastic.record
    def work():
        raise RuntimeError("lost the plot")

    with pytest.raises(RuntimeError):
        work()
    assert read_error(str(path)).message == "RuntimeError: lost the plot"

    @elastic.record
    def quits():
        sys.exit(0)

    path.unlink()
    with pytest.raises(SystemExit):
        quits()
    assert not path.exists()  # a clean exit is not an error


def test_failure_summary_names_the_first_failure():
    from launcher.errorfile import ErrorRecord

    late = WorkerFailure(0, 4, -9, "h1", 200.0, "/e0", None)
    early = WorkerFailure(1, 5, 3, "h1", 100.0, "/e1", ErrorRecord("ValueError: x", "Traceback\n  line\nValueError: x", 100))
    text = failure_summary(GroupStatus(GroupState.FAILED, (late, early)), "job", 2, 2)
    lines = text.splitlines()
    assert lines[0] == "worker group of job 'job' failed after 2 of 2 restarts"
    assert lines[1] == "  first failure: rank 5 (local rank 1) on h1"
    assert lines[2].startswith("  exit code 3 at ")
    assert "  also failed: rank 4" in lines and "  error: ValueError: x" in lines
    assert lines[-1] == "    ValueError: x"
    signal_only = failure_summary(GroupStatus(GroupState.FAILED, (late,)), "job", 0, 0)
    assert "killed by SIGKILL" in signal_only and "no error file at /e0" in signal_only


def test_progress_line():
    assert progress_line(Progress(1, 2, 3, 4, 4.2)) == "round 1: 2/4 nodes joined (min 3, max 4), last call in 4 s"
    assert progress_line(Progress(2, 1, 3, 3, None)) == "round 2: 1/3 nodes joined (min 3, max 3), waiting for 2 more"


def test_worker_env_view(monkeypatch):
    for name in list(os.environ):
        if name.startswith("TORCHELASTIC") or name in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    assert not elastic.is_torchelastic_launched()
    with pytest.raises(elastic.NotLaunchedError, match="TORCHELASTIC_RUN_ID is not set"):
        elastic.WorkerEnv.from_environ()
    from launcher.env import WorkerSpec, worker_env

    env = worker_env(WorkerSpec(1, 2, 2, 4, 1, 2, "h", 29500, "job", 1, 3, "/e.json"), {})
    view = elastic.WorkerEnv.from_environ(env)
    assert (view.rank, view.local_rank, view.world_size, view.group_rank, view.restart_count) == (3, 1, 4, 1, 1)
    assert view.use_agent_store is False and view.error_file == "/e.json" and view.master_port == 29500
    with pytest.raises(elastic.NotLaunchedError, match="RANK='x' is not a number"):
        elastic.WorkerEnv.from_environ({**env, "RANK": "x"})
