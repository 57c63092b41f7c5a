"""docs/pytorch.md's own Accelerate loop, as one rank of ``accelerate launch`` (2 CPU processes).

Usage: accelerate launch --multi_gpu --num_processes 2 _accelerate_loop.py OUT_DIR. Each
rank writes the indices it trained, its steps and its weights to ``OUT_DIR/rankR.json``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

import lengthwise
from lengthwise.planning.config import PlanConfig

VOCAB, ACCUM, MAX_TOKENS = 32, 2, 256
LENGTHS = np.random.default_rng(7).integers(2, 40, 90)


def main(out_dir: str) -> None:
    try:  # what a sampler planned for one process does under this launcher
        lengthwise.BucketBatchSampler(LENGTHS, PlanConfig(max_tokens=MAX_TOKENS), num_replicas=1,
                                      rank=0)
        refused = None
    except ValueError as exc:
        refused = str(exc)

    # the recipe: cpu=True where there is no accelerator, so both processes are seen
    accelerator = Accelerator(cpu=not torch.accelerator.is_available(),
                              gradient_accumulation_steps=ACCUM)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    sampler = lengthwise.BucketBatchSampler(LENGTHS,
                                            PlanConfig(max_tokens=MAX_TOKENS, grad_accum=ACCUM),
                                            num_replicas=accelerator.num_processes,
                                            rank=accelerator.process_index)
    data = [{"input_ids": np.random.default_rng(i).integers(1, VOCAB, n).tolist(), "index": i}
            for i, n in enumerate(LENGTHS)]
    collate = sampler.collator(pad_token_id=0, metadata=False, fields=("input_ids",))
    loader = prepare_data_loader(
        DataLoader(data, batch_sampler=sampler,
                   collate_fn=lambda s: {**collate(s), "index": [x["index"] for x in s]}),
        accelerator.device, num_processes=1, process_index=0, put_on_device=True)
    seen, steps = [], 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen.append([])
        for batch in loader:
            seen[-1].append(batch["index"])
            with accelerator.accumulate(model):
                ids = batch["input_ids"]
                logits = model(ids)[:, :-1]
                target = ids[:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=-100)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            steps += accelerator.sync_gradients
    weights = [float(p.detach().double().sum()) for p in model.parameters()]
    with open(os.path.join(out_dir, f"rank{accelerator.process_index}.json"), "w") as fh:
        json.dump({"seen": seen, "steps": steps, "weights": weights, "refused": refused,
                   "num_processes": accelerator.num_processes}, fh)
    accelerator.wait_for_everyone()
    accelerator.end_training()  # leaves the process group before the interpreter exits


if __name__ == "__main__":
    main(sys.argv[1])
