"""Records which signal it gets (``<dir>/<RANK>.signal``), after saying it is ready (``<RANK>.ready``,
holding its pid). ``signalled.py DIR`` exits on the signal; ``signalled.py DIR --stay`` records it
and carries on, as a worker stuck in a collective would (only SIGKILL ends it then)."""

import os
import signal
import sys
import time

where = sys.argv[1]
stay = "--stay" in sys.argv[2:]
rank = os.environ["RANK"]


def handle(signum, frame):
    with open(os.path.join(where, f"{rank}.signal"), "w") as handle:
        handle.write(signal.Signals(signum).name)
    if not stay:
        sys.exit(0)


for name in ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP", "SIGQUIT"):
    signal.signal(getattr(signal, name), handle)
with open(os.path.join(where, f"{rank}.ready"), "w") as ready:
    ready.write(str(os.getpid()))
time.sleep(120)
