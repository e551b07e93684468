"""``--numa-binding``: which CPUs each local worker is bound to (torchrun's modes), and the command
that binds it (``taskset -c``).

torch binds a worker to the CPUs near its GPU. The same here, without importing torch: a worker's
GPU is the local-rank-th NVIDIA device in PCI order (``/proc/driver/nvidia/gpus``), and its NUMA
node is that device's ``/sys/bus/pci/devices/<address>/numa_node``. On a machine without GPUs the
workers are spread over the NUMA nodes round robin by local rank. Modes:

- ``node``: every CPU of the worker's NUMA node;
- ``socket``: every CPU of the NUMA nodes on the same socket;
- ``exclusive``: the node's physical cores split evenly among the workers on that node (the lower
  local ranks get one more when they do not divide), with their hyperthread siblings;
- ``core-complex``: one group of cores that share a last-level cache, per worker on the node.

Only CPUs this process may run on count. A machine with one NUMA node has nothing to choose:
the workers are not bound, and the agent says so once.
"""

from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass, field

from launcher.errors import UsageError

__all__ = ["MODES", "Topology", "read_topology", "cpus_for", "binding_commands"]

MODES = ("node", "socket", "exclusive", "core-complex")


@dataclass(frozen=True)
class Topology:
    nodes: dict[int, frozenset[int]]  # NUMA node -> CPUs (allowed ones only)
    socket_of: dict[int, int] = field(default_factory=dict)  # CPU -> socket
    core_of: dict[int, int] = field(default_factory=dict)  # CPU -> its physical core (lowest sibling)
    cache_of: dict[int, int] = field(default_factory=dict)  # CPU -> its last-level cache group (lowest CPU)
    gpu_nodes: tuple[int, ...] = ()  # NUMA node of each GPU, in device order


def _cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def read_topology(root: str = "/sys") -> Topology:
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    nodes: dict[int, frozenset[int]] = {}
    for path in glob.glob(os.path.join(root, "devices/system/node/node[0-9]*")):
        text = _read(os.path.join(path, "cpulist"))
        cpus = frozenset(_cpu_list(text) & set(allowed)) if text else frozenset()
        if cpus:
            nodes[int(os.path.basename(path)[4:])] = cpus
    if not nodes:
        nodes = {0: frozenset(allowed)}
    socket_of, core_of, cache_of = {}, {}, {}
    for cpu in sorted(set().union(*nodes.values())):
        base = os.path.join(root, f"devices/system/cpu/cpu{cpu}")
        socket = _read(os.path.join(base, "topology/physical_package_id"))
        socket_of[cpu] = int(socket) if socket and socket.strip().lstrip("-").isdigit() else 0
        siblings = _read(os.path.join(base, "topology/thread_siblings_list"))
        core_of[cpu] = min(_cpu_list(siblings)) if siblings else cpu
        caches = sorted(glob.glob(os.path.join(base, "cache/index[0-9]*")))
        shared = _read(os.path.join(caches[-1], "shared_cpu_list")) if caches else None
        cache_of[cpu] = min(_cpu_list(shared)) if shared else cpu
    gpu_nodes = []
    for address in sorted(os.path.basename(p) for p in glob.glob("/proc/driver/nvidia/gpus/*")):
        text = _read(os.path.join(root, "bus/pci/devices", address.lower(), "numa_node"))
        gpu_nodes.append(max(int(text), 0) if text and text.strip().lstrip("-").isdigit() else 0)
    return Topology(nodes, socket_of, core_of, cache_of, tuple(gpu_nodes))


def _node_of(topology: Topology, local_rank: int) -> int:
    order = sorted(topology.nodes)
    if topology.gpu_nodes:
        node = topology.gpu_nodes[local_rank % len(topology.gpu_nodes)]
        return node if node in topology.nodes else order[0]
    return order[local_rank % len(order)]


def _share(groups: list[frozenset[int]], index: int, count: int) -> frozenset[int]:
    """The index-th of count even shares of groups (lower indexes get one more when they do not divide)."""
    if count > len(groups):
        return groups[index % len(groups)]
    size, extra = divmod(len(groups), count)
    start = index * size + min(index, extra)
    return frozenset().union(*groups[start : start + size + (1 if index < extra else 0)])


def cpus_for(mode: str, local_rank: int, nproc: int, topology: Topology) -> frozenset[int]:
    """The CPUs local rank ``local_rank`` (of ``nproc``) is bound to under ``mode``."""
    node = _node_of(topology, local_rank)
    cpus = topology.nodes[node]
    if mode == "node":
        return cpus
    if mode == "socket":
        sockets = {topology.socket_of.get(cpu, 0) for cpu in cpus}
        return frozenset(c for n in topology.nodes.values() for c in n if topology.socket_of.get(c, 0) in sockets)
    peers = [r for r in range(nproc) if _node_of(topology, r) == node]
    key = topology.core_of if mode == "exclusive" else topology.cache_of
    groups: dict[int, set[int]] = {}
    for cpu in sorted(cpus):
        groups.setdefault(key.get(cpu, cpu), set()).add(cpu)
    ordered = [frozenset(groups[k]) for k in sorted(groups)]
    if mode == "exclusive":
        if len(ordered) < len(peers):
            raise UsageError(
                f"--numa-binding exclusive: NUMA node {node} has {len(ordered)} physical cores for {len(peers)} workers"
            )
        return _share(ordered, peers.index(local_rank), len(peers))
    if mode == "core-complex":
        return ordered[peers.index(local_rank) % len(ordered)]
    raise UsageError(f"--numa-binding must be one of {', '.join(MODES)}, not {mode!r}")


def _ranges(cpus: frozenset[int]) -> str:
    out, run = [], []
    for cpu in sorted(cpus):
        if run and cpu != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(cpu)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def binding_commands(
    mode: str | None,
    nproc: int,
    topology: Topology | None = None,
) -> tuple[dict[int, tuple[str, ...]], str | None]:
    """(the command in front of each local rank's, a line to say or None). No mode: no binding, and
    sysfs is not read (``topology`` None: this machine's, read only when a mode asks for it)."""
    if mode is None:
        return {}, None
    if mode not in MODES:
        raise UsageError(f"--numa-binding must be one of {', '.join(MODES)}, not {mode!r}")
    if topology is None:
        topology = read_topology()
    if len(topology.nodes) < 2:
        return {}, f"--numa-binding {mode}: this machine has one NUMA node; the workers are not bound"
    if shutil.which("taskset") is None:
        raise UsageError(f"--numa-binding {mode}: binding needs the taskset command (util-linux), not found on PATH")
    commands = {r: ("taskset", "-c", _ranges(cpus_for(mode, r, nproc, topology))) for r in range(nproc)}
    return commands, None
