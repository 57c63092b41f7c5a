"""Saves one checkpoint, then dies in the middle of the next (test_checkpoint.py).

Usage: python _crash_worker.py ROOT BACKEND   (BACKEND: torch | dcp)
Prints MIDSAVE once the second save is under way, then waits to be killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from lengthwise.train import checkpoint


def train_step(model, optimizer):
    loss = model(torch.randn(16, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main() -> None:
    root, backend = Path(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    ckpt = checkpoint.Checkpointer(root, use_dcp=backend == "dcp")
    train_step(model, optimizer)
    ckpt.save(1, model=model, optimizer=optimizer, extra={"tag": "good"}).wait()
    torch.save(model.state_dict(), root / "expected.pt")
    train_step(model, optimizer)

    def announce_and_hang() -> None:
        print("MIDSAVE", flush=True)
        time.sleep(600)

    if backend == "torch":
        def partial_write(obj, path):  # half a file on disk, then the process dies
            with open(path, "wb") as handle:
                handle.write(b"\x80" * 4096)
                handle.flush()
            announce_and_hang()

        checkpoint.torch_backend._torch_save = partial_write
    else:
        def hang_before_publish(tmp, final, manifest):  # data written, not yet published
            announce_and_hang()

        checkpoint.checkpointer.publish = hang_before_publish
    ckpt.save(2, model=model, optimizer=optimizer, extra={"tag": "bad"})
    time.sleep(600)  # the loop goes on while the save runs; the test kills us here


if __name__ == "__main__":
    main()
