"""``elastic-run --lighthouse``: two elastic-run jobs (two torchft replica groups, 2 workers each)
train examples/torchft/train_ddp.py with torchft's Manager and DDP on gloo, each through the
Lighthouse replica its agent started; one replica is SIGKILLed while they train, its agent starts it
again on the same port, and both groups finish with the same weights and quorum."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

from .conftest import leading

pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("torchft", reason="torchft is not installed (pip install -e '.[torchft]')")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torchft" / "train_ddp.py"
STEPS = 150
ELASTIC_RUN = str(Path(sys.executable).with_name("elastic-run"))


def group(endpoints: str, name: str, lighthouse: str, out: Path, log: Path, steps: int) -> subprocess.Popen:
    argv = [ELASTIC_RUN, "--rdzv-endpoint", endpoints, "--rdzv-id", name, "--nproc-per-node", "2"]
    argv += ["--lighthouse", lighthouse, "--lighthouse-port", "0", "--lighthouse-min-replicas", "2"]
    argv += [str(EXAMPLE), "--steps", str(steps), "--min-replicas", "2", "--out", str(out)]
    with open(log, "wb") as handle:
        return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def replica_of(agent: subprocess.Popen, timeout: float = 60) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(agent.pid).children():
            try:
                if child.cmdline()[1:3] == ["-m", "lighthouse"]:
                    return child
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError("the agent started no lighthouse replica")


def exited(process: psutil.Process, timeout: float) -> bool:
    """Whether ``process`` ended within ``timeout``: it is gone, or a zombie. An orphan that exited
    stays a zombie until init reaps it, which can take seconds (about 1.8 s on this project's VMs):
    that is not the replica living on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def taken(port: int) -> socket.socket | None:
    """A socket that took ``port`` as another server would (SO_REUSEADDR, so the killed replica's
    connections left in TIME_WAIT are no obstacle, as they are none to an outgoing connection), or
    None when the port is held."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen()
        return sock
    except OSError:
        sock.close()
        return None


def page_answers(port: int, timeout: float) -> bool:
    """Whether a status page answers on ``port`` within ``timeout`` (the restarted replica's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=2) as reply:
                return "quorum_id" in json.loads(reply.read())
        except (OSError, ValueError):
            time.sleep(0.2)
    return False


def agent_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("elastic-run:"))


def test_two_groups_train_through_their_own_replicas_and_survive_one_dying(etcd_endpoints, tmp_path):
    """The replica that does not lead is SIGKILLed mid-training, 40 quorums in, when a quorum call
    is about to go through it: a request it was forwarding is withdrawn, an answer it was relaying is
    given again on the Manager's retry. (A leader killed between issuing a quorum and the answer to a
    forwarded call reaching its replica cannot be undone: README, "What a replica's death costs".)
    While it is down something tries to take its port (a kernel-chosen one, where outgoing
    connections take theirs): the agent holds it, so the replica comes back where its workers look."""
    lighthouse = f"ft-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "result.jsonl"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    agents = [group(etcd_endpoints, f"g{i}-{lighthouse}", lighthouse, out, logs[i], steps=STEPS) for i in range(2)]
    try:
        replicas = [replica_of(agent) for agent in agents]
        deadline = time.monotonic() + 120
        while min(log.read_text(errors="replace").count("got lighthouse quorum") for log in logs) < 40:  # training
            assert time.monotonic() < deadline and all(a.poll() is None for a in agents), [t.read_text() for t in logs]
            time.sleep(0.02)
        v = 1 - leading(etcd_endpoints, lighthouse, replicas)  # the follower (see the docstring)
        said = re.search(r"a replica at \S+:(\d+) .*status page on port (\d+)", logs[v].read_text())
        ports = [int(said.group(1)), int(said.group(2))]
        replicas[v].send_signal(signal.SIGKILL)
        assert exited(replicas[v], timeout=10), "the SIGKILLed replica lives on"
        for held in ports:  # its gRPC port, and its status page's (CI saw that one taken)
            thief = taken(held)
            assert thief is None, f"port {held} of the killed replica was free for another process to take"
        assert page_answers(ports[1], timeout=60), f"the restarted replica's status page is not on port {ports[1]}"
        assert not out.exists(), "the groups finished before the replica was killed"
        codes = [agent.wait(180) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(10)
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0], "\n".join(
        f"--- group {i} exited {code}:\n{agent_lines(text)}\n{text[-6000:]}"
        for i, (code, text) in enumerate(zip(codes, texts))
        if code
    )
    assert "the lighthouse replica exited (-9); starting it again on port" in texts[v]
    assert "lighthouse quorum failed" in texts[v]  # the kill hit that group's Manager mid-training
    assert all("TORCHFT_LIGHTHOUSE" in text for text in texts)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4 and all(line["step"] == STEPS for line in lines)
    assert len({line["lighthouse"] for line in lines}) == 2  # each group talked to its own replica
    for rank in (0, 1):
        same_rank = [line for line in lines if line["rank"] == rank]
        assert same_rank[0]["checksum"] == same_rank[1]["checksum"]  # DDP across the groups
        assert same_rank[0]["quorum_id"] == same_rank[1]["quorum_id"]


def test_the_replica_does_not_outlive_its_agent(etcd_endpoints, tmp_path):
    """An agent SIGKILLed: its lighthouse replica gets SIGTERM from the kernel and is gone."""
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(120)\n")
    argv = [ELASTIC_RUN, "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", f"orphan-{uuid.uuid4().hex[:6]}"]
    argv += ["--lighthouse", f"orphan-{uuid.uuid4().hex[:6]}", "--lighthouse-port", "0", str(script)]
    log = tmp_path / "agent.log"
    with open(log, "wb") as handle:
        agent = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        replica = replica_of(agent)
        deadline = time.monotonic() + 30
        while "TORCHFT_LIGHTHOUSE" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and agent.poll() is None, log.read_text(errors="replace")
            time.sleep(0.1)
        agent.kill()
        agent.wait(10)
        assert exited(replica, timeout=10), "the lighthouse replica outlived its agent"
    finally:
        if agent.poll() is None:
            agent.kill()


def test_a_burst_of_sigterms_stops_a_replica_once(etcd_endpoints, replicas):
    """SIGTERM over and over for 2 s (a supervisor repeating itself, the kernel's parent-death signal
    on top of an agent's stop): the replica stops, exit 0. A handler that took a lock the main
    thread held (an Event's) deadlocked it: it lived on, retrying etcd, long after its agent."""
    replica = replicas(etcd_endpoints, f"burst-{uuid.uuid4().hex[:6]}", "--min_replicas", "1")
    time.sleep(0.5)
    until = time.monotonic() + 2.0  # signals all along its shutdown, each handler cut by the next
    while time.monotonic() < until and replica.process.poll() is None:
        replica.signal(signal.SIGTERM)
    try:
        code = replica.process.wait(15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the replica did not stop:\n{replica.output()}") from None
    assert code == 0, replica.output()
