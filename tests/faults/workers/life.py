"""A worker for the fault tests: it records when it started and with what ranks, then lives.

    life.py OUT_DIR SECONDS

Writes OUT_DIR/w-<pid>.json (pid, ranks, world size, restart count, process start time) and then
ticks until SECONDS have passed since the *job's first* worker started (OUT_DIR/t0), so that a
group restarted late still ends with the others.
"""

import time

STARTED = time.time()  # before anything else: the start time the split-brain window is measured from

import json
import os
import sys

out, seconds = sys.argv[1], float(sys.argv[2])
env = os.environ
record = {
    "pid": os.getpid(),
    "created": STARTED,
    "rank": int(env["RANK"]),
    "group_rank": int(env["GROUP_RANK"]),
    "world_size": int(env["WORLD_SIZE"]),
    "restart": int(env["TORCHELASTIC_RESTART_COUNT"]),
    "master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
}
t0 = os.path.join(out, "t0")
try:
    with open(t0, "x") as handle:
        handle.write(str(time.time()))
except FileExistsError:
    pass
path = os.path.join(out, f"w-{os.getpid()}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(record, handle)
os.replace(path + ".tmp", path)
with open(t0) as handle:
    try:
        start = float(handle.read() or time.time())
    except ValueError:
        start = time.time()
while time.time() < start + seconds:
    time.sleep(0.05)
