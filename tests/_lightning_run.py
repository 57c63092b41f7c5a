"""One Lightning training run on the CPU, for tests/test_lightning.py.

Usage: python _lightning_run.py OUT_DIR MODE [CKPT]. ``MODE`` is ``default`` (a
``LightningBatchSampler`` under Lightning's default settings, built before ``fit``,
checkpoints every 3 steps), ``resume`` (the same, continued from ``CKPT``) or
``nodist`` (a plain ``BucketBatchSampler`` built in the data module's hook, with
``use_distributed_sampler=False`` and ``LengthwiseCallback``), ``lbs-nodist`` (a
``LightningBatchSampler`` built before ``fit`` under ``use_distributed_sampler=False``
and no callback: refused); ``workers`` and
``workers-resume`` are ``default`` and ``resume`` in one process with 2 loader workers.
Each rank writes what it trained to ``OUT_DIR/MODE_rankR.json``.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from lengthwise.lightning import LengthwiseCallback, LightningBatchSampler
from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.sampler import BucketBatchSampler

MAX_TOKENS = 256
PLAN = PlanConfig(max_tokens=MAX_TOKENS)
LENGTHS = np.random.default_rng(3).integers(2, 40, 120)
EPOCHS = 2


def collate(indices: list[int]) -> dict[str, torch.Tensor]:
    width = int(LENGTHS[indices].max())
    return {"idx": torch.tensor(indices), "x": torch.ones(len(indices), width)}


class Model(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(1, 1)
        self.out = out
        self.seen: list[dict] = []

    def training_step(self, batch, batch_idx):
        self.seen.append({"epoch": self.current_epoch, "step": self.global_step,
                          "idx": batch["idx"].tolist(), "tokens": batch["x"].numel()})
        x = batch["x"] * torch.arange(batch["x"].shape[1]) / batch["x"].shape[1]
        return (self.lin(x.mean(1, keepdim=True)) - 1).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        weights = [p.detach().double().flatten().tolist() for p in self.parameters()]
        with open(f"{self.out}_rank{self.global_rank}.json", "w") as fh:
            json.dump({"seen": self.seen, "weights": weights}, fh)


class Data(L.LightningDataModule):
    def train_dataloader(self):  # the process group exists here
        sampler = BucketBatchSampler(LENGTHS, PLAN, seed=3)
        return DataLoader(range(LENGTHS.size), batch_sampler=sampler, collate_fn=collate)


def main(out_dir: str, mode: str, ckpt: str | None = None) -> None:
    workers = 2 if mode.startswith("workers") else 0
    trainer_options = dict(accelerator="cpu", devices=1 if workers else 2,
                           strategy="auto" if workers else "ddp", max_epochs=EPOCHS,
                           logger=False, enable_progress_bar=False, enable_model_summary=False)
    model = Model(os.path.join(out_dir, mode))
    if mode == "nodist":
        trainer = L.Trainer(use_distributed_sampler=False, callbacks=[LengthwiseCallback()],
                            enable_checkpointing=False, **trainer_options)
        trainer.fit(model, datamodule=Data())
        return
    sampler = LightningBatchSampler(LENGTHS, PLAN, seed=3)  # before fit: no process group yet
    loader = DataLoader(range(LENGTHS.size), batch_sampler=sampler, collate_fn=collate,
                        num_workers=workers)
    if mode == "lbs-nodist":  # Lightning does not rebuild it, no callback checks it
        trainer = L.Trainer(use_distributed_sampler=False, enable_checkpointing=False,
                            **trainer_options)
        trainer.fit(model, loader)
        return
    every = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=os.path.join(out_dir, "ckpt-workers" if workers else "ckpt"), filename="{step}",
        every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(callbacks=[LengthwiseCallback(), every], **trainer_options)
    trainer.fit(model, loader, ckpt_path=ckpt)


if __name__ == "__main__":
    main(*sys.argv[1:])
