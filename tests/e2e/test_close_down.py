"""The agent's close-down while its threads are busy: its workers flood their pipes (copied by the
log pump to the console, prefixed, and to log files), the agent is stopped by SIGTERM and must end
with 143, its last line, no traceback and no descriptor error -- every time."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from .cli_helpers import tool, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
FLOOD = os.path.join(HERE, "workers", "flood.py")
HELD = os.path.join(HERE, "workers", "held.py")
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


READ_TIMEOUT = 3  # --rdzv-conf read_timeout: what the agent's last words to etcd may take, all of them


def test_an_agent_stopped_while_its_etcd_is_frozen_says_goodbye_within_one_read_timeout(tmp_path):
    """scancel stops a SLURM allocation's etcd members with its agents: an agent's goodbye (its lease
    revoked, the job's state read, its last history record, its helpers' closes) then meets an etcd
    that cannot answer. Each call used to wait its own read_timeout, and the agent outlived the
    allocation's grace period; together they take one."""
    from rendezvous.etcd.server import EtcdServer

    with EtcdServer() as etcd:
        agent = subprocess.Popen(
            [tool("elastic-run"), "--rdzv-backend", "etcd-v3", "--rdzv-endpoint", etcd.endpoints, "--nnodes", "1"]
            + ["--rdzv-id", "frozen-goodbye", "--rdzv-conf", f"read_timeout={READ_TIMEOUT}", "--stop-grace", "1"]
            + [HELD, str(tmp_path / "started")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: (tmp_path / "started").exists(), 60, what="the worker to start")
            os.kill(etcd.process.pid, signal.SIGSTOP)  # frozen for the whole goodbye and past it
            stopped = time.monotonic()
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=60)
            took = time.monotonic() - stopped
        finally:
            os.kill(etcd.process.pid, signal.SIGCONT)
            if agent.poll() is None:
                agent.kill()
    lines = [line for line in err.decode(errors="replace").splitlines() if line.startswith("elastic-run:")]
    print(f"\nan agent SIGTERMed with its etcd frozen ended {took:.2f} s later (read_timeout {READ_TIMEOUT} s)")
    assert agent.returncode == 128 + signal.SIGTERM, lines[-5:]
    assert took < READ_TIMEOUT + 2, f"{took:.2f} s: {lines[-5:]}"
