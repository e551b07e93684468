"""A DDP script shaped like PyTorch's multinode tutorial: ``init_process_group`` at the start, a
``Trainer`` holding the DDP model kept alive to the end of ``main()``, ``destroy_process_group()``
called before ``main()`` returns -- on gloo (CPU).

    elastic-run ... tutorial_ddp.py --epochs 3 [--stuck-rank R[,R...]] [--beats] [--save-seconds S] [--out DIR]

``--stuck-rank R``: rank R (each rank named) deadlocks as ``main()``'s locals are freed, the way PyTorch's own
teardown can (the main thread holds the GIL in a C call that never returns): an object kept to
the end of ``main()`` locks a pthread mutex twice in its destructor, through ``ctypes.PyDLL`` (the
GIL is held for the call). ``--save-seconds S``: rank 0 writes a file for S seconds after the
others left (work after the last step: never stuck). ``--linger-rank R --linger S``: rank R sleeps S
seconds after leaving the process group (idle). ``--hang-in-recv``: after training, every rank
waits inside ``main()`` for a message its neighbour never sends (DIR/<rank>-waits.json written
first): a job hung in a collective, quiet, whose stacks are in the script. ``--beats``: each step ends
with ``elastic.heartbeat()`` (the agent learns a timeout of about a second from these fast steps).
``--out DIR``: each rank writes DIR/<rank>-<restart>.json with its steps once it left the process group.
"""

import argparse
import ctypes
import json
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

import elastic


class Deadlock:
    """Locks a default pthread mutex twice when freed, the GIL held: the process never ends by itself."""

    def __init__(self) -> None:
        self._mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
        self._libc = ctypes.PyDLL(None)

    def __del__(self) -> None:
        print(f"[rank {os.environ['RANK']}] freeing main()'s locals", flush=True)
        self._libc.pthread_mutex_lock(self._mutex)
        self._libc.pthread_mutex_lock(self._mutex)


class Trainer:
    def __init__(self) -> None:
        self.rank = int(os.environ["RANK"])
        self.model = torch.nn.Linear(20, 1)
        self.ddp = DDP(self.model)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=1e-3)
        self.steps = 0
        self.teardown = None

    def train(self, epochs: int, steps: int, beats: bool = False) -> None:
        for epoch in range(epochs):
            for _ in range(steps):
                self.optimizer.zero_grad()
                loss = F.mse_loss(self.ddp(torch.rand(8, 20)), torch.rand(8, 1))
                loss.backward()
                self.optimizer.step()
                self.steps += 1
                if beats:
                    elastic.heartbeat()
            if self.rank == 0:
                print(f"epoch {epoch} done", flush=True)


def hang_in_recv(rank: int, out: str) -> None:
    with open(os.path.join(out, f"{rank}-waits.json"), "w") as file:
        json.dump({"rank": rank, "pid": os.getpid()}, file)
    torch.distributed.recv(torch.zeros(1), src=(rank + 1) % torch.distributed.get_world_size())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--stuck-rank", default="", help="ranks that deadlock as main() returns: R[,R...]")
    parser.add_argument("--save-seconds", type=float, default=0.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--linger-rank", type=int, default=-1)
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--hang-in-recv", action="store_true")
    parser.add_argument("--beats", action="store_true")
    args = parser.parse_args()
    init_process_group(backend="gloo")
    trainer = Trainer()
    if str(trainer.rank) in args.stuck_rank.split(","):
        trainer.teardown = Deadlock()  # freed with the trainer, as main() returns
    trainer.train(args.epochs, args.steps, args.beats)
    if args.hang_in_recv:
        hang_in_recv(trainer.rank, args.out)
    destroy_process_group()
    if trainer.rank == 0 and args.save_seconds:  # a large save after the others left: it writes all along
        ends = time.monotonic() + args.save_seconds
        with open(os.path.join(args.out or ".", "final.bin"), "wb") as file:
            while time.monotonic() < ends:
                file.write(os.urandom(1 << 16))
                file.flush()
                time.sleep(0.01)
    if trainer.rank == args.linger_rank:
        time.sleep(args.linger)  # idle after the others, as a rank waiting on a peer's save: not stuck while it works
    if args.out:
        restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
        with open(os.path.join(args.out, f"{trainer.rank}-{restart}.json"), "w") as file:
            json.dump({"rank": trainer.rank, "steps": trainer.steps, "pid": os.getpid()}, file)
    print(f"[rank {trainer.rank}] training done", flush=True)


if __name__ == "__main__":
    main()
