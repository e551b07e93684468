"""A worker for the restart-count tests.

    counted.py OUT_DIR --fail RANK@COUNT[,RANK@COUNT...] [--run SECONDS]

Records OUT_DIR/<restart>-<rank>-<pid>.json (its rank, world size, restart count and budget), then
exits 1 if (RANK, TORCHELASTIC_RESTART_COUNT) is in the plan -- once every rank of that restart has
recorded (at most 10 s) -- else lives SECONDS and exits 0.
"""

import argparse
import glob
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail", default="")
parser.add_argument("--run", type=float, default=0.5)
args = parser.parse_args()
env = os.environ
rank, restart = int(env["RANK"]), int(env["TORCHELASTIC_RESTART_COUNT"])
record = {
    "rank": rank,
    "world_size": int(env["WORLD_SIZE"]),
    "restart": restart,
    "group_rank": int(env["GROUP_RANK"]),
    "max_restarts": int(env["TORCHELASTIC_MAX_RESTARTS"]),
    "pid": os.getpid(),
    "at": time.time(),
}
path = os.path.join(args.out, f"{restart}-{rank}-{os.getpid()}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(record, handle)
os.replace(path + ".tmp", path)
plan = {tuple(map(int, item.split("@"))) for item in args.fail.split(",") if item}
if (rank, restart) in plan:
    # every rank of this restart recorded first (within 10 s): on a loaded machine a peer still
    # starting would be stopped by this failure before it could say what it saw
    deadline = time.monotonic() + 10.0
    while len(glob.glob(os.path.join(args.out, f"{restart}-*-*.json"))) < record["world_size"]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    print(f"planned failure of rank {rank} at restart {restart}", file=sys.stderr, flush=True)
    sys.exit(1)
time.sleep(args.run)
