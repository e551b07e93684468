"""A worker for the operations tests: runs --run seconds; --fail-rank R exits 1 after --fail-after
seconds on the first attempt; --hang-rank R beats every 0.2 s (elastic.heartbeat) and stops beating
after --hang-after seconds on the second attempt; on SIGTERM it lingers --linger seconds before it
exits (a slow save); writes <out>/<rank>.<attempt>.<pid> when it starts."""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--run", type=float, default=60)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-after", type=float, default=1.0)
parser.add_argument("--linger", type=float, default=0.0)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-after", type=float, default=2.0)
args = parser.parse_args()
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def linger(signum, frame):
    time.sleep(args.linger)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, linger)  # before the file that says it started: a test may signal it then
open(os.path.join(args.out, f"{rank}.{attempt}.{os.getpid()}"), "w").close()
if rank == args.fail_rank and attempt == 0:
    time.sleep(args.fail_after)
    sys.exit(1)
if args.hang_rank >= 0:
    import elastic

    started = time.monotonic()
    while time.monotonic() - started < args.run:
        if not (rank == args.hang_rank and attempt == 1 and time.monotonic() - started > args.hang_after):
            elastic.heartbeat()
        time.sleep(0.2)
time.sleep(args.run)
