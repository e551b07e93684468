"""A real SLURM on loopback for the tests: munged, slurmctld and several slurmd on one host, from
Debian's packages (``slurmctld slurmd slurm-client munge``), as root, with no systemd and no
cgroups. Every daemon runs in the foreground under this process and is stopped (after every job is
cancelled: a slurmstepd outlives its slurmd otherwise) when the cluster closes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

__all__ = ["SlurmCluster", "missing"]

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "squeue")


def missing() -> str | None:
    """Why a SLURM cannot be had here (None: it can)."""
    if os.geteuid() != 0:
        return "the SLURM daemons run as root here, and these tests do not"
    absent = [name for name in DAEMONS if shutil.which(name) is None]
    if absent:
        return f"no {', '.join(absent)} (Debian: apt-get install slurmctld slurmd slurm-client munge)"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("127.0.0.1", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


class SlurmCluster:
    """``nodes`` slurmd (n1, n2, ...) of ``cpus`` CPUs each, one partition ``debug``."""

    def __init__(self, nodes: int = 3, cpus: int = 2, kill_wait: int = 5) -> None:
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.kill_wait = kill_wait
        self.dir = tempfile.mkdtemp(prefix="elastic-slurm-")
        os.chmod(self.dir, 0o755)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket.2")
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        self._processes: list[subprocess.Popen] = []

    # -- start --------------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> "SlurmCluster":
        self._write_conf()
        self._munged()
        self._daemon(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld")
        self._until(lambda: self.run(["scontrol", "ping"]).stdout.count("UP") >= 1, timeout, "slurmctld up")
        for node in self.nodes:
            self._daemon(["slurmd", "-D", "-N", node, "-f", self.conf], f"slurmd-{node}")
        self._until(self._all_idle, timeout, f"{len(self.nodes)} nodes idle")
        return self

    def _write_conf(self) -> None:
        ctld, *ports = _free_ports(1 + len(self.nodes))
        host = socket.gethostname()
        d = self.dir
        lines = [
            "ClusterName=elastic",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            f"KillWait={self.kill_wait}",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=300",
        ]
        for node, port in zip(self.nodes, ports):
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} State=UNKNOWN"
            )
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        os.makedirs(os.path.join(d, "state"), exist_ok=True)
        for node in self.nodes:
            os.makedirs(os.path.join(d, "spool", node), exist_ok=True)
        with open(self.conf, "w") as handle:
            handle.write("\n".join(lines) + "\n")

    def _munged(self) -> None:
        os.makedirs(os.path.dirname(self.munge_socket), mode=0o755, exist_ok=True)
        os.chmod(os.path.dirname(self.munge_socket), 0o755)
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as handle:
            handle.write(os.urandom(128))
        os.chmod(key, 0o600)
        self._daemon(
            [
                "munged",
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.dir}/munged.pid",
                f"--log-file={self.dir}/munged.log",
                f"--seed-file={self.dir}/munged.seed",
            ],
            "munged",
        )
        self._until(lambda: os.path.exists(self.munge_socket), 10, "munged's socket")

    def _daemon(self, command: list[str], name: str) -> None:
        log = open(os.path.join(self.dir, f"{name}.out"), "wb")
        self._processes.append(
            subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        )
        log.close()

    def _all_idle(self) -> bool:
        shown = self.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split("\n")
        states = dict(line.split() for line in shown if line.strip())
        return all(states.get(node, "").startswith("idle") for node in self.nodes)

    def _until(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.1)
        raise RuntimeError(f"SLURM: no {what} within {timeout:g} s; logs in {self.dir}")

    # -- use ----------------------------------------------------------------------------------------
    def run(self, command: list[str], timeout: float = 30.0, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env, **kwargs.pop("env", {})},
            **kwargs,
        )

    def job_state(self, job: str) -> str:
        shown = self.run(["scontrol", "show", "job", job]).stdout
        for part in shown.split():
            if part.startswith("JobState="):
                return part.split("=", 1)[1]
        return ""

    # -- stop ---------------------------------------------------------------------------------------
    def close(self) -> None:
        if shutil.which("scancel"):
            self.run(["scancel", "--user=root", "--full"], timeout=10)
            deadline = time.monotonic() + self.kill_wait + 10
            while time.monotonic() < deadline and self.run(["squeue", "-h"], timeout=10).stdout.strip():
                time.sleep(0.2)
        for process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self._processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        subprocess.run(["pkill", "-f", f"slurmstepd.*{self.dir}"], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
