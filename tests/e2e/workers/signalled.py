"""Records which signal it gets (``<dir>/<RANK>.signal``), after saying it is ready (``<RANK>.ready``)."""

import os
import signal
import sys
import time

where = sys.argv[1]
rank = os.environ["RANK"]


def handle(signum, frame):
    with open(os.path.join(where, f"{rank}.signal"), "w") as handle:
        handle.write(signal.Signals(signum).name)
    sys.exit(0)


for name in ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP", "SIGQUIT"):
    signal.signal(getattr(signal, name), handle)
open(os.path.join(where, f"{rank}.ready"), "w").close()
time.sleep(120)
