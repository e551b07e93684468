"""A gloo worker that times its init_process_group and says what the store holds: rank 0 comes up
``delay`` seconds after the others (the order in which a store hosted by rank 0 costs the most),
and every rank leaves a key in the store that the next attempt must not see.

argv: OUT_DIR DELAY [FAIL_RANK [LINGER WORLD]]: FAIL_RANK exits 1 in attempt 0 after its record is
written; in a world of WORLD ranks every rank then stays LINGER seconds (for a test to end that round)."""

import datetime
import json
import os
import sys
import time

import torch.distributed as dist

from launcher.hangs.procstat import run_delay

out, delay = sys.argv[1], float(sys.argv[2])
fail_rank = int(sys.argv[3]) if len(sys.argv) > 3 else -1
linger, linger_world = (float(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (0.0, 0)
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if rank == 0:
    time.sleep(delay)


def waited() -> float:
    """Seconds this (main) thread has waited for a CPU while runnable."""
    return run_delay(os.getpid()) or 0.0


start, waited_before = time.time(), waited()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
end, starved = time.time(), waited() - waited_before
store = dist.distributed_c10d._get_default_store()
earlier = [a for a in range(attempt) if store.check([f"attempt-{a}-rank-{rank}"])]
store.set(f"attempt-{attempt}-rank-{rank}", "here")
dist.barrier()
record = {
    "rank": rank,
    "attempt": attempt,
    "start": start,
    "end": end,
    "starved": starved,
    "earlier_keys": earlier,
    "agent_store": os.environ["TORCHELASTIC_USE_AGENT_STORE"],
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    "world": dist.get_world_size(),
    "pid": os.getpid(),
}
name = os.path.join(out, f"{attempt}-{rank}-{os.getpid()}")
with open(name + ".tmp", "w") as f:  # written whole, then renamed: the test reads *.json while it runs
    json.dump(record, f)
os.replace(name + ".tmp", name + ".json")
if record["world"] == linger_world:
    time.sleep(linger)
dist.destroy_process_group()
if attempt == 0 and rank == fail_rank:
    sys.exit(1)
