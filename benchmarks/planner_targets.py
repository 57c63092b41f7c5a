"""Measure the batch planner against its targets and write ``benchmarks/PLANNER_RESULTS.md``.

Usage::

    python benchmarks/planner_targets.py            # full run (about a minute on 2 cores)
    python benchmarks/planner_targets.py --quick    # 1,000,000 samples instead of 10,000,000

Every number in the output file comes from this run; nothing is typed in by hand.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import subprocess
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np

import lengthwise
from lengthwise import load_lengths, optimal_edges, plan_epoch, recomposition
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.vocabulary import ORDERS

HERE = Path(__file__).resolve().parent
REFERENCE_EDGES = [770, 1216, 1728, 2432, 3296, 8192]  # the reference run's six buckets


def lognormal(n: int, seed: int = 0) -> np.ndarray:
    """The reference run's shape: median 1,050, sigma 0.5, clipped to [16, 8192]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.normal(np.log(1050), 0.5, n))), 16, 8192).astype(np.int64)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def table(rows: list[dict], keys: list[str]) -> str:
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(out)


def orders_on(lengths: np.ndarray, kw: PlanConfig) -> list[dict]:
    rows = []
    for order in ORDERS:
        p0 = plan_epoch(lengths, replace(kw, order=order), epoch=0)
        p1 = plan_epoch(lengths, replace(kw, order=order), epoch=1)
        s = dict(p0.stats)
        s["recomposition"] = recomposition(p0, p1)
        s["exact_coverage"] = bool(np.array_equal(np.sort(p0.indices),
                                                  np.flatnonzero(p0.lengths > 0)))
        rows.append(s)
    return rows


def machine() -> str:
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                      if line.startswith("Model name")), platform.processor())
    except OSError:
        model = platform.processor()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{model}, {os.cpu_count()} cores, {mem:.0f} GiB; Python {platform.python_version()}, "
            f"NumPy {np.__version__}, lengthwise {lengthwise.__version__}")


def scale(n: int) -> dict:
    lengths = lognormal(n, seed=1)
    gc.collect()
    t = time.perf_counter()
    np.argsort(lengths)
    argsort_s = time.perf_counter() - t
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        plan = plan_epoch(lengths, PlanConfig(max_tokens=16384, world_size=8))
        runs.append(time.perf_counter() - t)
        del plan
        gc.collect()
    tracemalloc.start()
    plan = plan_epoch(lengths, PlanConfig(max_tokens=16384, world_size=8))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"samples": n, "edges_plus_plan_seconds": min(runs), "argsort_seconds": argsort_s,
            "ratio_to_argsort": min(runs) / argsort_s, "peak_bytes_per_sample": peak / n,
            "num_buckets": len(plan.edges)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / "PLANNER_RESULTS.md"))
    args = ap.parse_args()
    keys = ["order", "padding_efficiency", "efficiency_vs_sorted", "step_length_cv",
            "step_sample_cv", "step_cv_ratio", "rank_imbalance_p50", "rank_imbalance_p99",
            "max_same_bucket_run", "recomposition", "num_buckets", "num_batches",
            "plan_seconds", "exact_coverage"]
    sft = load_lengths("sft_mix", max_len=8192)
    sft_rows = orders_on(sft, PlanConfig(max_tokens=16384, world_size=8))
    six = {"order": "bucket-random, 6 optimal buckets",
           **plan_epoch(sft, PlanConfig(max_tokens=16384, world_size=8, buckets=6,
                                        order="bucket-random")).stats}
    ref6 = {"order": "bucket-random, the reference run's edges",
            **plan_epoch(sft,
                         PlanConfig(max_tokens=16384, world_size=8, buckets=REFERENCE_EDGES,
                                    order="bucket-random")).stats}
    strat = next(r for r in sft_rows if r["order"] == "stratified")
    inter = next(r for r in sft_rows if r["order"] == "interleave")

    ref_lengths = lognormal(902_087)
    ref_edges = optimal_edges(ref_lengths, 6, batch_size=4)
    ref_rows = [plan_epoch(ref_lengths,
                           PlanConfig(batch_size=4, buckets=6, order=o, world_size=8)).stats
                for o in ("sorted", "random", "bucket-random", "interleave", "stratified")]
    sizes = [1_000_000] if args.quick else [1_000_000, 10_000_000]
    scaling = [scale(n) for n in sizes]
    big = scaling[-1]

    checks = [
        ("sft_mix stratified padding_efficiency >= 0.97", strat["padding_efficiency"] >= 0.97,
         fmt(strat["padding_efficiency"])),
        ("sft_mix stratified step_cv_ratio <= 1.0", strat["step_cv_ratio"] <= 1.0,
         fmt(strat["step_cv_ratio"])),
        ("sft_mix exact coverage (every order)", all(r["exact_coverage"] for r in sft_rows), "-"),
        ("sft_mix interleave max_same_bucket_run <= 3", inter["max_same_bucket_run"] <= 3,
         str(inter["max_same_bucket_run"])),
        ("sft_mix stratified recomposition <= 0.01", strat["recomposition"] <= 0.01,
         fmt(strat["recomposition"])),
        ("reference shape: edges near [833, 1210, 1661, 2323, 3592, 8192]",
         bool(np.allclose(ref_edges, [833, 1210, 1661, 2323, 3592, 8192], rtol=0.03)),
         str(ref_edges)),
        ("reference shape: bucket-random padding_efficiency ~0.88",
         abs(ref_rows[2]["padding_efficiency"] - 0.88) < 0.02,
         fmt(ref_rows[2]["padding_efficiency"])),
        (f"{big['samples']:,} samples: edges + plan for 8 ranks <= 3 s",
         big["edges_plus_plan_seconds"] <= 3.0, f"{big['edges_plus_plan_seconds']:.2f} s"),
        (f"{big['samples']:,} samples: memory <= 32 bytes/sample beyond the lengths",
         big["peak_bytes_per_sample"] <= 32, f"{big['peak_bytes_per_sample']:.1f}"),
    ]
    cmd = "python benchmarks/planner_targets.py" + (" --quick" if args.quick else "")
    text = f"""# Planner results

Generated by `{cmd}` on {time.strftime('%Y-%m-%d')}; do not edit by hand.
Machine: {machine()}.

## Targets

| target | met | measured |
|---|---|---|
""" + "\n".join(f"| {name} | {'yes' if ok else 'NO'} | {v} |" for name, ok, v in checks) + f"""

## Bundled `sft_mix`, truncated at 8192, `max_tokens=16384`, `world_size=8`, `grad_accum=1`

Cost model for `rank_imbalance`: padded tokens (a=1, b=c=0). `recomposition`: epoch 0 vs epoch 1.

{table(sft_rows, keys)}

Six buckets on the same data, for the reference run's picture:

{table([six, ref6], keys[:-1])}

## The reference run's shape (log-normal, 902,087 samples, `batch_size=4`, 6 buckets, 8 ranks)

Optimal edges: {ref_edges}

{table(ref_rows, keys[:-1])}

## Planning time and memory (log-normal lengths, `max_tokens=16384`, 8 ranks, stratified)

Seconds are the best of 3 runs of edges ("auto") plus one epoch's plan for all ranks; memory is
the tracemalloc peak during planning divided by the number of samples (the int64 lengths
themselves, 8 bytes a sample, are allocated before and not counted).

{table(scaling, list(scaling[0].keys()))}
"""
    Path(args.out).write_text(text)
    print(text)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
