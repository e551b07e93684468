"""No process of the agent's outlives it: the pre-flight check's program is started as a worker is
(a session of its own, and a parent-death signal), not by a bare ``Popen`` that a SIGKILLed agent
leaves running. The agent here is a stand-in process that starts the check's program through
``preflight_for`` exactly as the agent does, and is then SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from .cli_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = textwrap.dedent(
    """
    import sys, time
    from launcher.preflight.gate import preflight_for

    preflight = preflight_for(True, None, print)
    program = [sys.executable, "-c", "import time; time.sleep(120)  # preflight-lifeline"]
    process = preflight._start(program, {"PATH": "/usr/bin:/bin"})
    print(process.pid, flush=True)
    time.sleep(120)
    """
)


def test_the_preflight_program_dies_with_its_agent():
    agent = subprocess.Popen(
        [sys.executable, "-c", STAND_IN],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        program = psutil.Process(int(agent.stdout.readline()))
        assert program.ppid() == agent.pid
        assert os.getsid(program.pid) == program.pid, "the program runs in a session of its own, as a worker does"
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        wait_for(
            lambda: not program.is_running() or program.status() == psutil.STATUS_ZOMBIE, 5, what="the program to die"
        )
    finally:
        if agent.poll() is None:
            agent.kill()
        for stray in psutil.process_iter(["cmdline"]):
            if "preflight-lifeline" in " ".join(stray.info["cmdline"] or []) and stray.pid != os.getpid():
                stray.kill()
