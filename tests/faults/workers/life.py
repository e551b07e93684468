"""A worker for the fault tests: it records when it started and with what ranks, then lives.

    life.py OUT_DIR SECONDS

Writes OUT_DIR/w-<pid>.json (``jobclock.record_start``: pid, ranks, world size, restart count, start) and then
lives until SECONDS have passed since the *job's first* worker started (OUT_DIR/t0), so that a
group restarted late still ends with the others.
"""

import time

STARTED = time.time()  # before anything else: the start time the split-brain window is measured from

import sys  # noqa: E402

from jobclock import record_start  # noqa: E402

out, seconds = sys.argv[1], float(sys.argv[2])
start = record_start(out, STARTED)
while time.time() < start + seconds:
    time.sleep(0.05)
