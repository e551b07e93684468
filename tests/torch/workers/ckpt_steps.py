"""A worker that keeps its state with elastic.checkpoint: it loads what there is, then runs steps,
saving after each; it records what it loaded and how long loading took.

argv: OUT STEPS [DIE_RANK DIE_AT [replicated]]: DIE_RANK SIGKILLs itself in attempt 0 after its
save of step DIE_AT (a rank of -1 never dies). With ``replicated`` the state is the same on
every rank and load(replicated=True) runs after init_process_group (gloo)."""

import datetime
import json
import os
import signal
import sys
import time

import torch

import elastic.checkpoint as ckpt

out, steps = sys.argv[1], int(sys.argv[2])
die_rank, die_at = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (-1, -1)
replicated = len(sys.argv) > 5 and sys.argv[5] == "replicated"
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if replicated:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
started = time.perf_counter()
state = ckpt.load(replicated=replicated)
took = time.perf_counter() - started
loaded = None if state is None else {"step": state["step"], "value": float(state["weights"][0])}
record = {"rank": rank, "attempt": attempt, "loaded": loaded, "load_s": took, "pid": os.getpid()}
record["memory"] = os.environ["ELASTIC_CHECKPOINT_MEMORY"]
with open(os.path.join(out, f"{attempt}-{rank}.json"), "w") as f:
    json.dump(record, f)
first = 0 if state is None else state["step"] + 1
owner = 0 if replicated else rank


def others_saved() -> bool:
    """Whether every other rank of this attempt has saved once (under load a rank can start a tenth
    of a second after another: the dying rank waits for them, so each has a save to come back to)."""
    marks = [os.path.join(out, f"saved-{attempt}-{r}") for r in range(int(os.environ["WORLD_SIZE"])) if r != rank]
    return all(os.path.exists(mark) for mark in marks)


for step in range(first, steps):
    weights = torch.full((1024,), float(step * 100 + owner))
    ckpt.save({"weights": weights, "step": step, "note": f"rank {owner}"}, step=step)
    if step == first:
        open(os.path.join(out, f"saved-{attempt}-{rank}"), "w").close()
    if attempt == 0 and rank == die_rank and step == die_at:
        deadline = time.monotonic() + 60
        while not others_saved() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)
if replicated:
    dist.destroy_process_group()
