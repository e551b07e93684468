"""A worker for the fault tests that fails as a collective does when a peer's machine dies: it
records its start (as life.py), lives, and exits 1 once OUT_DIR/peer-lost exists, in the job's
first attempt only (the restarted workers live on).

    fragile.py OUT_DIR SECONDS
"""

import time

STARTED = time.time()

import os  # noqa: E402
import sys  # noqa: E402

from jobclock import record_start  # noqa: E402

out, seconds = sys.argv[1], float(sys.argv[2])
start = record_start(out, STARTED)
first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
while time.time() < start + seconds:
    if first_attempt and os.path.exists(os.path.join(out, "peer-lost")):
        sys.exit(1)
    time.sleep(0.05)
