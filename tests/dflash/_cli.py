"""Run ``lengthwise`` commands as a user does: in a subprocess, optionally under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _ports import free_port

SRC = str(Path(__file__).resolve().parents[2] / "src")
#: ``dflash train`` flags of a tiny run (add --target, --data, --out and --steps)
TINY_TRAIN = ["--max-tokens", "256", "--grad-accum", "2", "--draft-layers", "1",
              "--block-size", "4", "--num-anchors", "4", "--eval-samples", "2",
              "--checkpoint-every", "2", "--lr", "1e-2", "--no-progress"]


def tiny_train_args(target, data, out, *extra: str) -> list[str]:
    """``dflash train`` arguments of a tiny run of ``target`` on ``data`` into ``out``."""
    return ["dflash", "train", "--target", str(target), "--data", str(data), "--out", str(out),
            *TINY_TRAIN, *extra]




def launcher(nproc: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The interpreter to run a command with (under ``torchrun --nproc-per-node NPROC`` with
    ``nproc``) and its environment: these sources first, one thread, no launcher's ranks."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")  # a crash shows the Python stacks
    launch = [sys.executable]
    if nproc is not None:
        launch += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    return launch, env


def lengthwise(*args: str, nproc: int | None = None, timeout: float = 600) -> str:
    """``lengthwise ARGS`` (under ``torchrun --nproc-per-node NPROC`` with ``nproc``); its stdout.

    Fails the test with the command's stderr tail when it exits non-zero.
    """
    launch, env = launcher(nproc)
    cmd = [*launch, "-m", "lengthwise", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args[:2])}: {proc.stderr[-3000:]}"
    return proc.stdout
