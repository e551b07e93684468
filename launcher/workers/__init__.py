"""One node's worker processes: their environment (``env``), the group that starts, watches and
stops them (``group``), error files in torch's layout (``errorfile``), NUMA binding (``numa``),
a function entrypoint's worker (``fn_worker``), what it is handed (``payload``) and the launch
script's guard it imports (``mainguard``), and the agent's side of ``elastic.checkpoint``
(``checkpoints``: state in shared memory, copied to --checkpoint-dir)."""
