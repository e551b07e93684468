"""A worker for the fencing tests: it records its ranks, then proves it runs by ticking.

    ticker.py OUT_DIR SECONDS [STOP_SECONDS]

Writes OUT_DIR/w-<pid>.json (as life.py: pid, its agent's pid, ranks, world size, restart count,
the round's master, start time), then
appends the wall-clock time to OUT_DIR/t-<pid>.log every 10 ms until SECONDS have passed since the
job's first worker started (OUT_DIR/t0). A tick is a moment the process really ran: a frozen
process writes none. On SIGTERM it goes on ticking for STOP_SECONDS (a checkpoint written on the
way out) and then exits 0.
"""

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

out, seconds = sys.argv[1], float(sys.argv[2])
stop_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
env = os.environ
record = {
    "pid": os.getpid(),
    "parent": os.getppid(),  # the agent that started it
    "created": STARTED,
    "rank": int(env["RANK"]),
    "group_rank": int(env["GROUP_RANK"]),
    "world_size": int(env["WORLD_SIZE"]),
    "restart": int(env["TORCHELASTIC_RESTART_COUNT"]),
    "round_master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
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

end = [start + seconds]


def on_term(signum, frame):
    end[0] = min(end[0], time.time() + stop_seconds)


signal.signal(signal.SIGTERM, on_term)
ticks = open(os.path.join(out, f"t-{os.getpid()}.log"), "a", buffering=1)
while time.time() < end[0]:
    ticks.write(f"{time.time():.4f}\n")
    time.sleep(0.01)
