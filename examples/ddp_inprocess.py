"""DDP under ``elastic.inprocess``: the model and optimizer live outside ``train``, so after a fault
the surviving workers keep their process, their model and whatever torch built, and only the
process group is made again.

    elastic-run --nnodes 2:3 --rdzv-endpoint HOST:2379 --rdzv-id job --max-restarts 3 \\
        examples/ddp_inprocess.py --steps 2000

``train`` is called again in the same process after each fault of the job (a worker of another
rank failed, a node was lost or joined, a hang), with the new round's RANK, WORLD_SIZE and
TORCHELASTIC_RESTART_COUNT in ``os.environ``. It makes the process group again, agrees with the
others on the step to go on from (the newest any rank holds) and takes the model from the lowest
rank that holds it: a replaced rank starts from the survivors' state. With --timeline DIR each
process appends JSON lines to DIR/<pid>.jsonl (started, joined, each step). --step-time stands for
a heavier model's step, timed as the rank's own work (``elastic.section``: straggler scores); with
--slow-dir DIR a process takes twice as long a step while DIR/slow-<its pid> exists.
"""

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import elastic  # noqa: E402


def timeline(directory: str | None, event: str, **details: object) -> None:
    if directory:
        record = {
            "event": event,
            "t": time.time(),
            "pid": os.getpid(),
            "rank": int(os.environ.get("RANK", "0")),
            "world": int(os.environ.get("WORLD_SIZE", "1")),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            **details,
        }
        with open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a") as out:
            out.write(json.dumps(record) + "\n")


def slowed(directory: str | None) -> bool:
    """Whether this process is told to run at half speed (bench/goodput.py's slow node)."""
    return bool(directory) and os.path.exists(os.path.join(directory, f"slow-{os.getpid()}"))


def _graphs() -> int:
    """The graphs dynamo compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds of sleep in each step")
    parser.add_argument("--timeline", default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (dynamo, eager backend)")
    parser.add_argument("--slow-dir", default=None, help="a step takes twice --step-time while DIR/slow-<pid> exists")
    args = parser.parse_args()
    timeline(args.timeline, "started", t0=STARTED)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    compiled = torch.compile(net, backend="eager") if args.compile else net  # compiled once, in this process
    done = {"step": 0}  # kept across rounds, as the model is

    def train() -> int:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        timeline(args.timeline, "joined", step=done["step"], graphs=_graphs() if args.compile else None)
        newest = torch.tensor([done["step"], -rank])  # the newest step, and the lowest rank holding it
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        step, source = int(newest[0]), -int(newest[1])
        for tensor in net.state_dict().values():
            dist.broadcast(tensor, src=source)
        model = DistributedDataParallel(compiled)
        generator = torch.Generator().manual_seed(rank)
        while step < args.steps:
            x = torch.randn(32, 64, generator=generator)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            done["step"] = step
            elastic.heartbeat()
            timeline(args.timeline, "step", step=step)
            if args.step_time:
                with elastic.section():  # the step's own work, as a heavier model's (straggler scores)
                    time.sleep(args.step_time * (2 if slowed(args.slow_dir) else 1))
        dist.barrier()
        if args.compile:
            timeline(args.timeline, "compiled", graphs=_graphs())
        dist.destroy_process_group()
        return step

    steps = elastic.inprocess(train)
    timeline(args.timeline, "done", step=steps)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{steps} steps, in process {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
