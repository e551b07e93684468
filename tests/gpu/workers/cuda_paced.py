"""A DDP job on the GPU whose ranks time their own work with ``elastic.watch_ddp`` (CUDA events),
for the GPU straggler test. Each step's forward spins ``--work`` seconds of CPU time and runs a
small layer on ``cuda``; once OUT/slow-<rank> exists, that rank's forward also queues a GPU kernel
that spins ``--gpu-work`` seconds -- work the CPU never waits for, which only the GPU's own clock
sees. Gloo all-reduces the gradients (the ranks share the machine's one GPU). Each process writes
OUT/steps-<pid>.txt: a JSON line (rank, pid), then one wall-clock time a step. The job stops when
OUT/stop exists."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import elastic


def spin(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def cycles_per_second() -> float:
    """The GPU's spin rate, for ``torch.cuda._sleep``, timed by its own events: the fastest of three,
    after a spin that wakes the GPU from its idle clock (a sixth of its boost clock on an H200)."""
    torch.cuda._sleep(200_000_000)
    rates = []
    for _ in range(3):
        started, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started.record()
        torch.cuda._sleep(20_000_000)
        ended.record()
        ended.synchronize()
        rates.append(20_000_000 / (started.elapsed_time(ended) / 1000.0))
    return max(rates)


def calibrated(rank: int, world: int) -> float:
    """``cycles_per_second`` on each rank in turn: alone on the GPU, not time-sliced with the others."""
    rate = 0.0
    for turn in range(world):
        if turn == rank:
            rate = cycles_per_second()
        dist.barrier()
    return rate


class Work(torch.nn.Module):
    def __init__(self, cpu: float, gpu_cycles: int, flag: str) -> None:
        super().__init__()
        self.cpu, self.gpu_cycles, self.flag = cpu, gpu_cycles, flag

    def forward(self, x):
        spin(self.cpu)
        if os.path.exists(self.flag):
            torch.cuda._sleep(self.gpu_cycles)  # queued: the CPU goes on at once
        return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--work", type=float, default=0.02)
    parser.add_argument("--gpu-work", type=float, default=0.06)
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    flag = os.path.join(args.out, f"slow-{rank}")
    work = Work(args.work, int(args.gpu_work * calibrated(rank, dist.get_world_size())), flag)
    model = elastic.watch_ddp(DistributedDataParallel(torch.nn.Sequential(work, torch.nn.Linear(64, 64)).to(device)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    batch = torch.randn(16, 64, device=device)
    log = open(os.path.join(args.out, f"steps-{os.getpid()}.txt"), "w", buffering=1)
    log.write(json.dumps({"rank": rank, "pid": os.getpid()}) + "\n")
    stop_file = os.path.join(args.out, "stop")
    while True:
        model(batch).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        stop = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(stop)
        elastic.heartbeat()
        log.write(f"{time.time():.4f}\n")
        if stop.item() > 0:
            break
    dist.destroy_process_group()  # as the tutorials end: the DDP model lives until main() returns


if __name__ == "__main__":
    main()
