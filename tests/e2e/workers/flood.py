"""A worker that writes as fast as it can to stdout and stderr until it is stopped, ignoring
SIGTERM for a moment so that its agent's close-down runs while its pipes are busy."""

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda signum, frame: None)  # stopped by the grace period's SIGKILL
line = f"rank {os.environ.get('RANK')} " + "x" * 200 + "\n"
with open(os.path.join(sys.argv[1], f"{os.environ.get('RANK')}.started"), "w"):
    pass
while True:
    sys.stdout.write(line * 20)
    sys.stderr.write(line)
    sys.stdout.flush()
    time.sleep(0)
