"""A worker that says whether its round's store holds what the last round's workers wrote.

argv[1]: a directory. Every worker writes the key ``left-by`` (its pid) into the default group's
store and records, in ``<dir>/seen-<rank>-<pid>``, the value it found there before (``none`` in a
store of its own). In the first round, rank 1's worker then fails (exit 1) while rank 0's waits,
healthy, for its agent to restart it for the next round. Later rounds end with exit 0.
"""

import os
import sys
import time

import torch.distributed as dist

out = sys.argv[1]
failed = os.path.join(out, "failed")
first_round = not os.path.exists(failed)  # read before the barriers, after which rank 1 writes it
dist.init_process_group("gloo")
rank, store = dist.get_rank(), dist.distributed_c10d._get_default_store()
before = store.get("left-by").decode() if store.check(["left-by"]) else "none"
with open(os.path.join(out, f"seen-{rank}-{os.getpid()}"), "w") as seen:
    seen.write(before)
dist.barrier()  # both looked before either writes
store.set("left-by", str(os.getpid()))
dist.barrier()
if first_round:
    if rank == 1:
        open(failed, "w").close()
        sys.exit(1)
    time.sleep(600)  # healthy, until its agent restarts it for the next round (the test ends it before)
dist.destroy_process_group()
