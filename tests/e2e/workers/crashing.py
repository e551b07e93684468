"""A worker for the crash-loop tests: steps of 20 ms, each one elastic.heartbeat(); rank 1 exits 1
in step --fail-at of every attempt.

    crashing.py OUT_DIR --fail-at S [--resume] [--steps N]

--resume: the step is saved with elastic.checkpoint after every step and loaded at the start, so
each attempt goes on where the last one failed and rank 1 fails --fail-at steps further each time
(a job that makes progress between failures). Writes OUT_DIR/<restart>-<rank>.json (the step it
started from) when it starts.
"""

import argparse
import json
import os
import sys
import time

import elastic

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail-at", type=int, required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--steps", type=int, default=1000)
args = parser.parse_args()
rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
first = elastic.checkpoint.load() if args.resume else None
first = first or 0
path = os.path.join(args.out, f"{restart}-{rank}.json")
with open(path + ".tmp", "w") as handle:  # written whole, then renamed
    json.dump({"rank": rank, "restart": restart, "from": first, "at": time.time()}, handle)
os.replace(path + ".tmp", path)
for step in range(first, args.steps):
    elastic.heartbeat()
    time.sleep(0.02)
    if rank == 1 and step - first == args.fail_at:
        sys.exit(1)
    if args.resume:
        elastic.checkpoint.save(step + 1, step=step + 1)
