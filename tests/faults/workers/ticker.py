"""A worker for the fencing tests: it records its ranks, then proves it runs by ticking.

    ticker.py OUT_DIR SECONDS [STOP_SECONDS]

Writes OUT_DIR/w-<pid>.json (as life.py: ``jobclock.record_start``), then
appends the wall-clock time to OUT_DIR/t-<pid>.log every 10 ms until SECONDS have passed since the
job's first worker started (OUT_DIR/t0), or until OUT_DIR/stop exists (the test has seen what it
came for: the job ends now, not at SECONDS). A tick is a moment the process really ran: a frozen
process writes none. On SIGTERM it goes on ticking for STOP_SECONDS (a checkpoint written on the
way out) and then exits 0.
"""

import time

STARTED = time.time()

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from jobclock import record_start  # noqa: E402

out, seconds = sys.argv[1], float(sys.argv[2])
stop_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
start = record_start(out, STARTED)
end = [start + seconds]


def on_term(signum, frame):
    end[0] = min(end[0], time.time() + stop_seconds)


signal.signal(signal.SIGTERM, on_term)
ticks = open(os.path.join(out, f"t-{os.getpid()}.log"), "a", buffering=1)
stop, tick = os.path.join(out, "stop"), 0
while time.time() < end[0] and not (tick % 10 == 0 and os.path.exists(stop)):
    ticks.write(f"{time.time():.4f}\n")
    time.sleep(0.01)
    tick += 1
