"""The worker's side: was I launched by an elastic agent, and where do I stand in the job."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from launcher import envnames

__all__ = ["is_torchelastic_launched", "WorkerEnv", "NotLaunchedError"]


def is_torchelastic_launched(environ: Mapping[str, str] | None = None) -> bool:
    """True iff this process was started by elastic-run or torchrun (TORCHELASTIC_RUN_ID is set).

    The same test as ``torch.distributed.is_torchelastic_launched()``.
    """
    return envnames.RUN_ID in (os.environ if environ is None else environ)


class NotLaunchedError(RuntimeError):
    """WorkerEnv was read outside a worker launched by elastic-run (or torchrun)."""


_INTS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_PORT",
    envnames.RESTART_COUNT,
    envnames.MAX_RESTARTS,
)


@dataclass(frozen=True)
class WorkerEnv:
    """A typed view of the environment elastic-run (or torchrun) gives each worker."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    role_name: str
    role_rank: int
    role_world_size: int
    master_addr: str
    master_port: int
    run_id: str
    restart_count: int
    max_restarts: int
    use_agent_store: bool
    error_file: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "WorkerEnv":
        env = os.environ if environ is None else environ
        if not is_torchelastic_launched(env):
            raise NotLaunchedError(
                "not running in a worker launched by elastic-run or torchrun (TORCHELASTIC_RUN_ID is not set)"
            )
        ints = {}
        for name in _INTS:
            text = env.get(name)
            if text is None:
                raise NotLaunchedError(f"the worker environment is incomplete: {name} is not set")
            try:
                ints[name] = int(text)
            except ValueError:
                raise NotLaunchedError(
                    f"the worker environment is malformed: {name}={text!r} is not a number"
                ) from None
        return cls(
            rank=ints["RANK"],
            local_rank=ints["LOCAL_RANK"],
            world_size=ints["WORLD_SIZE"],
            local_world_size=ints["LOCAL_WORLD_SIZE"],
            group_rank=ints["GROUP_RANK"],
            group_world_size=ints["GROUP_WORLD_SIZE"],
            role_name=env.get("ROLE_NAME", "default"),
            role_rank=ints["ROLE_RANK"],
            role_world_size=ints["ROLE_WORLD_SIZE"],
            master_addr=env.get("MASTER_ADDR", ""),
            master_port=ints["MASTER_PORT"],
            run_id=env[envnames.RUN_ID],
            restart_count=ints[envnames.RESTART_COUNT],
            max_restarts=ints[envnames.MAX_RESTARTS],
            use_agent_store=env.get(envnames.USE_AGENT_STORE, "False").lower() == "true",
            error_file=env.get(envnames.ERROR_FILE) or None,
        )
