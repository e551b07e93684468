"""An unmodified DDP script: no import of this project, no heartbeat, no checkpoint -- what most
users run. Each rank appends a JSON line per step to DIR/<pid>.jsonl (``--timeline DIR``) with the
wall time, so a test compares the launcher's account with the workers' own clocks.

    elastic-run ... plain_ddp.py --steps 200 --step-time 0.03 --timeline DIR
"""

import time

STARTED = time.time()  # before the imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.03)
    parser.add_argument("--timeline", required=True)
    args = parser.parse_args()
    tags = {
        "pid": os.getpid(),
        "rank": int(os.environ["RANK"]),
        "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    }
    with open(os.path.join(args.timeline, f"{os.getpid()}.jsonl"), "a") as timeline:

        def note(event: str, **details: object) -> None:
            timeline.write(json.dumps({"event": event, "t": time.time(), **tags, **details}) + "\n")
            timeline.flush()

        note("started", t0=STARTED)
        dist.init_process_group("gloo")
        model = DistributedDataParallel(torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(args.steps):
            began = time.monotonic()
            optimizer.zero_grad()
            model(torch.rand(8, 16)).sum().backward()
            optimizer.step()
            time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))
            note("step", step=step)
        dist.destroy_process_group()
        note("done")


if __name__ == "__main__":
    main()
