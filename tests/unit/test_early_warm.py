"""The warm interpreter started from the command line as typed (``launcher.cli.early``): which lines
start one, what it imports and in which environment, and the agent's adoption of it -- the same
imports in the same environment, else it is stopped and another started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from launcher.cli.early import _scan, read_line, start_early_warm
from launcher.warmstart.interpreter import WarmStarter, warm_starter
from launcher.warmstart.priority import may_raise, raisable


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import json\n")  # imports nothing heavy: only --preload makes a warm interpreter
    return str(path)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--nproc-per-node", "2", "s.py", "--lr", "1"], ({"nproc_per_node": "2"}, "s.py", ["--lr", "1"])),
        (["--nproc_per_node=2", "--no-warm-start", "s.py"], ({"nproc_per_node": "2", "warm_start": False}, "s.py", [])),
        (["-m", "--preload", "a,b", "pkg.main"], ({"module": True, "preload": "a,b"}, "pkg.main", [])),
        (["--standalone", "--", "s.py", "-x"], ({"standalone": True}, "s.py", ["-x"])),
        (["--nproc", "2", "s.py"], None),  # an abbreviation: argparse's rules are the parser's, not read here
        (["--no-such-option", "s.py"], None),
        (["--nproc-per-node"], None),  # no value, no script
        (["--standalone"], None),
        (["--standalone=1", "s.py"], None),  # a flag does not take a value
    ],
)
def test_the_line_is_read_with_the_option_table_alone(argv, expected):
    assert _scan(argv) == expected


def test_a_plain_line_starts_the_interpreter_with_what_the_agent_will_ask_for(script):
    environ = {"PATH": os.environ["PATH"], "KEEP": "1"}
    early = start_early_warm(
        read_line(["--nproc-per-node", "2", "--preload", "decimal", script, "--epochs", "3"], environ)
    )
    try:
        assert early is not None and early.preload == ("decimal",)
        config = SimpleNamespace(
            warm_start=True,
            argv=[sys.executable, "-u", script, "--epochs", "3"],
            cpu_binding={},
            preload=("decimal",),
            nproc_per_node=2,
        )
        # The agent's environment holds what the launcher exports to the workers: no difference.
        exported = {**environ, "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM"}
        said: list[str] = []
        assert warm_starter(config, exported, said.append, early=early) is early
        assert early.can_start() and not said
    finally:
        if early is not None:
            early.close()


@pytest.mark.parametrize(
    "change",
    ["preload", "one worker", "environment"],
)
def test_an_interpreter_started_for_something_else_is_stopped_and_another_started(script, change):
    environ = {"PATH": os.environ["PATH"]}
    early = start_early_warm(read_line(["--nproc-per-node", "2", "--preload", "decimal", script], environ))
    assert early is not None
    config = SimpleNamespace(
        warm_start=True,
        argv=[sys.executable, "-u", script],
        cpu_binding={},
        preload=("fractions",) if change == "preload" else ("decimal",),
        nproc_per_node=1 if change == "one worker" else 2,  # no OMP_NUM_THREADS=1 for a lone worker
    )
    agents = {**environ, "CUDA_VISIBLE_DEVICES": "1"} if change == "environment" else environ
    started = warm_starter(config, agents, lambda line: None, early=early)
    try:
        assert started is not None and started is not early
        early._process.wait(timeout=10)  # stopped, not left to import on
        assert started.can_start()
    finally:
        started.close()


def test_no_early_start_where_the_agent_would_start_none_or_could_not_tell(script, tmp_path):
    env = {"PATH": os.environ["PATH"]}
    lines = [
        ["--no-warm-start", "--preload", "decimal", script],
        ["--no-python", "--preload", "decimal", script],
        ["--run-path", "--preload", "decimal", script],
        ["--numa-binding", "node", "--preload", "decimal", script],
        ["--preload", "decimal", str(tmp_path / "missing.py")],
        [script],  # nothing heavy imported, nothing preloaded: a fresh interpreter is as quick
    ]
    for argv in lines:
        assert start_early_warm(read_line(argv, env)) is None, argv
    assert start_early_warm(read_line(["--preload", "decimal", script], {**env, "PET_WARM_START": "0"})) is None
    assert start_early_warm(read_line(["--preload", "decimal", script], {**env, "PET_NO_PYTHON": "1"})) is None


def test_an_agent_with_warm_starts_off_stops_the_early_interpreter(script):
    early = start_early_warm(read_line(["--preload", "decimal", script], {"PATH": os.environ["PATH"]}))
    assert early is not None
    config = SimpleNamespace(
        warm_start=False, argv=[sys.executable, "-u", script], cpu_binding={}, preload=(), nproc_per_node=1
    )
    assert warm_starter(config, {"PATH": os.environ["PATH"]}, lambda line: None, early=early) is None
    assert early._process.wait(timeout=10) is not None


def _nices(pid: int) -> set[int]:
    """The nice value of each of the process's threads (/proc's stat, field 19)."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                found.add(int(handle.read().rsplit(")", 1)[1].split()[16]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _slow_import(directory) -> None:
    """``slowimport``, a module whose import takes 3 s of its thread's own CPU: it lasts however busy
    the machine is (a wall-clock loop ended unseen in CI)."""
    slow = "import time\nend = time.thread_time() + 3\nwhile time.thread_time() < end:\n    pass\n"
    (directory / "slowimport.py").write_text(slow)


def _importing_thread_started(pid: int) -> None:
    """Wait (30 s at most: the interpreter's own start first, seconds on a busy machine) until the
    interpreter ``pid`` has a second thread, its importing one."""
    deadline = time.monotonic() + 30
    while len(os.listdir(f"/proc/{pid}/task")) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(os.listdir(f"/proc/{pid}/task")) >= 2, "the importing thread did not start"


def test_its_imports_run_at_the_lowest_priority_until_workers_are_asked_for(script, tmp_path):
    """Where agents share a machine, their own start and the rendezvous come first."""
    if not may_raise():
        pytest.skip("here a priority cannot be raised again: the interpreter is not lowered (tested below)")
    _slow_import(tmp_path)
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    early = start_early_warm(read_line(["--preload", "slowimport", script], environ))
    assert early is not None
    try:
        deadline = time.monotonic() + 30  # the interpreter's own start comes first (seconds, on a busy machine)
        while 19 not in _nices(early.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert 19 in _nices(early.pid), _nices(early.pid)
    finally:
        early.close()


def test_the_priority_is_changed_from_the_agent_even_while_the_imports_hold_the_interpreter(tmp_path):
    """A lowered importing thread that holds the GIL (here: a regular expression's long match, which
    never lets it go) keeps the interpreter's main thread from taking a Priority message; under load
    that left a spare called into a round, or an early interpreter, importing at nice 19 for 50 s.
    The agent sets the importing thread's priority itself."""
    (tmp_path / "gilheld.py").write_text("import re\nre.match(r'(a+)+$', 'a' * 27 + 'b')\n")
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    starter = WarmStarter(("gilheld",), environ, lambda line: None)
    try:
        _importing_thread_started(starter.pid)
        time.sleep(0.3)  # and inside the match
        for wanted, change in ((19, starter.background), (0, starter.foreground)):
            change()
            time.sleep(0.2)
            assert _nices(starter.pid) == {0, wanted}, (wanted, _nices(starter.pid))
    finally:
        starter.close()


_WITHOUT_SYS_NICE = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"]  # util-linux's
_EARLY_CHILD = """
import os, sys
from launcher.cli.early import read_line, start_early_warm
environ = {"PATH": os.environ["PATH"], "PYTHONPATH": sys.argv[2]}
early = start_early_warm(read_line(["--preload", "slowimport", sys.argv[1]], environ))
print(early.pid, flush=True)
sys.stdin.read()  # until the test has looked
early.close()
"""


_ROOTED = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}


def _may_raise_in(prefix: list[str]) -> bool:
    code = "from launcher.warmstart.priority import may_raise; print(may_raise())"
    done = subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_ROOTED
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"


@pytest.fixture
def capless():
    """A command prefix that drops CAP_SYS_NICE (root can; setpriv is util-linux's)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("dropping CAP_SYS_NICE takes root and util-linux's setpriv")
    return _WITHOUT_SYS_NICE


def test_a_process_may_raise_a_priority_again_only_with_cap_sys_nice(capless):
    assert _may_raise_in(capless) is False


@pytest.mark.parametrize(
    ("capabilities", "limit", "nice", "expected"),
    [
        (1 << 23, 0, 0, True),  # CAP_SYS_NICE
        ((1 << 40) - 1 - (1 << 23), 0, 0, False),  # every capability but it (root in a container)
        (0, 0, 0, False),  # a user's default: no raise at all
        (0, 20, 0, True),  # RLIMIT_NICE 20: down to nice 0
        (0, 15, 0, False),  # down to 5 only
        (0, 15, 5, True),  # a process started at nice 5
        (0, None, 0, True),  # unlimited
    ],
)
def test_raising_a_priority_again_takes_cap_sys_nice_or_an_rlimit_that_reaches_the_process_s_own(
    capabilities, limit, nice, expected
):
    assert raisable(capabilities, limit, nice) is expected


def test_where_priorities_cannot_be_raised_again_the_early_interpreter_imports_at_its_own(capless, script, tmp_path):
    """Lowered there, a node's first workers would wait on imports at nice 19 for good."""
    _slow_import(tmp_path)
    child = subprocess.Popen(
        [*capless, sys.executable, "-c", _EARLY_CHILD, script, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_ROOTED,
    )
    try:
        pid = int(child.stdout.readline())
        _importing_thread_started(pid)
        time.sleep(0.5)  # a Priority message, had one been sent, is taken by now
        assert _nices(pid) == {0}, _nices(pid)
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_the_line_read_once_says_standalone_from_its_options_only():
    assert read_line(["--standalone", "--nproc-per-node", "2", "train.py"], {}).standalone
    assert not read_line(["train.py", "--standalone"], {}).standalone  # the script's own argument
    assert read_line(["train.py"], {"PET_STANDALONE": "1"}).standalone
    assert read_line(["--nproc", "2", "train.py"], {}) is None  # an abbreviation: the CLI reads it alone
