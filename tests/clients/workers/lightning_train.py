"""A Lightning script as its docs write one for a launcher that starts the processes: the Trainer's
devices and nodes read from the environment the launcher exports (so the product is the world size
whatever round the job is in), DDP on CPU, a few steps.

Each process appends ``<global rank> <world size> <steps>`` to ``<dir>/ranks`` once trained."""

import os
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=int(os.environ["WORLD_SIZE"]) // per_node,
        strategy="ddp",
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = DataLoader(TensorDataset(torch.ones(64, 4)), batch_size=4)
    trainer.fit(Tiny(), data)
    with open(Path(sys.argv[1]) / "ranks", "a") as out:
        out.write(f"{trainer.global_rank} {trainer.world_size} {trainer.global_step}\n")


if __name__ == "__main__":
    main()
