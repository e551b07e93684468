"""rendezvous.processes: a child started with ``die_with_parent`` dies with the process that started
it -- also when that process died before the child's parent-death signal was set (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rendezvous.processes import die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# Writes its pid to argv[1], then lives 30 s: the test's stand-in for a worker.
WORKER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(30)"


def _started(marker, timeout: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text():
            return int(marker.read_text())
        time.sleep(0.02)
    return None


def test_a_child_whose_parent_died_before_its_death_signal_was_set_ends_instead_of_running_alone(tmp_path):
    """The command is built here, as the agent builds it, and run by another process, as if this one
    had died between the fork and setpriv's prctl: the child's parent is not the one that built the
    command, and it ends itself (SIGKILL) before the program runs."""
    marker = tmp_path / "orphan"
    argv = die_with_parent([sys.executable, "-c", WORKER, str(marker)], "KILL")
    runner = "import subprocess, sys; print(subprocess.call(sys.argv[1:]))"  # the child's parent now
    done = subprocess.run([sys.executable, "-c", runner, *argv], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == str(-signal.SIGKILL) and not marker.exists(), done


def test_a_child_of_a_living_parent_runs_and_dies_with_it(tmp_path):
    """A helper process starts the child with the command it built itself, then is SIGKILLed: the
    child ran its program, and the parent-death signal ends it."""
    marker = tmp_path / "child"
    helper = (
        "import subprocess, sys, time\n"
        "from rendezvous.processes import die_with_parent\n"
        f"subprocess.Popen(die_with_parent([sys.executable, '-c', {WORKER!r}, {str(marker)!r}], 'KILL'))\n"
        "time.sleep(60)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", helper], env={**os.environ, "PYTHONPATH": root})
    try:
        child = _started(marker)
        assert child is not None, "the child never ran its program"
        assert psutil.Process(child).cmdline()[:2] == [sys.executable, "-c"]  # the program, in place of sh
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.02)
    finally:
        parent.kill()
