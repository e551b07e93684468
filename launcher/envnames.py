"""The names of torch's ``TORCHELASTIC_*`` environment variables, spelled once: the agent exports
them (``env``), a worker reads them (``elastic.worker``, the error file), torch's log specs take
them, and the warm interpreter leaves them aside when it compares environments. Light on purpose:
every worker imports it (``elastic.worker``, ``record``)."""

from __future__ import annotations

__all__ = [
    "PREFIX",
    "RUN_ID",
    "RESTART_COUNT",
    "MAX_RESTARTS",
    "USE_AGENT_STORE",
    "ERROR_FILE",
    "SIGNALS_TO_HANDLE",
    "LOG_LINE_PREFIX_TEMPLATE",
]

PREFIX = "TORCHELASTIC_"
RUN_ID = PREFIX + "RUN_ID"  # the job's id: set in every launched worker (``is_torchelastic_launched``)
RESTART_COUNT = PREFIX + "RESTART_COUNT"  # the worker group's restarts so far
MAX_RESTARTS = PREFIX + "MAX_RESTARTS"
USE_AGENT_STORE = PREFIX + "USE_AGENT_STORE"  # "True": the workers use the store group rank 0's agent hosts
ERROR_FILE = PREFIX + "ERROR_FILE"  # where ``record`` writes a worker's failure
SIGNALS_TO_HANDLE = PREFIX + "SIGNALS_TO_HANDLE"  # the agent's own: the signals it forwards to its workers
LOG_LINE_PREFIX_TEMPLATE = PREFIX + "LOG_LINE_PREFIX_TEMPLATE"  # read from the agent's environment
