"""Policies that could balance the ranks of padded steps at 64 ranks, measured side by side.

Usage::

    python benchmarks/balance_candidates.py            # writes benchmarks/BALANCE_RESULTS.md
    python benchmarks/balance_candidates.py --quick    # quarter-size shapes

On the long, wide and bimodal shapes of ``shape_targets.py`` (``max_tokens=16384``,
64 ranks, ``grad_accum=1``, seed 0) every candidate orders (or re-cuts) the same
micro-batches of the default plan's edges; the figures are those of docs/metrics.md,
and ``left_over_tokens`` is the share of tokens a candidate takes out of the steps it
balances (they would need steps of their own). Every number comes from this run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from planner_targets import machine, table  # noqa: E402
from shape_targets import BUDGET, publish, shape_args, shapes  # noqa: E402

from lengthwise.planning import batching, metrics, orders  # noqa: E402
from lengthwise.planning.config import PlanConfig  # noqa: E402
from lengthwise.planning.padded import padded_batch_sets  # noqa: E402
from lengthwise.planning.plan import plan_epoch  # noqa: E402

WORLD = 64
SHAPES = ("ln 2000, 0.7 (long)", "ln 600, 1.4 (wide)", "bimodal 120 / 2500")


def _figures(lengths: np.ndarray, idx: np.ndarray, off: np.ndarray) -> dict:
    s = metrics.batch_stats(lengths, idx, off, world_size=WORLD)
    rows = np.diff(off)
    padded = rows * batching.batch_longest(lengths, idx, off)
    return {k: s[k] for k in ("padding_efficiency", "step_cv_ratio", "rank_imbalance_p50",
                              "rank_imbalance_p99", "optimizer_steps")} | {
        "budget_fill": float(np.mean(padded) / BUDGET)}


def _trimmed_share(lengths: np.ndarray, idx: np.ndarray, off: np.ndarray,
                   target: float = 1.035) -> float:
    """Share of tokens left out when every step of a schedule drops rows from its micro-batches
    (keeping one at least) down to the highest level at which max / mean <= ``target``."""
    rows = np.diff(off)
    longest = batching.batch_longest(lengths, idx, off)
    left = 0.0
    for g in range(rows.size // WORLD):
        r = rows[g * WORLD:(g + 1) * WORLD]
        p = longest[g * WORLD:(g + 1) * WORLD].astype(np.float64)
        k = np.arange(1, int(r.max()) + 1)
        levels = np.unique((k[:, None] * p[None, :])[k[:, None] <= r[None, :]])
        keep = np.minimum(r, np.maximum(1, np.floor(levels[:, None] / p[None, :])))
        cost = keep * p
        ok = np.flatnonzero(cost.max(axis=1) / cost.mean(axis=1) <= target)
        keep = keep[ok[-1] if ok.size else 0]
        seg = [lengths[idx[off[g * WORLD + j] + int(k):off[g * WORLD + j + 1]]].sum()
               for j, k in enumerate(keep)]
        left += float(np.sum(seg))
    return left / float(lengths[idx].sum())


def measure(name: str, lens: np.ndarray) -> list[dict]:
    kw = PlanConfig(max_tokens=BUDGET, world_size=WORLD)
    base = {"shape": name, "samples": int(lens.size)}
    plan = plan_epoch(lens, kw)
    out = [{**base, "policy": "stratified (default)",
            **_figures(plan.lengths, plan.indices, plan.offsets),
            "left_over_tokens": 0.0}]
    # the steps that keep their rows reach the target by construction; what is left over has
    # no steps yet, so only the share is measured
    out.append({**base, "policy": "default, then rows dropped per step",
                "left_over_tokens": _trimmed_share(plan.lengths, plan.indices, plan.offsets)})
    rows = np.diff(plan.offsets)
    longest = batching.batch_longest(plan.lengths, plan.indices, plan.offsets)
    out.append({**base, "policy": "under-full batches: one more row of their length fits",
                "share_of_batches": float(np.mean((rows + 1) * longest <= BUDGET))})
    idx, off = padded_batch_sets(lens, PlanConfig(**kw))
    longest = batching.batch_longest(plan.lengths, idx, off)
    cost = (np.diff(off) * longest).astype(np.float64)
    tag = np.searchsorted(np.asarray(plan.edges), longest, side="left")
    rng = np.random.default_rng(0)
    perm = orders.stratified(tag, cost, WORLD, 1, rng)  # cost rank inside strata
    out.append({**base, "policy": "strata matched by cost rank",
                **_figures(plan.lengths, *batching.take_batches(idx, off, perm)),
                "left_over_tokens": 0.0})
    level = plan_epoch(lens, replace(kw, balance="level"))
    out.append({**base, "policy": "balance='level' (steps sorted by cost)",
                **_figures(level.lengths, level.indices, level.offsets),
                "left_over_tokens": 0.0})
    return out


def main() -> int:
    args = shape_args(__doc__, "BALANCE_RESULTS.md")
    started = time.perf_counter()
    rows = []
    every = shapes(args.quick)
    for name in SHAPES:
        rows += measure(name, every[name])
        print(name, flush=True)
    keys = ["shape", "samples", "policy", "padding_efficiency", "step_cv_ratio",
            "rank_imbalance_p50", "rank_imbalance_p99", "budget_fill", "left_over_tokens",
            "share_of_batches", "optimizer_steps"]
    cmd = "python benchmarks/balance_candidates.py" + (" --quick" if args.quick else "")
    text = f"""# Balancing the ranks of padded steps: the candidates

Generated by `{cmd}` on {time.strftime('%Y-%m-%d')} in {time.perf_counter() - started:.0f} s;
do not edit by hand. Machine: {machine()}.

{WORLD} ranks, `grad_accum=1`, `max_tokens={BUDGET}`, seed 0, the default plan's edges. With one
micro-batch per rank and step, no assignment of a step's micro-batches to ranks changes
`rank_imbalance`: only which micro-batches share a step, and their rows, can. The candidates:
the default stratified order (steps balanced by mean length); the same steps with rows dropped
from each step's micro-batches down to the highest level at which max / mean <= 1.035
(`left_over_tokens`: the share of tokens that would need steps of their own); how many of the
default plan's micro-batches could take one more row of their own padded length within the
budget (`share_of_batches`: filling under-full batches from their bucket); the stratified
order with steps matched by cost rank inside each stratum; and `balance="level"`, the same
micro-batches sorted by cost and cut into steps (`docs/planner.md`).

{table(rows, keys)}
"""
    return publish(args.out, text)


if __name__ == "__main__":
    sys.exit(main())
