"""What the fault suite's workers (life.py, ticker.py) share: the record of a worker's start, and the
job's clock, so that a group restarted late still ends with the others."""

import json
import os
import time


def record_start(out: str, started: float) -> float:
    """Write OUT/w-<pid>.json (pid, its agent's pid, start time, ranks, world size, restart count,
    the round's master) and return when the job's first worker started (OUT/t0, written by it)."""
    env = os.environ
    record = {
        "pid": os.getpid(),
        "parent": os.getppid(),  # the agent that started it
        "created": started,
        "rank": int(env["RANK"]),
        "group_rank": int(env["GROUP_RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "restart": int(env["TORCHELASTIC_RESTART_COUNT"]),
        "master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",  # a fresh port each round
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
            return float(handle.read() or time.time())
        except ValueError:
            return time.time()
