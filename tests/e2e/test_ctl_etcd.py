"""``elastic-ctl etcd``: the README's no-Docker path to a multi-node job on one machine. A real
3-member etcd from the bundled binary serves a 2-agent job, survives the loss of one member, and
Ctrl-C stops every member and removes its data; a port in use is one line, exit 2."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time

import psutil

from tests.e2e.cli_helpers import run, run_id, tool
from tests.hangs.helpers import Agent


def _free_run(count: int) -> int:
    """A base port with ``count`` free ports from it."""
    for _ in range(200):
        base = random.randrange(10000, 20000, 2)  # below the SLURM tests' allocation ports (20000+)
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError("no run of free ports")


def _start(*args: str) -> tuple[subprocess.Popen, str, str]:
    """elastic-ctl etcd, and the endpoints and data dir it printed."""
    process = subprocess.Popen(
        [tool("elastic-ctl"), "etcd", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first, second = process.stdout.readline(), process.stdout.readline()
    found = re.match(r"etcd: \d+ members? on \S+, data in (\S+) \(", first)
    assert found and second.startswith("  --rdzv-endpoint "), (first, second, process.stderr.read())
    return process, second.split()[-1], found.group(1)


def test_a_local_three_member_etcd_serves_a_job_survives_a_member_and_ctrl_c_cleans_up(tmp_path):
    base = _free_run(6)
    process, endpoints, data_dir = _start("--members", "3", "--port", str(base))
    members = []
    try:
        assert endpoints == ",".join(f"127.0.0.1:{base + 2 * i}" for i in range(3))
        members = [p for p in psutil.Process(process.pid).children(recursive=True) if "etcd" in p.name()]
        assert len(members) == 3 and os.path.isdir(data_dir)
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoints, "--rdzv-id", run_id()]
        script = tmp_path / "w.py"
        script.write_text("import time\ntime.sleep(2)\n")
        agents = [Agent([*args, "--local-addr", "127.0.0.1", str(script)]) for _ in range(2)]
        time.sleep(1.0)
        os.kill(members[2].pid, signal.SIGKILL)  # one member of three lost: the job does not notice
        assert [a.wait(60) for a in agents] == [0, 0], [a.output for a in agents]
        told = [process.stdout.readline() for _ in range(2)]
        assert told[0].strip() == f"or, in each shell: export PET_RDZV_ENDPOINT={endpoints}", told
        env = {**os.environ, "PET_RDZV_ENDPOINT": endpoints}  # as the line says: no --rdzv-endpoint after it
        history = subprocess.run(
            [tool("elastic-ctl"), "history", "--rdzv-id", args[-1]], env=env, capture_output=True, text=True, timeout=30
        )
        assert history.returncode == 0 and "job closed" in history.stdout, history
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        said = process.stderr.read()
        assert re.search(r"etcd: member m2 exited \(killed by SIGKILL; [^()]+\); 2 of 3 go on", said), said
        assert "etcd: stopped" in said, said
        assert not os.path.exists(data_dir), "the data dir it made outlived it"
        assert not any(m.is_running() and m.status() != psutil.STATUS_ZOMBIE for m in members[:2])
    finally:
        if process.poll() is None:
            process.kill()
        for member in members:
            if member.is_running():
                member.kill()


def test_a_port_in_use_is_one_line_and_a_given_data_dir_is_kept(tmp_path):
    base = _free_run(2)
    kept = str(tmp_path / "etcd-data")
    process, endpoints, data_dir = _start("--members", "1", "--port", str(base), "--data-dir", kept)
    try:
        busy = run(["etcd", "--members", "1", "--port", str(base)], tool_name="elastic-ctl", timeout=30)
        assert busy.returncode == 2 and busy.stdout == "", busy
        assert busy.stderr == (
            f"elastic-ctl: error: port {base} on 127.0.0.1 is in use (another etcd?); the members need ports "
            f"{base} to {base + 1}: choose others with --port\n"
        )
        until = time.monotonic() + 2.0  # over and over, as from a supervisor that repeats itself: no deadlock
        while time.monotonic() < until and process.poll() is None:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert data_dir == kept and os.path.isdir(os.path.join(kept, "m0")), "a data dir it was given is kept"
    finally:
        if process.poll() is None:
            process.kill()
