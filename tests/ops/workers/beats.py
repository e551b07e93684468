"""A worker that calls elastic.heartbeat() every 50 ms until --seconds pass or the file --stop exists.

--fail-once R   rank R exits 1 after a second, on the first attempt only (a restart of the job's budget)
--hang-once R   rank R stops calling the API after a second, on the first attempt only (a hang)
"""

import argparse
import os
import sys
import time

import elastic

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60.0)
parser.add_argument("--stop", default="")
parser.add_argument("--fail-once", type=int, default=-1)
parser.add_argument("--hang-once", type=int, default=-1)
args = parser.parse_args()
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
started = time.monotonic()
while time.monotonic() - started < args.seconds and not (args.stop and os.path.exists(args.stop)):
    elastic.heartbeat()
    if attempt == 0 and time.monotonic() - started > 1.0:
        if rank == args.fail_once:
            sys.exit(1)
        if rank == args.hang_once:
            time.sleep(3600)
    time.sleep(0.05)
