"""DistributedDataParallel on synthetic data, with a checkpoint each epoch and resume after a restart.

    elastic-run --standalone --nproc-per-node 2 examples/ddp_train.py
    elastic-run ... --max-restarts 1 examples/ddp_train.py --checkpoint /shared/ckpt.pt --crash-at-epoch 3

Each rank trains a linear model y = Xw on its shard of a fixed synthetic dataset; the loss falls
epoch by epoch. Rank 0 writes the checkpoint (model, optimizer, next epoch) after every epoch; on
start every rank resumes from it if it exists. --crash-at-epoch N makes rank 1 fail once (on the
first attempt) in epoch N, to show the restart picking up where the job left off.
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import elastic


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default: none)")
    parser.add_argument("--crash-at-epoch", type=int, default=None)
    return parser.parse_args()


def data(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=generator)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(1024, 1, generator=generator)
    return x[rank::world], y[rank::world]


@elastic.record
def main() -> None:
    args = parse()
    env = elastic.WorkerEnv.from_environ()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
        if env.rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {start}", flush=True)
    x, y = data(dist.get_rank(), dist.get_world_size())
    for epoch in range(start, args.epochs):
        if epoch == args.crash_at_epoch and env.rank == 1 and env.restart_count == 0:
            raise RuntimeError(f"simulated crash of rank 1 in epoch {epoch}")
        for batch in range(0, len(x), 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[batch : batch + 32]), y[batch : batch + 32])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            total = torch.nn.functional.mse_loss(model(x), y).reshape(1)
        dist.all_reduce(total)
        total /= dist.get_world_size()
        if env.rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} loss {total.item():.4f}", flush=True)
            if args.checkpoint:
                partial = args.checkpoint + ".tmp"
                torch.save(
                    {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                    partial,
                )
                os.replace(partial, args.checkpoint)
        dist.barrier()
    # Drop DDP's reducer (it holds gloo work with tensors) before the group goes: left to the
    # interpreter's exit, gloo's threads can be torn down with work in hand and abort the process
    # ("terminate called without an active exception", about 1 run in 12 here, under torchrun too).
    del model, optimizer, total, loss
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
