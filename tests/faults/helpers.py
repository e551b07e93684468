"""Real agents and workers for the fault suite, and what they left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psutil

from rendezvous import EtcdClient
from rendezvous.etcd.server import EtcdCluster
from tests.e2e.cli_helpers import json_records, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
LIFE = os.path.join(HERE, "workers", "life.py")
ELASTIC_RUN = os.path.join(os.path.dirname(sys.executable), "elastic-run")

# No restart of its own making: these lines mean the job noticed something.
__all__ = [
    "Agent",
    "DISTURBED",
    "alive",
    "leader_index",
    "member_endpoint",
    "run_id",
    "signal_member",
    "wait_for",
    "workers",
]

DISTURBED = ("re-rendezvous", "restarting the workers", "no lease renewal", "lease expired")


def run_id() -> str:
    return f"fault-{uuid.uuid4().hex[:8]}"


class Agent:
    """One elastic-run process whose output goes to a file the test can read at any time."""

    def __init__(
        self,
        endpoints: str,
        rdzv_id: str,
        nnodes: str,
        out: str,
        seconds: float,
        log: str,
        conf: str = "",
        nproc: int = 1,
    ) -> None:
        self.log = log
        args = [
            ELASTIC_RUN,
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            str(nproc),
            "--rdzv-endpoint",
            endpoints,
            "--rdzv-id",
            rdzv_id,
            "--local-addr",
            "127.0.0.1",
            "--stop-grace",
            "2",
        ]
        if conf:
            args += ["--rdzv-conf", conf]
        with open(log, "wb") as handle:
            self.process = subprocess.Popen(
                args + [LIFE, out, str(seconds)], stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        with open(self.log, errors="replace") as handle:
            return handle.read()

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"agent did not exit within {timeout}s:\n{self.output()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.kill(self.process.pid, 18)  # SIGCONT: a frozen agent must be able to die
            except OSError:
                pass
            self.process.kill()
            self.process.wait(10)


def workers(out: str) -> list[dict]:
    """Every worker process the job started, in the order they started."""
    return json_records(out, "w-*.json", "created")


def alive(pid: int) -> bool:
    """Running (a zombie that its parent has not reaped yet counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leader_index(cluster: EtcdCluster) -> int:
    """Which member leads now (asked of each member that answers)."""
    for index, member in enumerate(cluster.members):
        if member.process is None:
            continue
        client = EtcdClient(f"{member.host}:{member.client_port}", timeout=2.0)
        try:
            status = client.status()
            if status.leader == status.header.member_id:
                return index
        except Exception:  # noqa: BLE001 -- a member that does not answer is not the leader we want
            continue
        finally:
            client.close()
    raise AssertionError("no etcd member says it leads")


def member_endpoint(cluster: EtcdCluster, index: int) -> str:
    member = cluster.members[index]
    return f"{member.host}:{member.client_port}"


def signal_member(cluster: EtcdCluster, index: int, signum: int) -> None:
    os.kill(cluster.members[index].process.pid, signum)
