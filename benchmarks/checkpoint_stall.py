"""How much checkpoint checksums hold up a training loop: with against without, one run.

Usage::

    python benchmarks/checkpoint_stall.py            # about 30 s on 2 cores
    python benchmarks/checkpoint_stall.py --rounds 1 --steps 40
    python benchmarks/checkpoint_stall.py --threads 1   # leave a core to the writer thread

A CPU loop (an MLP, AdamW) saves an asynchronous checkpoint every ``--every`` steps.
Rounds alternate between the normal writer (which hashes every file before publishing
it) and the same writer with hashing switched off, so both see the same machine load.
Printed per variant: median step time, the slowest step (a save's whole write, hashing
included, overlaps the steps after it), the whole loop's time, the loop time held by
``save`` itself (``blocking_seconds``), the ratios with/without, and how long hashing
took on the writer thread. Every number comes from this run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from unittest import mock

import torch

from lengthwise.train.checkpoint import Checkpointer, atomic


def run_loop(steps: int, every: int, width: int, hashed: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, width)
    step_times, held, hashing = [], [], [0.0]
    digests = atomic.file_digests

    def timed(folder, skip=()):
        start = time.perf_counter()
        try:
            return digests(folder, skip) if hashed else {}
        finally:
            hashing.append(time.perf_counter() - start)

    patch = mock.patch.object(atomic, "file_digests", timed)
    with tempfile.TemporaryDirectory() as root, Checkpointer(root, keep=1) as ckpt:
        patch.start()
        try:
            for step in range(steps):
                start = time.perf_counter()
                loss = model(x).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step % every == every - 1:
                    held.append(ckpt.save(step, model=model, optimizer=optimizer)
                                .blocking_seconds)
                step_times.append(time.perf_counter() - start)
            ckpt.wait()
        finally:
            patch.stop()
    return {"median_step": statistics.median(step_times), "slowest_step": max(step_times),
            "loop_seconds": sum(step_times), "held": statistics.median(held),
            "hash_seconds": max(hashing)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs (default: 3)")
    parser.add_argument("--steps", type=int, default=60, help="steps per run (default: 60)")
    parser.add_argument("--every", type=int, default=10, help="steps between saves (default: 10)")
    parser.add_argument("--width", type=int, default=1024, help="MLP width (default: 1024)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for hashed in (False, True):
            results[hashed].append(run_loop(args.steps, args.every, args.width, hashed))
    mb = 3 * 4 * 4 * args.width * (args.width + 1) / 2**20  # weights + two Adam moments
    print(f"checkpoint of about {mb:.0f} MiB every {args.every} steps, {args.rounds} "
          f"round(s) of {args.steps} steps per variant, {torch.get_num_threads()} torch "
          f"thread(s), {os.cpu_count()} CPU(s)")
    print(f"{'figure':<16}{'no checksums':>14}{'checksums':>12}{'ratio':>8}")
    for key in ("median_step", "slowest_step", "loop_seconds", "held"):
        off = statistics.median(r[key] for r in results[False])
        on = statistics.median(r[key] for r in results[True])
        print(f"{key:<16}{off:>14.4f}{on:>12.4f}{on / off:>8.2f}")
    on = statistics.median(r["hash_seconds"] for r in results[True])
    print(f"{'hash_seconds':<16}{'':>14}{on:>12.4f}  (per save, on the writer thread)")


if __name__ == "__main__":
    main()
