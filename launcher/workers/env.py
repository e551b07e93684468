"""The worker environment contract: exactly what torchrun exports, built by one function; and the
agent's own variables that its workers inherit, set for as long as they run."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from launcher import envnames
from launcher.hangs.beatfile import ENV as HEARTBEAT_ENV
from rendezvous.etcd.credentials import without_credentials

__all__ = ["WorkerSpec", "round_specs", "worker_env", "virtual_device", "exported", "EXPORTED", "OMP_WARNING"]

EXPORTED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    envnames.RUN_ID,
    envnames.RESTART_COUNT,
    envnames.MAX_RESTARTS,
    envnames.USE_AGENT_STORE,
    envnames.ERROR_FILE,
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
# Ours beside torchrun's: ELASTIC_HEARTBEAT_FILE, the worker's heartbeat record (elastic.heartbeat).
# Also OMP_NUM_THREADS=1 when a node runs more than one worker and the user has not set it.

OMP_WARNING = (
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
    "system being overloaded, please further tune the variable for optimal performance in your "
    "application as needed."
)  # torchrun's words, said once by the agent when it applies the rule


@dataclass(frozen=True)
class WorkerSpec:
    """Where one worker stands in the job, for one attempt."""

    local_rank: int
    local_world_size: int
    base_global_rank: int  # global rank of this node's local rank 0
    world_size: int
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    run_id: str
    restart_count: int
    max_restarts: int
    error_file: str
    role: str = "default"
    virtual_local_rank: bool = False  # torchrun's --virtual-local-rank
    heartbeat_file: str = ""  # the record elastic.heartbeat() writes to (launcher/hangs/beatfile.py)
    agent_store: bool = False  # the store at MASTER_ADDR:MASTER_PORT is the agent's (else rank 0's worker's)

    @property
    def rank(self) -> int:
        return self.base_global_rank + self.local_rank


class SpecSettings(Protocol):
    """What ``round_specs`` needs of the agent's settings (``launcher.config.AgentConfig``)."""

    nproc_per_node: int
    role: str
    virtual_local_rank: bool


def round_specs(
    info: Any,
    config: SpecSettings,
    error_file: Callable[[int], str],
    heartbeat_file: Callable[[int], str],
    *,
    agent_store: bool,
) -> list[WorkerSpec]:
    """One spec per local rank of a round (``info``: its ``RendezvousInfo``); ``error_file`` and
    ``heartbeat_file`` give each local rank's paths."""
    n = config.nproc_per_node
    return [
        WorkerSpec(
            local_rank=i,
            local_world_size=n,
            base_global_rank=info.base_global_rank,
            world_size=info.world_size,
            group_rank=info.group_rank,
            group_world_size=info.group_world_size,
            master_addr=info.master_addr,
            master_port=info.master_port,
            run_id=info.run_id,
            restart_count=info.restart_count,
            max_restarts=info.max_restarts,
            role=config.role,
            error_file=error_file(i),
            virtual_local_rank=config.virtual_local_rank,
            heartbeat_file=heartbeat_file(i),
            agent_store=agent_store,
        )
        for i in range(n)
    ]


def virtual_device(local_rank: int, visible: str | None) -> str:
    """--virtual-local-rank: the one device a worker sees (as its device 0): its entry of the
    agent's CUDA_VISIBLE_DEVICES, or its local rank when that is unset."""
    if visible is None:
        return str(local_rank)
    devices = visible.split(",")
    if local_rank >= len(devices):
        raise ValueError(f"local rank {local_rank} has no device in CUDA_VISIBLE_DEVICES={visible}")
    return devices[local_rank].strip()


def worker_env(spec: WorkerSpec, inherited: Mapping[str, str]) -> dict[str, str]:
    """The environment of one worker: the user's own, plus the torchelastic variables.

    With one role per job (as torchrun), ROLE_RANK and ROLE_WORLD_SIZE equal RANK and WORLD_SIZE.
    As torchrun: OMP_NUM_THREADS is 1 when the node runs more than one worker and the user has not
    set it; TORCH_NCCL_ASYNC_ERROR_HANDLING is 1 unless set. TORCHELASTIC_USE_AGENT_STORE is True
    when the agent of group rank 0 hosts the store at MASTER_ADDR:MASTER_PORT (every worker is its
    client), False when rank 0's worker hosts it.
    """
    if not 0 <= spec.local_rank < spec.local_world_size:
        raise ValueError(f"local rank {spec.local_rank} is outside 0..{spec.local_world_size - 1}")
    if not 0 <= spec.rank < spec.world_size:
        raise ValueError(f"rank {spec.rank} is outside 0..{spec.world_size - 1}")
    env = without_credentials(inherited)  # the etcd password and TLS keys are the agent's, not the workers'
    env.update(
        RANK=str(spec.rank),
        LOCAL_RANK=str(spec.local_rank),
        WORLD_SIZE=str(spec.world_size),
        LOCAL_WORLD_SIZE=str(spec.local_world_size),
        GROUP_RANK=str(spec.group_rank),
        GROUP_WORLD_SIZE=str(spec.group_world_size),
        ROLE_NAME=spec.role,
        ROLE_RANK=str(spec.rank),
        ROLE_WORLD_SIZE=str(spec.world_size),
        MASTER_ADDR=spec.master_addr,
        MASTER_PORT=str(spec.master_port),
        **{
            envnames.RUN_ID: spec.run_id,
            envnames.RESTART_COUNT: str(spec.restart_count),
            envnames.MAX_RESTARTS: str(spec.max_restarts),
            envnames.USE_AGENT_STORE: str(spec.agent_store),
            envnames.ERROR_FILE: spec.error_file,
        },
    )
    if spec.virtual_local_rank:
        env.update(
            LOCAL_RANK="0", CUDA_VISIBLE_DEVICES=virtual_device(spec.local_rank, inherited.get("CUDA_VISIBLE_DEVICES"))
        )
    if spec.heartbeat_file:
        env[HEARTBEAT_ENV] = spec.heartbeat_file
    else:
        env.pop(HEARTBEAT_ENV, None)  # an outer agent's record is not this worker's
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if spec.local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


@contextmanager
def exported(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in this process's environment for the block, as torchrun does for what its
    workers inherit; then the environment as it was (a caller that goes on, ``launcher.api``, keeps
    its own)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
