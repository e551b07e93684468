"""Hangs: a rank that stops making progress, found, agreed on and reported. Read in this order:

- ``record``: the heartbeat record a worker shares with its agent (``elastic.heartbeat`` writes it,
  the agent maps it: no system call, no etcd);
- ``rules``: pure -- when a rank counts as hung (first-heartbeat, learned steady or phase timeout),
  which rank of the job to blame, and the line every node prints;
- ``watch``: the agent's watch over one round, ticked from the round's monitor loop;
- ``cases``: the protocol by which the nodes agree on one verdict (keys: ``rendezvous.job.hangboard``);
- ``stacks``: the culprit's stacks, dumped before the group stops, and the ``worker_hung`` record.

The agent then handles a hang as a failure: ``launcher.restart``. Kept light: every worker imports
``record`` through ``elastic.heartbeat``.
"""
