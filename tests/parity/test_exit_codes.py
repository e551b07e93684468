"""How each launcher ends, side by side: torchrun and elastic-run with the same arguments (only the
rendezvous swapped for an etcd), the same worker and the same fault; the exit codes, and whether
the last thing said is a traceback. The README's "Coming from torchrun" table of exit codes is
read here and must be what both launchers did."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.cli_helpers import tool
from tests.readme_quotes import README

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SLEEPER = "import pathlib, sys, time\npathlib.Path(sys.argv[1]).touch()\ntime.sleep(60)\n"
FAILING = "import sys\nsys.exit(3)\n"

pytest.importorskip("torch")


def _readme_codes() -> dict[str, tuple[int, int]]:
    """The README's side-by-side table: {case: (torchrun's code, elastic-run's code)}."""
    table = README.split("| what ends the run | torchrun | elastic-run |", 1)[1].splitlines()[2:]
    codes = {}
    for line in (row.strip() for row in table):
        if not line.startswith("|"):
            break
        case, theirs, ours = (cell.strip() for cell in line.strip("|").split("|")[:3])
        codes[case] = (int(re.match(r"`(\d+)`", theirs).group(1)), int(re.match(r"`(\d+)`", ours).group(1)))
    return codes


def _start(launcher: list[str], args: list[str], cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    return subprocess.Popen(
        [*launcher, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
    )


def _both(tmp_path: Path, theirs: list[str], ours: list[str], script: str, signum: int | None = None):
    """Both launchers at once on ``script`` (given the path of a file it touches when it runs); after
    both workers ran, ``signum`` to each agent. Returns {side: (code, stderr)}."""
    sides = {}
    for name, launcher, args in (("torchrun", TORCHRUN, theirs), ("elastic-run", [tool("elastic-run")], ours)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "w.py").write_text(script)
        sides[name] = (folder, _start(launcher, [*args, str(folder / "w.py"), str(folder / "started")], folder))
    if signum is not None:
        deadline = time.monotonic() + 60
        while not all((folder / "started").exists() for folder, _ in sides.values()):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        for _, process in sides.values():
            process.send_signal(signum)
    ended = {}
    for name, (_, process) in sides.items():
        try:
            _, err = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"{name} did not end") from None
        ended[name] = (process.returncode, err)
    return ended


def _case(tmp_path: Path, case: str, etcd: str) -> dict[str, tuple[int, str]]:
    standalone = ["--standalone", "--nproc-per-node", "1"]
    if case == "a worker fails, no restart left":
        return _both(tmp_path, standalone, standalone, FAILING)
    if case == "SIGTERM to the agent":
        return _both(tmp_path, standalone, standalone, SLEEPER, signal.SIGTERM)
    if case == "SIGINT to the agent (Ctrl-C)":
        return _both(tmp_path, standalone, standalone, SLEEPER, signal.SIGINT)
    if case == "no round within join_timeout":
        common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-conf", "join_timeout=3"]
        common += ["--rdzv-id", f"codes-{os.getpid()}-{time.time_ns()}"]
        theirs = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", *common]
        return _both(tmp_path, theirs, ["--rdzv-endpoint", etcd, "--local-addr", "127.0.0.1", *common], SLEEPER)
    if case == "an unknown option":
        return _both(tmp_path, [*standalone, "--no-such-option"], [*standalone, "--no-such-option"], SLEEPER)
    raise AssertionError(f"the README's table has a case this test does not run: {case!r}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", sorted(_readme_codes()))
def test_each_ending_exits_with_the_codes_the_readme_says(tmp_path, etcd_endpoints, case):
    theirs, ours = _readme_codes()[case]
    ended = _case(tmp_path, case, etcd_endpoints)
    print(f"\n{case}: torchrun {ended['torchrun'][0]}, elastic-run {ended['elastic-run'][0]}")
    assert ended["torchrun"][0] == theirs, ended["torchrun"][1][-1500:]
    assert ended["elastic-run"][0] == ours, ended["elastic-run"][1][-1500:]
    said = ended["elastic-run"][1]
    last = [line for line in said.splitlines() if line.strip()][-1]
    ours = [line for line in said.splitlines() if line.strip().startswith("File ") and "/launcher/" in line]
    assert not ours and last.startswith(("elastic-run: ", "Error: ")), said[-1500:]  # a worker's traceback may show
