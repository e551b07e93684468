"""torchrun's c10d command lines run unchanged under elastic-run (``launcher.hosted``): the agent on
the endpoint's host serves the job's etcd there, as torchrun's c10d agent serves its TCPStore; the
others join it. Side by side with torchrun on the same arguments, then what only the etcd needs:
the hosting agent outlives the others, and a line that cannot work is one line."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.e2e.cli_helpers import tool

from .test_launcher_parity import SCRIPT, _free_port, _run_both

pytest.importorskip("torch")

TWO_NODES = [
    "--nnodes=2",
    "--nproc-per-node=2",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=localhost:{port}",
    "--rdzv-id={run_id}",
    "--monitor-interval=1",
]


def test_a_two_node_c10d_line_runs_unchanged_under_both(tmp_path, etcd_endpoints):
    script = [SCRIPT, "--touch-file-dir={dir}", "--init-method=env://"]  # a gloo group of all 4 ranks
    theirs, ours = _run_both(tmp_path, etcd_endpoints, TWO_NODES, script, agents=2)
    assert theirs.codes == ours.codes == [0, 0], (theirs.stderr[-2000:], ours.stderr[-2000:])
    assert theirs.touched == ours.touched == {"0", "1", "2", "3"}
    assert ours.stderr.count("this agent hosts the job's etcd on localhost:") == 1, ours.stderr
    assert ours.stderr.count("is served on this machine already; joining the job there") == 1, ours.stderr


def test_torchruns_single_node_line_on_a_free_port_runs_under_both(tmp_path, etcd_endpoints):
    args = ["--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]
    theirs, ours = _run_both(tmp_path, etcd_endpoints, args, [SCRIPT, "--touch-file-dir={dir}"])
    assert theirs.codes == ours.codes == [0], (theirs.stderr[-2000:], ours.stderr[-2000:])
    assert theirs.touched == ours.touched == {"0", "1"}
    assert "port 0 and one node: running it here alone" in ours.stderr, ours.stderr


SLOW_ON_B = (
    "import os, pathlib, sys, time\n"
    "time.sleep(float(os.environ.get('SLOW', '0')))\n"
    "pathlib.Path(sys.argv[1], os.environ['RANK']).touch()\n"
)


def test_the_hosting_agent_keeps_the_etcd_until_the_other_agents_left(tmp_path):
    """The host's exit barrier gives up after 1 s while the other node's worker still runs 8 s --
    longer than the other's lease renewals go on without etcd (4 s): the host waits for it to leave
    before it stops the etcd, and both end as their workers did."""
    (tmp_path / "w.py").write_text(SLOW_ON_B)
    port, run_id = _free_port(), f"host-{uuid.uuid4().hex[:8]}"
    common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
    common += [f"--rdzv-id={run_id}", "--exit-barrier-timeout=1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    agents = {
        name: subprocess.Popen(
            [
                tool("elastic-run"),
                *common,
                f"--rdzv-conf=is_host={host},lease_ttl=5",
                str(tmp_path / "w.py"),
                str(tmp_path),
            ],
            env={**env, "SLOW": slow},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, host, slow in (("host", "true", "0"), ("other", "false", "8"))
    }
    said = {name: agent.communicate(timeout=90)[1] for name, agent in agents.items()}
    codes = {name: agent.returncode for name, agent in agents.items()}
    assert codes == {"host": 0, "other": 0}, said
    assert "this agent hosts the job's etcd" in said["host"] and "waiting up to 30 s for 1 other node" in said["host"]
    assert {p.name for p in tmp_path.iterdir() if p.name.isdigit()} == {"0", "1"}


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nnodes=2", "--rdzv-endpoint=localhost:0"], "port 0 (a free port) serves one node only"),
        (["--nnodes=2", "--rdzv-endpoint=a:1,b:2"], "--rdzv-backend c10d takes one host[:port]"),
        (["--nnodes=2", "--rdzv-endpoint=localhost:70000"], "c10d's endpoint is host[:port] with a port"),
        (["--nnodes=2", "--rdzv-endpoint=localhost:1", "--rdzv-conf=is_host=maybe"], "is_host='maybe': true or false"),
    ],
    ids=["port 0 for two nodes", "two endpoints", "port out of range", "is_host not a boolean"],
)
def test_a_c10d_line_that_cannot_work_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "w.py").write_text("pass\n")
    ran = subprocess.run(
        [tool("elastic-run"), "--rdzv-backend=c10d", "--rdzv-id=x", *args, str(tmp_path / "w.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert ran.returncode == 2 and len(lines) == 1 and says in lines[0], ran.stderr
