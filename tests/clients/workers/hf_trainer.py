"""A Hugging Face Trainer script: a tiny model, a few steps on CPU with gloo.

Each process appends ``<process index> <world size> <steps>`` to ``<dir>/ranks`` once trained."""

import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments


class TinyConfig(PretrainedConfig):
    model_type = "tiny"


class Tiny(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.layer(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


class Ones(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        return {"x": torch.ones(4), "labels": torch.tensor(1.0)}


def main() -> None:
    marks = Path(sys.argv[1])
    args = TrainingArguments(
        output_dir=str(marks / "out"),
        max_steps=4,
        per_device_train_batch_size=4,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=Tiny(TinyConfig()), args=args, train_dataset=Ones())
    trainer.train()
    with open(marks / "ranks", "a") as out:
        out.write(f"{trainer.args.process_index} {trainer.args.world_size} {trainer.state.global_step}\n")


if __name__ == "__main__":
    main()
