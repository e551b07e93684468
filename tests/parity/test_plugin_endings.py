"""Every torchrun job on the ``etcd-v3`` handler ends when its rendezvous is closed or abandoned.

torch's agent asks its handler only how many nodes wait while its workers are healthy; on etcd the
store outlives every agent, so a node whose workers wait in ``init_process_group`` for ranks that
will never come used to wait the whole init timeout (30 minutes). Two real torchrun agents, real
workers (``workers/peer_gone.py``) and a real etcd: a node whose agent gave up closes the
rendezvous and the other node ends with torch's ``RendezvousClosedError``; a node SIGKILLed whole
is dropped by torch's keep-alive rule and the survivor runs a new round without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch")

WORKER = str(Path(__file__).resolve().parent / "workers" / "peer_gone.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ENDS_WITHIN = 60  # seconds for a node to end once its peer is gone (it waited 30 minutes before)


def _agent(etcd: str, run_id: str, marks: Path, gone: str, conf: str, nnodes: str, name: str) -> subprocess.Popen:
    args = [
        *TORCHRUN,
        *("--nnodes", nnodes, "--nproc-per-node", "1", "--max-restarts", "0", "--monitor-interval", "0.5"),
        *("--rdzv-backend", "etcd-v3", "--rdzv-endpoint", etcd, "--rdzv-id", run_id, "--rdzv-conf", conf),
        WORKER,
        str(marks),
    ]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PET_")}, "PEER_GONE": gone}
    log = open(marks / f"{name}.log", "w")  # noqa: SIM115 -- the agent writes it until it ends
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _end(agent: subprocess.Popen, within: float) -> int | None:
    """The agent's exit code, or None when it did not end in time (then its whole session is killed)."""
    try:
        return agent.wait(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(10)
        return None


def _left(marks: Path) -> list[int]:
    """Worker processes still running from this test's job."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if str(marks) in " ".join(p.info["cmdline"] or [])]


def _wait_for(predicate, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_node_whose_peer_gave_up_ends_with_torchs_closed_error(tmp_path, etcd_endpoints):
    run_id = f"gave-up-{uuid.uuid4().hex[:8]}"
    agents = [_agent(etcd_endpoints, run_id, tmp_path, "exit", "join_timeout=60", "2", f"node{i}") for i in (0, 1)]
    codes = [_end(agent, 60 + ENDS_WITHIN) for agent in agents]
    said = {name: (tmp_path / f"{name}.log").read_text() for name in ("node0", "node1")}
    assert None not in codes, f"a node never ended: {codes}\n" + "\n".join(said.values())[-4000:]
    assert codes == [1, 1], said
    closed = [text for text in said.values() if "RendezvousClosedError" in text]
    assert len(closed) == 1, said
    assert "was closed while this node's workers ran" in closed[0], closed[0][-2000:]
    _wait_for(lambda: not _left(tmp_path), 10, "the survivor's workers to be stopped")


def test_a_node_whose_peer_died_whole_runs_a_new_round_without_it(tmp_path, etcd_endpoints):
    run_id = f"died-{uuid.uuid4().hex[:8]}"
    conf = "join_timeout=60,last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3"
    agents = [_agent(etcd_endpoints, run_id, tmp_path, "hang", conf, "1:2", f"node{i}") for i in (0, 1)]
    try:
        _wait_for(lambda: list(tmp_path.glob("hung-*")), 90, "group rank 1's worker to start")
        hung = int(next(tmp_path.glob("hung-*")).name.split("-")[1])
        ancestors = {parent.pid for parent in psutil.Process(hung).parents()}
        dying = next(a for a in agents if a.pid in ancestors)
        for pid in (hung, dying.pid):  # the whole node: its worker and its agent at once
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        survivor = next(a for a in agents if a is not dying)
        code = _end(survivor, ENDS_WITHIN)
        took = time.monotonic() - killed
    finally:
        for agent in agents:
            _end(agent, 0.1) if agent.poll() is None else None
    said = (tmp_path / f"node{agents.index(survivor)}.log").read_text()
    assert code == 0, f"the survivor ended with {code}:\n{said[-4000:]}"
    assert (tmp_path / "done-1").exists(), said[-4000:]
    assert "round 0 lost " in said and "dropped it for its missed heartbeats" in said, said[-4000:]
    print(f"\na node SIGKILLed whole: the survivor ran a new round alone and exited 0 {took:.1f} s later")
