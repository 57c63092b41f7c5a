"""A tiny DFlash training run on lengthwise's loop, shared by the DDP worker and the tests.

Run as a script, it is one rank of a 2-process gloo job (``RANK``/``WORLD_SIZE``/``MASTER_*``
in the environment) that trains 4 steps, then 2 steps with a checkpoint and 2 more resumed,
and writes rank 0's losses to the JSON file named on the command line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def data():
    from lengthwise.demo.dflash_data import DFlashData

    rng = np.random.default_rng(3)
    ids = [rng.integers(1, 40, int(n)) for n in rng.integers(6, 25, 64)]
    plens = rng.integers(1, 4, 64)
    return DFlashData(ids=ids, prompt_lens=plens, held=np.zeros(0, dtype=np.int64))


def config(**kw):
    from lengthwise.dflash.train_config import DFlashTrainConfig

    base = dict(steps=4, grad_accum=2, max_tokens=96, max_len=24, block_size=4, num_anchors=3,
                lr=1e-2, progress=False, threads=1, keep_checkpoints=3)
    base.update(kw)
    return DFlashTrainConfig(**base)


def build_loop(cfg, out, info=None, order="stratified"):
    import torch
    from _dflash_tiny import tiny_draft, tiny_target

    from lengthwise.dflash.train import DFlashTask
    from lengthwise.train.loop import TrainLoop

    target = tiny_target(seed=0)
    draft = tiny_draft(target, seed=1, block_size=cfg.block_size)
    ds = data()
    task = DFlashTask(draft, target, cfg, order=order)
    return TrainLoop(task, order, ds.lengths, ds.sample, cfg, run_dir=Path(out),
                     device=torch.device("cpu"), info=info)


def train(cfg, out, info=None, order="stratified"):
    loop = build_loop(cfg, out, info, order)
    recs = []
    try:
        while not loop.done:
            recs.append(loop.step())
    finally:
        loop.close()
    return [(r["step"], r["loss"], r["accuracy"]) for r in recs]


def copy_checkpoint(src: Path, dst: Path, *, step: int) -> None:
    import shutil

    (dst / "checkpoints").mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "checkpoints" / f"step_{step}", dst / "checkpoints" / f"step_{step}")


def main(path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from lengthwise.pytorch.dist import group_info

    info = group_info()
    root = Path(path).parent
    full = train(config(checkpoint_every=2), root / "full", info)
    if info.rank == 0:  # a run stopped after step 2: only that checkpoint exists
        copy_checkpoint(root / "full", root / "resumed", step=2)
    dist.barrier()
    resumed = train(config(checkpoint_every=2, resume=True), root / "resumed", info)
    if info.rank == 0:
        Path(path).write_text(json.dumps({"full": full, "resumed": resumed}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
