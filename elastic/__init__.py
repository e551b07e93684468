"""The small public API for code running under elastic-run: am I launched, where do I stand, what
does the job look like, an error-recording decorator, and heartbeats for hang detection."""

from .heartbeat import heartbeat, phase
from .jobstate import JobView, NodeView, get_state
from .launch import LaunchConfig, elastic_launch
from .record import record
from .worker import NotLaunchedError, WorkerEnv, is_torchelastic_launched

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
]
