"""DDP training step by step, saving every --save-every steps and resuming from the last save: what a
restart costs is visible step by step (``bench/recovery.py`` measures it with this script).

    elastic-run --standalone --nproc-per-node 2 examples/ddp_steps.py --steps 500
    elastic-run ... --max-restarts 3 examples/ddp_steps.py --checkpoint /shared/ckpt.pt --timeline /shared/tl

Each step is one forward/backward/optimizer step of a small MLP on synthetic data, on every rank,
followed by elastic.heartbeat(). Rank 0 saves the model, the optimizer and the step every
--save-every steps; with --in-memory under elastic-run every rank keeps its state with
elastic.checkpoint after every step (or every --memory-every steps) instead (elsewhere --in-memory
changes nothing). --step-time pads each step to that many seconds, as a heavier model's would take. With
--timeline DIR every process appends JSON lines to DIR/<pid>.jsonl: when it
started (before any import), finished importing torch, joined the process group, built its model
and optimizer, restored the save, and completed each step.
"""

import time

STARTED = time.time()  # before the imports: a restart's cost includes them

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import elastic  # noqa: E402

IMPORTED = time.time()


class Timeline:
    """One JSON line per event, flushed at once (a SIGKILL may come at any step)."""

    def __init__(self, directory: str | None) -> None:
        self._file = open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a") if directory else None
        self._tags = {
            "pid": os.getpid(),
            "rank": int(os.environ.get("RANK", "0")),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "world": int(os.environ.get("WORLD_SIZE", "1")),
        }

    def __call__(self, event: str, when: float | None = None, **details: object) -> None:
        if self._file is not None:
            record = {"event": event, "t": time.time() if when is None else when, **self._tags, **details}
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--checkpoint", default=None, help="the save file (default: none)")
    parser.add_argument("--timeline", default=None, help="a directory for the JSON lines (default: none)")
    parser.add_argument("--in-memory", action="store_true", help="elastic.checkpoint after every step (elastic-run)")
    parser.add_argument("--memory-every", type=int, default=1, help="with --in-memory: a save every so many steps")
    parser.add_argument("--step-time", type=float, default=0.0, help="each step lasts at least this many seconds")
    return parser.parse_args()


def restore(path: str | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The step to go on from: the save's, else 0."""
    if not path or not os.path.exists(path):
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def restore_from_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The step to go on from: the newest copy any rank keeps (elastic.checkpoint), else 0."""
    state = elastic.checkpoint.load(replicated=True)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    partial = f"{path}.{os.getpid()}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
    os.replace(partial, path)


@elastic.record
def main() -> None:
    args = parse()
    timeline = Timeline(args.timeline)
    timeline("started", STARTED)
    timeline("imported", IMPORTED)
    dist.init_process_group("gloo")
    timeline("joined")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    timeline("built")  # the model and optimizer: torch imports more on first use (torch._dynamo)
    in_memory = args.in_memory and bool(os.environ.get("ELASTIC_CHECKPOINT_MEMORY"))
    step = restore_from_memory(net, optimizer) if in_memory else restore(args.checkpoint, net, optimizer)
    timeline("restored", step=step)
    model = DistributedDataParallel(net)
    generator = torch.Generator().manual_seed(rank)
    while step < args.steps:
        began = time.monotonic()
        x = torch.randn(32, 64, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))  # a heavier model's step
        step += 1
        elastic.heartbeat()
        timeline("step", step=step)
        if in_memory and step % args.memory_every == 0:
            state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            elastic.checkpoint.save(state, step=step)
        elif args.checkpoint and rank == 0 and step % args.save_every == 0:
            save(args.checkpoint, net, optimizer, step)
    if rank == 0:
        print(f"{step} steps on {world} ranks, last loss {loss.item():.4f}", flush=True)
    del model, optimizer, loss  # DDP's reducer goes before the group (see ddp_train.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
