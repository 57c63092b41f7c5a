"""One rank of the 2-process gloo test in test_train_distributed.py.

Usage: python _dist_worker.py OUT_DIR   (with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)
Writes OUT_DIR/result_rank{R}.json.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lengthwise.train import Checkpointer, SpikeGuard, StepLogger, load_checkpoint


class CountingSampler:
    """Stand-in for a batch sampler: a position per rank, saved as a dict of ints."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.position = 0

    def next_batch(self) -> int:
        self.position += 1
        return self.position * 10 + self.rank

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "rank": self.rank}

    def load_state_dict(self, state: dict[str, int]) -> None:
        assert state["rank"] == self.rank, state
        self.position = state["position"]


def train_steps(model, optimizer, sampler, n):
    losses = []
    for _ in range(n):
        seed = sampler.next_batch()
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(8, 4, generator=gen) + torch.rand(1).item()  # uses torch RNG
        y = torch.randn(8, 1, generator=gen) + float(np.random.rand()) + random.random()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {"rank": rank, "world_size": world}

    # --- StepLogger: every rank records its own micro-batches, rank 0 writes
    log_path = out / "train_log.jsonl"
    logger = StepLogger(log_path, bucket_shares=[0.5, 0.3, 0.2], window=5, mode="w")
    for step in range(3):
        if rank == 0:
            logger.record_micro(loss=1.0 + step, real_tokens=100, padded_tokens=128, samples=2,
                                bucket=0)
            logger.record_micro(loss=torch.tensor(3.0), real_tokens=50, padded_tokens=64,
                                samples=1, bucket=2)
        else:
            logger.record_micro(loss=2.0, real_tokens=150, padded_tokens=160, samples=5,
                                bucket=1)
        rec = logger.step(step, epoch=0, lr=0.1, grad_norm=1.0)
        result.setdefault("records", []).append(rec)
    logger.event("done", rank=rank)
    logger.close()

    # --- SpikeGuard: the ranks see different losses but must agree
    guard = SpikeGuard(window=20, threshold=6.0, warmup=5)
    decisions = []
    for i in range(12):
        local = 1.0 + 0.01 * (i % 3) + (rank * 0.5)
        if i == 9 and rank == 1:
            local = 60.0  # a spike on one rank only shows up in the mean
        decisions.append(guard.check(torch.tensor(local), step=i))
    result["guard_decisions"] = decisions
    result["guard_skipped"] = guard.skipped

    # --- Distributed checkpoint of a DDP model: resume continues exactly
    torch.manual_seed(0)
    random.seed(rank)
    np.random.seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    sampler = CountingSampler(rank)
    ckpt_dir = out / "ckpt"
    events = out / "ckpt_log.jsonl"
    ckpt_logger = StepLogger(events, mode="w")
    checkpointer = Checkpointer(ckpt_dir, keep=2, logger=ckpt_logger)
    train_steps(model, optimizer, sampler, 3)
    pending = checkpointer.save(3, model=model, optimizer=optimizer, sampler=sampler,
                                extra={"rank": rank})
    first = train_steps(model, optimizer, sampler, 3)
    pending.wait()
    checkpointer.close()
    dist.barrier()
    ckpt_logger.close()

    torch.manual_seed(123)  # a different start: everything must come from the checkpoint
    model2 = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    )
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=0.05)
    sampler2 = CountingSampler(rank)
    info = load_checkpoint(ckpt_dir, model=model2, optimizer=optimizer2, sampler=sampler2)
    second = train_steps(model2, optimizer2, sampler2, 3)
    result.update(
        first=first, second=second, loaded_step=info["step"], loaded_extra=info["extra"],
        checkpoint_files=sorted(os.listdir(info["path"])),
    )
    (out / f"result_rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
