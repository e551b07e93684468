"""Epoch-based DDP training shaped like the common tutorial scripts: a synthetic dataset behind a
``DataLoader`` (``pin_memory=True``, a ``DistributedSampler``), a snapshot written by rank 0 after
every epoch and loaded at start, the trainer (and its DDP model) kept to the end of ``main()``,
``destroy_process_group`` before ``main()`` returns -- on gloo (CPU).

    elastic-run --nnodes 2:3 --nproc-per-node 1 ... examples/ddp_epochs.py --epochs 6

With --epoch-seconds each epoch is paced to take about that long (the steps sleep between them), so
that a fault can be injected mid-epoch. Rank 0 prints ``epoch N done`` after each epoch and every
rank ``training done`` once it left the process group. With --heartbeat each step calls
``elastic.heartbeat()`` (so that a hung rank is found); with --timeline DIR every process appends
JSON lines to DIR/<pid>.jsonl: started, each step, and done (after ``destroy_process_group``).
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Samples(Dataset):
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.rand(size, 20, generator=generator)
        self.targets = torch.rand(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]


class Timeline:
    """One JSON line per event, flushed at once (a SIGKILL may come at any step)."""

    def __init__(self, directory: str | None) -> None:
        self._file = open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a") if directory else None

    def __call__(self, event: str, **details: object) -> None:
        if self._file is not None:
            record = {"event": event, "t": time.time(), "pid": os.getpid(), "rank": int(os.environ["RANK"])}
            self._file.write(json.dumps({**record, **details}) + "\n")
            self._file.flush()


def _beat() -> None:
    import elastic

    elastic.heartbeat()


class Trainer:
    def __init__(self, loader: DataLoader, snapshot: str, pace: float, timeline: Timeline, beat: bool) -> None:
        self.timeline = timeline
        self.beat = beat
        self.rank = int(os.environ["RANK"])
        self.loader = loader
        self.snapshot = snapshot
        self.pace = pace
        self.model = torch.nn.Linear(20, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.epoch = 0
        if os.path.exists(snapshot):
            state = torch.load(snapshot, weights_only=True)
            self.model.load_state_dict(state["model"])
            self.epoch = state["epochs_run"]
            print(f"[rank {self.rank}] resuming from the snapshot at epoch {self.epoch}", flush=True)
        self.ddp = DDP(self.model)

    def train(self, epochs: int) -> None:
        for epoch in range(self.epoch, epochs):
            self.loader.sampler.set_epoch(epoch)
            batches = len(self.loader)
            for source, target in self.loader:
                self.optimizer.zero_grad()
                loss = F.mse_loss(self.ddp(source), target)
                loss.backward()
                self.optimizer.step()
                if self.pace:
                    time.sleep(self.pace / batches)
                if self.beat:
                    _beat()
                self.timeline("step", epoch=epoch)
            if self.rank == 0:
                torch.save({"model": self.model.state_dict(), "epochs_run": epoch + 1}, self.snapshot + ".tmp")
                os.replace(self.snapshot + ".tmp", self.snapshot)  # whole or not at all for a rank reading it
                print(f"epoch {epoch} done (loss {loss.item():.4f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    parser.add_argument("--snapshot", default="snapshot.pt")
    parser.add_argument("--timeline", default=None, help="a directory for the JSON lines (default: none)")
    parser.add_argument("--heartbeat", action="store_true", help="elastic.heartbeat() after every step")
    args = parser.parse_args()
    timeline = Timeline(args.timeline)
    timeline("started")
    init_process_group(backend="gloo")
    dataset = Samples(args.samples)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, pin_memory=True, shuffle=False, sampler=DistributedSampler(dataset)
    )
    trainer = Trainer(loader, args.snapshot, args.epoch_seconds, timeline, args.heartbeat)
    trainer.train(args.epochs)
    destroy_process_group()  # the trainer and its DDP model live on to the end of main(), as in the tutorial
    timeline("done")
    print(f"[rank {os.environ['RANK']}] training done", flush=True)


if __name__ == "__main__":
    main()
