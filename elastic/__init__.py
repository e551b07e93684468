"""The small public API for code running under elastic-run: am I launched, where do I stand, what
does the job look like, an error-recording decorator, heartbeats for hang detection, and own-work
timing for straggler scores.

What every worker uses (the environment, ``record``, heartbeats) is imported at once and is light;
reading a job's state and launching from Python (which need the etcd client and gRPC) are imported
on first use, so a worker that does not use them never loads gRPC.
"""

import importlib

from .heartbeat import heartbeat, phase
from .pace import section, watch_ddp
from .record import record
from .worker import NotLaunchedError, WorkerEnv, is_torchelastic_launched

_LAZY = {
    "get_state": "jobstate",
    "JobView": "jobstate",
    "NodeView": "jobstate",
    "LaunchConfig": "launch",
    "elastic_launch": "launch",
    "inprocess": "inprocess",
    "RoundInterrupted": "inprocess",
}

__all__ = [
    "is_torchelastic_launched",
    "WorkerEnv",
    "NotLaunchedError",
    "record",
    "get_state",
    "JobView",
    "NodeView",
    "LaunchConfig",
    "elastic_launch",
    "heartbeat",
    "phase",
    "section",
    "watch_ddp",
    "inprocess",
    "RoundInterrupted",
]


def __getattr__(name: str):
    if name == "checkpoint":  # a module of its own: elastic.checkpoint.save / load
        return importlib.import_module(".checkpoint", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
