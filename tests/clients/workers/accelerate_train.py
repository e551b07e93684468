"""An accelerate script as its tutorial writes one: prepare, a few steps, wait for everyone.

Each process appends ``<rank> <processes> <run id>`` to ``<dir>/ranks`` once trained."""

import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(3):
        loss = model(torch.ones(2, 4)).sum()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.wait_for_everyone()
    with open(Path(sys.argv[1]) / "ranks", "a") as out:
        out.write(f"{accelerator.process_index} {accelerator.num_processes} {os.environ['TORCHELASTIC_RUN_ID']}\n")


if __name__ == "__main__":
    main()
