"""A gloo job whose ranks time their own work, for the straggler tests and bench/stragglers.py.

Each step spins ``--work`` seconds of CPU time (so a rank stopped or starved part of the time takes
longer on the wall clock), then meets the others in a collective: with ``--ddp`` the spin is in the
forward of a small DDP model under ``elastic.watch_ddp`` and the backward all-reduces its
gradients, else the spin is in ``elastic.section()``, followed by an all-reduce. Each
process writes ``<out>/steps-<pid>.txt``: a JSON line (rank, restart count, world size), then one
wall-clock time a step. The job stops when ``<out>/stop`` exists (the ranks agree by an all-reduce).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import elastic


def spin(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


class Spin(torch.nn.Module):
    """A layer whose forward takes ``seconds`` of CPU time: the rank's own compute."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        spin(self.seconds)
        return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--work", type=float, default=0.02)
    parser.add_argument("--ddp", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    path = os.path.join(args.out, f"steps-{os.getpid()}.txt")
    log = open(path, "w", buffering=1)
    log.write(json.dumps({"rank": rank, "restart": restart, "world": dist.get_world_size(), "pid": os.getpid()}) + "\n")
    stop_file = os.path.join(args.out, "stop")
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel

        layers = torch.nn.Sequential(Spin(args.work), torch.nn.Linear(64, 64))
        model = elastic.watch_ddp(DistributedDataParallel(layers))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        batch = torch.randn(16, 64)
    while True:
        if args.ddp:
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        else:
            with elastic.section():
                spin(args.work)
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        elastic.heartbeat()
        log.write(f"{time.time():.4f}\n")
        if flag.item() > 0:
            break
    dist.destroy_process_group()  # as the tutorials end: the DDP model lives until main() returns


if __name__ == "__main__":
    main()
