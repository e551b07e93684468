"""Running under SLURM: ``srun elastic-run --nproc-per-node N train.py`` (one task per node) with no
rendezvous flag forms the job from the allocation. What SLURM says is read here:

- the job: ``SLURM_JOB_ID`` (the rendezvous id ``slurm-<id>``, the same after a requeue), the node
  count ``SLURM_JOB_NUM_NODES`` (``--nnodes 1:N``: the job goes on with the nodes that are alive),
  this node's name ``SLURMD_NODENAME`` (its identity: several SLURM nodes may share one host) and
  index ``SLURM_NODEID``;
- the etcd inside the allocation: one member for one or two nodes, else three, on the first nodes
  of ``SLURM_JOB_NODELIST``, at the addresses slurmctld knows them by (``scontrol``), on ports
  derived from the job id, so every agent finds every member and members of nodes that share a host
  do not collide.

Explicit flags and ``PET_*`` variables win; outside a SLURM step nothing changes. The decisions are
pure functions of the environment and the node addresses; ``node_addresses`` is the only I/O.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "SlurmJob",
    "AllocationEtcd",
    "Member",
    "slurm_job",
    "member_count",
    "etcd_layout",
    "node_names",
    "node_addresses",
    "PORT_BASE",
]

PORT_BASE = 20000  # the allocation's etcd ports: PORT_BASE + 6 * (job id % PORT_SLOTS) + 0..5
PORT_SLOTS = 2000  # so the ports stay below the ephemeral range (32768 on Linux)


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    nodes: int  # in the allocation
    node_name: str  # SLURMD_NODENAME: unique per node, even when nodes share a host
    node_index: int  # SLURM_NODEID: 0 .. nodes-1
    nodelist: str  # SLURM_JOB_NODELIST, compressed (n[1-3])
    restart_count: int  # SLURM_RESTART_COUNT: how many times the job was requeued

    @property
    def rdzv_id(self) -> str:
        return f"slurm-{self.job_id}"


@dataclass(frozen=True)
class Member:
    name: str  # m0, m1, m2
    node: str  # the SLURM node that runs it
    addr: str
    client_port: int
    peer_port: int

    @property
    def client(self) -> str:
        return f"{self.addr}:{self.client_port}"


@dataclass(frozen=True)
class AllocationEtcd:
    """The etcd members of the allocation, and which one this node runs (None: none)."""

    members: tuple[Member, ...]
    token: str
    mine: Member | None

    @property
    def endpoints(self) -> str:
        return ",".join(m.client for m in self.members)

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}=http://{m.addr}:{m.peer_port}" for m in self.members)


def slurm_job(env: Mapping[str, str]) -> SlurmJob | None:
    """The SLURM job this process is a task of (inside an ``srun`` step), else None."""
    needed = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURMD_NODENAME", "SLURM_NODEID")
    if any(not env.get(name) for name in needed):
        return None
    try:
        nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1")
        index = int(env["SLURM_NODEID"])
        restarts = int(env.get("SLURM_RESTART_COUNT") or "0")
    except ValueError:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or env["SLURMD_NODENAME"]
    return SlurmJob(env["SLURM_JOB_ID"], nodes, env["SLURMD_NODENAME"], index, nodelist, restarts)


def member_count(nodes: int) -> int:
    """One member for one or two nodes (a second would add a failure, not a spare), else three."""
    return 1 if nodes <= 2 else 3


def etcd_layout(job: SlurmJob, hosts: list[tuple[str, str]]) -> AllocationEtcd:
    """The members on the first nodes of ``hosts`` ((node name, address), in the allocation's order)."""
    count = min(member_count(job.nodes), len(hosts))
    digits = "".join(c for c in job.job_id if c.isdigit()) or "0"
    base = PORT_BASE + 6 * (int(digits) % PORT_SLOTS)
    members = tuple(
        Member(f"m{i}", name, addr, base + 2 * i, base + 2 * i + 1) for i, (name, addr) in enumerate(hosts[:count])
    )
    mine = next((m for m in members if m.node == job.node_name), None)
    return AllocationEtcd(members, f"elastic-slurm-{job.job_id}", mine)


def node_names(job: SlurmJob) -> list[str]:
    """The allocation's nodes, in its order (``scontrol show hostnames``: no call to slurmctld)."""
    return _scontrol(["show", "hostnames", job.nodelist]).split()


def node_addresses(names: list[str]) -> list[tuple[str, str]]:
    """(name, address) of these nodes, as slurmctld knows them."""
    shown = _scontrol(["show", "node", ",".join(names), "-o"]) if names else ""
    addresses = {}
    for line in shown.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "NodeName" in fields:
            addresses[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return [(name, addresses.get(name, name)) for name in names]


def _scontrol(args: list[str]) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"scontrol {' '.join(args)} failed: {exc}") from None
    if done.returncode != 0:
        raise RuntimeError(f"scontrol {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout
