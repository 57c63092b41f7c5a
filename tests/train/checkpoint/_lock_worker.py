"""One process writing checkpoints into a shared folder (test_checkpoint_lock.py).

Usage: python _lock_worker.py MODE ROOT
  hold  save steps 1-3, print HOLDING, wait for a line on stdin, save step 4, close, print DONE
  race  save steps 1-6 (keep=3), print DONE, or LOCKED and the message if the folder is taken
  dist  one rank of a 2-process gloo job (RANK etc. set): save step 1, print LOCKED or DONE
Every saved model's weights equal its step, so a loaded checkpoint shows which save it is.
"""

from __future__ import annotations

import os
import sys

import torch

from lengthwise.train import Checkpointer, CheckpointLockedError


def model_at(step: int) -> torch.nn.Module:
    model = torch.nn.Linear(64, 64)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(step))
    return model


def main() -> None:
    mode, root = sys.argv[1], sys.argv[2]
    if mode == "dist":
        torch.distributed.init_process_group("gloo")
    ckpt = Checkpointer(root, keep=2 if mode == "hold" else 3)
    steps = {"hold": [1, 2, 3], "race": [1, 2, 3, 4, 5, 6], "dist": [1]}[mode]
    try:
        for step in steps:
            ckpt.save(step, model=model_at(step), extra={"pid": os.getpid()})
    except CheckpointLockedError as exc:
        print("LOCKED", exc, flush=True)
        return
    if mode == "hold":
        ckpt.wait()
        print("HOLDING", os.getpid(), flush=True)
        sys.stdin.readline()
        ckpt.save(4, model=model_at(4), extra={"pid": os.getpid()})
    ckpt.close()
    print("DONE", flush=True)
    if mode == "dist":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
