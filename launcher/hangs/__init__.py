"""Hangs: a rank that stops making progress, found, agreed on and reported. Read in this order:

- ``beatfile``: the heartbeat record a worker shares with its agent (``elastic.heartbeat`` writes it,
  the agent maps it: no system call, no etcd);
- ``steptimes``: pure -- the intervals between a rank's heartbeats and their healthy step (the mean
  without its stalls), which the rules learn from and the goodput account reads;
- ``hangrules``: pure -- when a rank counts as hung (first-heartbeat, learned steady, phase or
  end-of-job timeout), and what its agent reports of it;
- ``blame``: pure -- what a rank's main thread is doing, from its stack: waiting in a
  torch.distributed call or not (the tie-breaker);
- ``verdict``: pure -- which rank of the job to blame (or a deadlock), and the lines every node prints;
- ``hangwatch``: the agent's watch over one round, ticked from the round's monitor loop, and what
  the round's workers did (``RoundWork``: first and last heartbeat, beats, healthy step, own work);
- ``cases``: the protocol by which the nodes agree on one verdict (keys: ``rendezvous.job.hangboard``);
- ``stacks``: taking the ranks' stacks when a hang is suspected; the console lines and the
  ``worker_hung`` record once it is decided;
- ``procstat``: what the kernel says of a worker's processes (CPU, I/O, waits for a CPU);
- ``exitstuck``: a worker stuck at exit (alive and doing nothing after every other rank exited 0),
  named with its native stack and ended: the round succeeds;
- ``native``: a live process's native and Python stack read from outside (py-spy, gdb), and whether
  it is past its script's code (a round every rank of which is stuck at exit).

The agent then handles a hang as a failure: ``launcher.restart``. Kept light: every worker imports
``beatfile`` through ``elastic.heartbeat``.
"""
