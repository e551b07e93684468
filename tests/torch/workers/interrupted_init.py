"""A gloo rank that joins a world of 2 on ``tcp://127.0.0.1:PORT`` and all-reduces once; with
``--interrupted`` it first has an init_process_group fail in its rendezvous (no store answers on
``DEAD_PORT``), as a kept process's does when its round ends under it, and tears down as
``elastic.inprocess`` does before calling ``train`` again.

argv: RANK PORT DEAD_PORT [--interrupted]"""

import datetime
import sys

import torch
import torch.distributed as dist

from elastic.inprocess import _tear_down

rank, port, dead = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if "--interrupted" in sys.argv:
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{dead}", rank=1, world_size=2, timeout=datetime.timedelta(seconds=1)
        )
    except Exception as exc:  # noqa: BLE001 -- the point: it failed in its rendezvous
        print(f"the first init failed: {type(exc).__name__}", flush=True)
    else:
        raise SystemExit("the first init should have failed")
    _tear_down()
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=10)
)
value = torch.ones(1)
dist.all_reduce(value)
print(f"rank {rank}: {value.item():g}", flush=True)
dist.destroy_process_group()
