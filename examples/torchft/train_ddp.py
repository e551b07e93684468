"""A torchft job under elastic-run: each elastic-run job is one replica group, every group's agent
runs a Lighthouse replica beside it (--lighthouse), and the groups train one model with torchft's
Manager and DDP on gloo, stepping through quorums that survive a replica's death.

    elastic-run --rdzv-endpoint HOST:2379 --rdzv-id group-a --nproc-per-node 2 \\
        --lighthouse my-ft-job --lighthouse-min-replicas 2 examples/torchft/train_ddp.py --steps 100
    (and the same with --rdzv-id group-b, on another node or the same one with --lighthouse-port 0)

TORCHFT_LIGHTHOUSE comes from the agent. The group's TCPStore is hosted by its rank 0 at
MASTER_ADDR:MASTER_PORT (elastic-run's workers host their own store, as torchrun's do with
TORCHELASTIC_USE_AGENT_STORE=False).
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn, optim
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--out", default=None, help="append this worker's last state, as JSON, to this file")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    store = None
    if rank == 0:  # the replica group's store, which the Manager joins
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=True, wait_for_workers=False
        )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    inner = optim.SGD(model.parameters(), lr=0.05)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(),
        min_replica_size=args.min_replicas,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=os.environ["TORCHELASTIC_RUN_ID"],
        timeout=timedelta(seconds=30),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    generator = torch.Generator().manual_seed(rank)
    while manager.current_step() < args.steps:
        x = torch.rand(16, 8, generator=generator)
        optimizer.zero_grad()
        loss = (ddp(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()

    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    line = {
        "group": os.environ["TORCHELASTIC_RUN_ID"],
        "rank": rank,
        "step": manager.current_step(),
        "quorum_id": manager._quorum_id,
        "participants": manager.num_participants(),
        "checksum": round(checksum, 9),
        "lighthouse": os.environ["TORCHFT_LIGHTHOUSE"],
    }
    print(json.dumps(line), flush=True)
    if args.out:
        with open(args.out, "a") as out:
            out.write(json.dumps(line) + "\n")
    manager.shutdown(wait=False)
    del store


if __name__ == "__main__":
    main()
