"""Planning at scale: windowed plans over memory-mapped lengths, up to a billion samples.

Usage::

    python benchmarks/scale_targets.py            # up to 1,000,000,000 samples (a 4 GB file)
    python benchmarks/scale_targets.py --quick    # up to 100,000,000 samples

Writes ``benchmarks/SCALE_RESULTS.md``. Every measurement of memory and time runs
in its own process, which stands for one rank of 64: it opens the lengths file,
plans and takes rank 0's first micro-batch. Memory is the peak anonymous resident
memory (``RssAnon``, polled every 5 ms) above the process's level after imports:
memory-mapped lengths are file pages shared by the ranks of a node and do not
count there; the whole-epoch planner's int64 copy of the lengths does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from planner_targets import fmt, lognormal, machine, table  # noqa: E402

from lengthwise.planning.config import PlanConfig  # noqa: E402
from lengthwise.planning.metrics import recomposition  # noqa: E402
from lengthwise.planning.plan import plan_epoch  # noqa: E402
from lengthwise.planning.windowed import WindowedPlan, resolve_window  # noqa: E402

WORLD, BUDGET = 64, 16384


def write_lengths(path: Path, n: int, chunk: int = 50_000_000) -> None:
    """The reference shape (log-normal, median 1,050, sigma 0.5, [16, 8192]) as int32 .npy."""
    if path.exists() and np.load(path, mmap_mode="r").shape == (n,):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(n,))
    for i, start in enumerate(range(0, n, chunk)):
        stop = min(n, start + chunk)
        out[start:stop] = lognormal(stop - start, seed=1000 + i)
    out.flush()
    del out


class AnonPeak:
    """Peak of ``RssAnon`` while alive, above the level at start (polled in a thread)."""

    def __init__(self) -> None:
        self.base = self.now()
        self.peak = self.base
        self._stop = False
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _poll(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, self.now())
            time.sleep(0.005)

    def stop(self) -> float:
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, self.now())
        return (self.peak - self.base) / 2**20


def worker(kind: str, path: str, n: int) -> dict:
    """One rank of 64: plan and take the first micro-batch; return time and memory."""
    import gc

    if kind == "hf":
        import torch  # noqa: F401  (imported before the baseline)
        from transformers.trainer_pt_utils import LengthGroupedSampler
    from lengthwise.planning.lengths import open_lengths

    gc.collect()
    mem = AnonPeak()
    t0 = time.perf_counter()
    out: dict = {"kind": kind, "samples": n}
    if kind == "windowed":
        lens = open_lengths(path)[:n]
        window = resolve_window("auto", n)
        out["window"] = window or "whole epoch"
        cfg = PlanConfig(max_tokens=BUDGET, world_size=WORLD)
        if window is None:
            plan = plan_epoch(lens, cfg)
            next(iter(plan.rank_batches(0)))
            out["first_batch_s"] = time.perf_counter() - t0
        else:
            wp = WindowedPlan(lens, cfg, window=window)
            next(wp.rank_batches(0))
            out["first_batch_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            for w in (1, 2):
                wp.plan_window(w).plan.rank_batches(0)
            per_window = (time.perf_counter() - t1) / 2
            out["s_per_window"] = per_window
            out["epoch_plan_s_per_rank_est"] = per_window * wp.num_windows
    elif kind == "whole":
        lens = open_lengths(path)[:n]
        plan = plan_epoch(lens, PlanConfig(max_tokens=BUDGET, world_size=WORLD))
        plan.rank_batches(0)[0]
        out["first_batch_s"] = time.perf_counter() - t0
    elif kind == "hf":
        lens = np.load(path, mmap_mode="r")[:n].tolist()
        sampler = LengthGroupedSampler(batch_size=4, lengths=lens)
        next(iter(sampler))
        out["first_batch_s"] = time.perf_counter() - t0
    out["anon_peak_mib"] = mem.stop()
    out["file_rss_mib"] = _file_rss() / 2**20
    return out


def _file_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    return 0


def run_worker(kind: str, path: Path, n: int, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--path", str(path), "--n", str(n)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"kind": kind, "samples": n, "error": f"over {timeout:.0f} s"}
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["killed"])[-1][:80]
        return {"kind": kind, "samples": n, "error": f"failed: {tail}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def quality(n: int, windows: list[int], world: int) -> list[dict]:
    """Whole-epoch against windowed plans of the same lengths (epoch 0, and 1 for recomposition)."""
    lens = lognormal(n, seed=1)
    cfg = PlanConfig(max_tokens=BUDGET, world_size=world)
    rows = []
    p0, p1 = plan_epoch(lens, cfg), plan_epoch(lens, cfg, epoch=1)
    rows.append({"plan": "whole epoch", "world_size": world, **p0.stats,
                 "recomposition": recomposition(p0, p1)})
    for w in windows:
        q0 = WindowedPlan(lens, cfg, window=w).materialize()
        q1 = WindowedPlan(lens, cfg, window=w, epoch=1).materialize()
        exact = bool(np.array_equal(np.sort(q0.indices), np.arange(n)))
        rows.append({"plan": f"window={w:,}", "world_size": world, **q0.stats,
                     "recomposition": recomposition(q0, q1), "exact_coverage": exact})
    whole = rows[0]
    for r in rows:
        r["eff_vs_whole"] = r["padding_efficiency"] / whole["padding_efficiency"]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", choices=["windowed", "whole", "hf"])
    ap.add_argument("--path")
    ap.add_argument("--n", type=int)
    ap.add_argument("--cache", default="/tmp/lengthwise-bench")
    ap.add_argument("--out", default=str(HERE / "SCALE_RESULTS.md"))
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.path, args.n)))
        return 0
    top = 100_000_000 if args.quick else 1_000_000_000
    path = Path(args.cache) / f"lognormal_{top}.int32.npy"
    t = time.perf_counter()
    write_lengths(path, top)
    print(f"lengths file ready in {time.perf_counter() - t:.0f} s: {path}", flush=True)
    sizes = [n for n in (1_000_000, 10_000_000, 100_000_000, 1_000_000_000) if n <= top]
    runs = []
    for n in sizes:
        runs.append(run_worker("windowed", path, n, 900))
        if n <= (10_000_000 if args.quick else 100_000_000):
            runs.append(run_worker("whole", path, n, 900))
        if n <= 10_000_000:
            runs.append(run_worker("hf", path, n, 900))
        print(runs[-1], flush=True)
    q_n = 2_000_000 if args.quick else 10_000_000
    q_windows = [1_000_000] if args.quick else [1_000_000, 4_000_000]
    qual = quality(q_n, q_windows, WORLD) + quality(q_n, q_windows[:1], 8)
    big = next(r for r in runs if r["kind"] == "windowed" and r["samples"] == top)
    win_q = [r for r in qual if r["plan"] != "whole epoch"]
    checks = [
        (f"{top:,} samples, one rank of {WORLD}: memory beyond the lengths <= 1 GiB",
         big.get("anon_peak_mib", 1e9) <= 1024, f"{fmt(big.get('anon_peak_mib'))} MiB"),
        (f"{top:,} samples: first micro-batch within a few seconds (<= 5 s)",
         big.get("first_batch_s", 1e9) <= 5, f"{fmt(big.get('first_batch_s'))} s"),
        ("windows >= 1,000,000: padding efficiency within 1% of the whole epoch",
         all(r["eff_vs_whole"] >= 0.99 for r in win_q),
         ", ".join(fmt(r["eff_vs_whole"]) for r in win_q)),
        ("windowed: every sample exactly once", all(r["exact_coverage"] for r in win_q), "-"),
    ]
    keys_run = ["kind", "samples", "window", "first_batch_s", "anon_peak_mib", "file_rss_mib",
                "s_per_window", "epoch_plan_s_per_rank_est", "error"]
    keys_q = ["plan", "world_size", "padding_efficiency", "eff_vs_whole", "efficiency_vs_sorted",
              "step_cv_ratio", "rank_imbalance_p50", "rank_imbalance_p99", "recomposition",
              "num_batches", "plan_seconds"]
    cmd = "python benchmarks/scale_targets.py" + (" --quick" if args.quick else "")
    text = f"""# Planning at scale

Generated by `{cmd}` on {time.strftime('%Y-%m-%d')}; do not edit by hand.
Machine: {machine()}.

## Targets

| target | met | measured |
|---|---|---|
""" + "\n".join(f"| {name} | {'yes' if ok else 'NO'} | {v} |" for name, ok, v in checks) + f"""

## One rank of {WORLD}: time to the first micro-batch and memory

Lengths: the reference shape (log-normal, median 1,050, sigma 0.5, clipped to [16, 8192]) in one
int32 `.npy` file of {top:,} samples ({path.stat().st_size / 2**30:.1f} GiB); a size below that
plans its first `n` rows. `max_tokens={BUDGET}`, `world_size={WORLD}`, stratified, `buckets="auto"`.
Each row is its own process.

- `windowed`: `open_lengths` (memory-mapped) and `window="auto"`
  ({resolve_window("auto", 10**9):,}-sample windows above {2**24:,} samples, else the whole epoch);
  `s_per_window` is the mean time to plan windows 1 and 2, and `epoch_plan_s_per_rank_est` that
  times the number of windows (an estimate: it is spread over the epoch, one window at a time).
- `whole`: today's whole-epoch plan of the same lengths (it copies them to int64, counted).
- `hf`: Hugging Face `LengthGroupedSampler(batch_size=4)` over the lengths as a list (its input
  type), time to its first index (it orders the whole epoch first).

`anon_peak_mib`: peak `RssAnon` above the level after imports; `file_rss_mib`: file pages mapped
at the end (the lengths file, shared by the ranks of a node through the page cache; the file
was written just before, so the page cache was warm).

{table(runs, keys_run)}

## Quality: windowed against whole-epoch plans ({q_n:,} samples, reference shape)

`max_tokens={BUDGET}`, stratified, `buckets="auto"`, epoch 0 (`recomposition`: against epoch 1).
The windowed rows are the windows' schedules one after the other, measured as one epoch.

{table(qual, keys_q)}
"""
    Path(args.out).write_text(text)
    print(text)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
