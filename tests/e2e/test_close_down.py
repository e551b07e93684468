"""The agent's close-down while its threads are busy: its workers flood their pipes (copied by the
log pump to the console, prefixed, and to log files), the agent is stopped by SIGTERM and must end
with 143, its last line, no traceback and no descriptor error -- every time."""

from __future__ import annotations

import os
import signal
import subprocess

from .cli_helpers import tool, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
FLOOD = os.path.join(HERE, "workers", "flood.py")
TIMES = 4


def test_an_agent_stopped_while_its_workers_flood_their_pipes_ends_cleanly_every_time(tmp_path):
    for attempt in range(TIMES):
        out = tmp_path / str(attempt)
        out.mkdir()
        agent = subprocess.Popen(
            [tool("elastic-run"), "--standalone", "--nproc-per-node", "2", "--tee", "3", "--log-dir", str(out)]
            + ["--stop-grace", "1", FLOOD, str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda o=out: len(list(o.glob("*.started"))) == 2, 60, what="both workers flooding")
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=30)
        finally:
            if agent.poll() is None:
                agent.kill()
        text = err.decode(errors="replace")
        agent_lines = [line for line in text.splitlines() if line.startswith("elastic-run:") or "Error" in line]
        assert agent.returncode == 128 + signal.SIGTERM, agent_lines[-5:]
        assert "Traceback" not in text and "Bad file descriptor" not in text, agent_lines[-10:]
