"""The launcher's pure parts: option parsing, log routing, error files, summaries, progress lines."""

from __future__ import annotations

import json
import math
import os
import socket
import sys

import pytest

import elastic
from launcher.errors import UsageError
from launcher.options.values import (
    NodeRange,
    expand_abbreviations,
    parse_filters,
    parse_nnodes,
    parse_nproc_per_node,
    parse_ranks_filter,
    parse_rdzv_backend,
    parse_std,
    worker_argv,
)
from launcher.output.console import PROGRESS_EVERY, progress_line, should_say
from launcher.output.pump import _Source
from launcher.output.streams import STDOUT, StreamPlan, line_prefix, plan_stream
from launcher.restart import failure_summary
from launcher.signals import parse_signals
from launcher.workers.env import virtual_device
from launcher.workers.errorfile import read_error, write_error
from launcher.workers.group import GroupState, GroupStatus, WorkerFailure
from rendezvous.rounds.join import Progress


@pytest.mark.parametrize("text,expected", [("1", (1, 1)), ("4", (4, 4)), ("2:3", (2, 3)), (" 1:8 ", (1, 8))])
def test_nnodes(text, expected):
    assert parse_nnodes(text) == NodeRange(*expected)


@pytest.mark.parametrize("text", ["0", "3:2", "abc", "1:", ":2", "-1", "1:2:3", "1.5"])
def test_bad_nnodes(text):
    with pytest.raises(UsageError):
        parse_nnodes(text)


def test_gpus_are_the_installed_ones_that_cuda_visible_devices_shows():
    from launcher.options.values import _gpu_count

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
    assert parse_rdzv_backend("c10d") == "c10d"  # torchrun's lines as they are (launcher.hosted)
    with pytest.raises(UsageError, match="static rendezvous needs"):
        parse_rdzv_backend("static")


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


@pytest.mark.parametrize(
    "redirects,tee,shown,expected",
    [
        (0, 0, None, StreamPlan(console=True, prefixed=False, file=None)),  # verbatim, as torchrun
        (1, 0, None, StreamPlan(console=False, prefixed=False, file="f")),  # redirected: file only
        (0, 1, None, StreamPlan(console=True, prefixed=True, file="f")),  # teed: file and console, prefixed
        (3, 3, None, StreamPlan(console=True, prefixed=True, file="f")),  # tee wins over redirects
        (2, 0, None, StreamPlan(console=True, prefixed=False, file=None)),  # stderr redirected, stdout not
        (0, 0, frozenset({1}), StreamPlan(console=False, prefixed=False, file=None)),  # filtered out: nowhere
        (0, 1, frozenset({1}), StreamPlan(console=False, prefixed=True, file="f")),  # filtered: file still written
        ({0: 1}, {1: 1}, None, StreamPlan(console=False, prefixed=False, file="f")),  # per local rank
    ],
)
def test_stream_routing_is_torchs(redirects, tee, shown, expected):
    assert plan_stream(0, STDOUT, redirects, tee, shown, "f") == expected


def test_prefixes_and_filters():
    assert line_prefix(None, "default", 5, 1) == "[default1]:"
    assert line_prefix("[${role_name}:${rank}/${local_rank}] ", "trainer", 5, 1) == "[trainer:5/1] "
    assert line_prefix("${unknown}|${rank}", "r", 2, 0) == "${unknown}|2"  # torch's safe_substitute
    host = socket.gethostname()
    assert line_prefix("${hostname}:${rank}: ", "r", 3, 1) == f"{host}:3: "  # torch 2.14's macro
    assert parse_filters("") == () and parse_filters("apple,orange") == ("apple", "orange")
    assert parse_filters("a,,b,c") == ("a,b", "c")  # torchrun: a double comma is a comma


def test_a_teed_source_copies_matching_lines_with_their_prefix(tmp_path):
    import io

    read_end, write_end = os.pipe()

    class Kept(io.BytesIO):
        def close(self):  # the source closes its log file at the end; keep what it got
            self.kept = self.getvalue()
            super().close()

    console, log, duplicate = io.BytesIO(), Kept(), io.BytesIO()
    source = _Source(read_end, b"[default0]:", console, log, (duplicate, (b"loss",)))
    source.feed(b"step 1 loss=3\nstep 2")
    source.feed(b" no\npartial loss")
    os.close(write_end)
    source.finish()
    assert log.kept == b"step 1 loss=3\nstep 2 no\npartial loss"
    assert console.getvalue() == b"[default0]:step 1 loss=3\n[default0]:step 2 no\n[default0]:partial loss\n"
    assert duplicate.getvalue() == b"[default0]:step 1 loss=3\n[default0]:partial loss\n"


def test_a_verbatim_source_passes_partial_lines_through_unchanged():
    import io

    read_end, write_end = os.pipe()
    console = io.BytesIO()
    source = _Source(read_end, b"", console, None)
    source.feed(b"10%\r")
    assert console.getvalue() == b"10%\r"  # a progress bar is shown as it is drawn
    source.feed(b"20%\rdone\n")
    os.close(write_end)
    source.finish()
    assert console.getvalue() == b"10%\r20%\rdone\n"


OPTIONS = {
    "--nnodes": "nnodes",
    "--nproc-per-node": "nproc",
    "--nproc_per_node": "nproc",
    "--no-python": "np",
    "--no_python": "np",
    "--redirects": "redirects",
    "-r": "redirects",
    "-m": "module",
    "--module": "module",
    "--rdzv-id": "rdzv_id",
    "--rdzv-conf": "rdzv_conf",
    "--help": "help",
}
VALUED = {"--nnodes", "--nproc-per-node", "--nproc_per_node", "--redirects", "-r", "--rdzv-id", "--rdzv-conf"}


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--nproc", "2", "s.py"], ["--nproc-per-node", "2", "s.py"]),  # both spellings of one option: unique
        (["--redirect=3", "s.py"], ["--redirects=3", "s.py"]),
        (
            ["--nn", "1", "--rdzv-i", "x", "s.py", "--nproc", "7"],
            ["--nnodes", "1", "--rdzv-id", "x", "s.py", "--nproc", "7"],
        ),
        (["-r", "--nproc", "s.py"], ["-r", "--nproc", "s.py"]),  # a value that looks like an option stays a value
        (["-m", "--he"], ["-m", "--help"]),
        (["--nothing", "s.py"], ["--nothing", "s.py"]),  # unknown: the parser refuses it
        (["--", "--nproc"], ["--", "--nproc"]),
    ],
)
def test_unique_prefixes_expand_as_argparse_does(argv, expected):
    assert expand_abbreviations(argv, OPTIONS, VALUED) == expected


@pytest.mark.parametrize(
    "argv,named", [(["--n", "2", "s.py"], "--nnodes, --no-python"), (["--rdzv", "x", "s.py"], "--rdzv-conf, --rdzv-id")]
)
def test_an_ambiguous_prefix_is_one_error_naming_the_candidates(argv, named):
    with pytest.raises(UsageError, match=f"ambiguous option: {argv[0]} could match {named}"):
        expand_abbreviations(argv, OPTIONS, VALUED)


def test_signals_to_handle():
    import signal

    assert parse_signals("SIGTERM, SIGUSR1,SIGTERM") == (signal.SIGTERM, signal.SIGUSR1)
    for bad in ("SIGKILL", "SIGNOPE", "TERM", "", "SIG_IGN"):
        with pytest.raises(UsageError, match="--signals-to-handle"):
            parse_signals(bad)


def test_virtual_local_rank_gives_each_worker_one_device_as_torch():
    assert virtual_device(1, None) == "1"
    assert virtual_device(1, "4, 6,7") == "6"
    with pytest.raises(ValueError):
        virtual_device(3, "4,6")


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
    from launcher.workers.errorfile import ErrorRecord

    late = WorkerFailure(0, 4, -9, "h1", 200.0, "/e0", None)
    early = WorkerFailure(
        1, 5, 3, "h1", 100.0, "/e1", ErrorRecord("ValueError: x", "Traceback\n  line\nValueError: x", 100)
    )
    text = failure_summary(GroupStatus(GroupState.FAILED, (late, early)), "job", 2, 2)
    lines = text.splitlines()
    assert lines[0] == "worker group of job 'job' failed after 2 of 2 restarts"
    assert lines[1] == "  first failure: rank 5 (local rank 1) on h1"
    assert lines[2].startswith("  exit code 3 at ")
    assert "  also failed: rank 4" in lines and "  error: ValueError: x" in lines
    assert lines[-1] == "    ValueError: x"
    signal_only = failure_summary(GroupStatus(GroupState.FAILED, (late,)), "job", 0, 0)
    assert "rank 4 was killed by SIGKILL: a signal leaves no error file nor traceback" in signal_only
    assert "@elastic.record" not in signal_only  # no decorator helps a signal
    exited = WorkerFailure(0, 4, 2, "h1", 200.0, "/e0", None)
    assert "rank 4 wrote no error file: decorate" in failure_summary(
        GroupStatus(GroupState.FAILED, (exited,)), "j", 0, 0
    )
    assert "/e0" not in signal_only  # a path in the run's log directory, which may be gone when this is read


def test_progress_line():
    assert progress_line(Progress(1, 2, 3, 4, 4.2)) == "round 1: 2/4 nodes joined (min 3, max 4), last call in 4 s"
    assert progress_line(Progress(2, 1, 3, 3, None)) == "round 2: 1/3 nodes joined (min 3, max 3), waiting for 2 more"
    assert (
        progress_line(Progress(2, 1, 3, 3, None, 575.4))
        == "round 2: 1/3 nodes joined (min 3, max 3), waiting for 2 more, join timeout in 575 s"
    )


def test_the_progress_line_names_the_nodes_a_full_round_waits_for_and_a_spare_sees_the_running_round():
    full = Progress(2, 3, 2, 3, None, 590.0, stopping=("c",))
    assert progress_line(full) == (
        "round 2: 3/3 nodes joined (min 2, max 3), waiting for c to stop the workers of the round before"
    )
    spare = Progress(2, 0, 2, 3, None, 590.0, running=3)
    assert progress_line(spare) == "round 2: waiting for a place; round 1 runs with 3/3 nodes (min 2, max 3)"
    assert should_say(full, Progress(2, 3, 2, 3, None).key, 0.5)  # the round started to wait for c


def test_the_progress_line_names_a_silent_node_and_when_its_lease_runs_out():
    """A dead machine's node key lives until its lease runs out: the round waits for it, and says so."""
    silent = Progress(2, 2, 2, 3, 27.0, 590.0, silent=(("node-b", 11.6),))
    assert progress_line(silent) == (
        "round 2: 2/3 nodes joined (min 2, max 3), waiting for node-b (silent: its lease runs out in 12 s), "
        "last call in 27 s"
    )
    both = Progress(2, 3, 2, 4, None, 590.0, stopping=("node-b", "node-c"), silent=(("node-b", 3.0),))
    assert progress_line(both) == (
        "round 2: 3/4 nodes joined (min 2, max 4), waiting for node-b (silent: its lease runs out in 3 s), "
        "waiting for node-c to stop the workers of the round before"
    )
    assert should_say(silent, Progress(2, 2, 2, 3, 28.0, 590.0).key, 0.5)  # it went silent: news
    stayer = Progress(2, 0, 2, 3, None, 590.0, running=3, stayer=True)
    assert progress_line(stayer) == "round 2: waiting for the coordinator; round 1 ran with 3/3 nodes (min 2, max 3)"
    dead = Progress(2, 0, 2, 3, None, 590.0, running=3, stayer=True, silent=(("n1", 9.2),), coordinator="n1")
    assert progress_line(dead) == (
        "round 2: waiting for n1 (the coordinator, silent: its lease runs out in 9 s); round 1 ran with 3/3 nodes "
        "(min 2, max 3)"
    )


def test_progress_is_said_when_the_nodes_change_or_the_last_call_begins_else_every_10_s():
    waiting, last_call = Progress(1, 1, 3, 4, None, 590.0), Progress(1, 3, 3, 4, 29.0)
    assert should_say(waiting, None, math.inf)  # the first look
    assert not should_say(waiting, waiting.key, 1.0) and not should_say(waiting, waiting.key, PROGRESS_EVERY - 0.1)
    assert should_say(waiting, waiting.key, PROGRESS_EVERY)  # nothing changed for 10 s: say it again
    assert should_say(Progress(1, 2, 3, 4, None), waiting.key, 0.5)  # a node came
    assert should_say(last_call, Progress(1, 2, 3, 4, None).key, 0.5)  # the last call began
    assert not should_say(last_call, Progress(1, 3, 3, 4, 28.0).key, 1.0)  # a second later: the countdown is not news


def test_worker_env_view(monkeypatch):
    for name in list(os.environ):
        if name.startswith("TORCHELASTIC") or name in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    assert not elastic.is_torchelastic_launched()
    with pytest.raises(elastic.NotLaunchedError, match="TORCHELASTIC_RUN_ID is not set"):
        elastic.WorkerEnv.from_environ()
    from launcher.workers.env import WorkerSpec, worker_env

    env = worker_env(WorkerSpec(1, 2, 2, 4, 1, 2, "h", 29500, "job", 1, 3, "/e.json"), {})
    view = elastic.WorkerEnv.from_environ(env)
    assert (view.rank, view.local_rank, view.world_size, view.group_rank, view.restart_count) == (3, 1, 4, 1, 1)
    assert view.use_agent_store is False and view.error_file == "/e.json" and view.master_port == 29500
    with pytest.raises(elastic.NotLaunchedError, match="RANK='x' is not a number"):
        elastic.WorkerEnv.from_environ({**env, "RANK": "x"})


def _two_socket_machine(gpu_nodes=()):
    from launcher.workers.numa import Topology

    # 2 sockets x 1 NUMA node each, 4 cores x 2 threads per node; sibling of cpu c is c + 16;
    # two last-level caches per node (cores 0-1 and 2-3 of each node)
    nodes = {0: frozenset([0, 1, 2, 3, 16, 17, 18, 19]), 1: frozenset([4, 5, 6, 7, 20, 21, 22, 23])}
    cpus = sorted(set().union(*nodes.values()))
    socket_of = {c: 0 if c in nodes[0] else 1 for c in cpus}
    core_of = {c: c % 16 for c in cpus}
    cache_of = {c: (c % 16) // 2 * 2 for c in cpus}
    return Topology(nodes, socket_of, core_of, cache_of, tuple(gpu_nodes))


def test_numa_modes_pick_torchs_cpus():
    from launcher.workers.numa import binding_commands, cpus_for

    machine = _two_socket_machine(gpu_nodes=(0, 0, 1, 1))
    assert cpus_for("node", 2, 4, machine) == machine.nodes[1]  # GPU 2 sits on node 1
    assert cpus_for("socket", 0, 4, machine) == machine.nodes[0]
    # exclusive: node 0's 4 physical cores split between its 2 workers, with their siblings
    assert cpus_for("exclusive", 0, 4, machine) == frozenset([0, 1, 16, 17])
    assert cpus_for("exclusive", 1, 4, machine) == frozenset([2, 3, 18, 19])
    assert cpus_for("core-complex", 3, 4, machine) == frozenset([6, 7, 22, 23])
    commands, line = binding_commands("node", 2, _two_socket_machine())  # no GPU: round robin over nodes
    assert commands == {0: ("taskset", "-c", "0-3,16-19"), 1: ("taskset", "-c", "4-7,20-23")} and line is None


def test_numa_binding_on_one_node_is_a_no_op_said_once():
    from launcher.workers.numa import Topology, binding_commands

    commands, line = binding_commands("exclusive", 2, Topology({0: frozenset([0, 1])}))
    assert (
        commands == {} and line == "--numa-binding exclusive: this machine has one NUMA node; the workers are not bound"
    )
    with pytest.raises(UsageError, match="physical cores"):
        from launcher.workers.numa import cpus_for

        cpus_for("exclusive", 0, 9, _two_socket_machine())


def test_status_of_a_job_forming_its_next_round_does_not_show_the_last_rounds_world_as_its_own():
    from launcher.cli.ctl import render
    from rendezvous.rounds.view import JobView, NodeView

    nodes = (NodeView("n1", None, "10.0.0.1", 2, True),)
    forming = JobView("j", "joining", 2, 4, "10.0.0.1", 29500, 1, 3, nodes, outcome="joining")
    assert render(forming, heartbeats=False).splitlines()[0] == (
        "job j: joining, round 2 forming (round 1 ran with world size 4, master 10.0.0.1:29500) "
        "(nodes min 1, max 3), restarts 0/0"
    )
    first = JobView("j", "joining", 1, 0, "", 0, 1, 3, nodes, outcome="joining")
    assert "round 1 forming (none ran yet)" in render(first, heartbeats=False)
    running = JobView("j", "running", 2, 4, "10.0.0.1", 29500, 1, 3, nodes, outcome="running")
    assert render(running).startswith("job j: running, round 2, world size 4, master 10.0.0.1:29500 (nodes min 1")
