"""One node's worker processes: their environment (``env``), the group that starts, watches and
stops them (``group``), the reaper that outlives the agent, error files, NUMA binding and the
process that runs a Python function entrypoint (``fn_worker``)."""
