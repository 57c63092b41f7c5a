"""Efficiency, step composition and rank balance over many length distributions.

Usage::

    python benchmarks/shape_targets.py            # writes benchmarks/SHAPE_RESULTS.md
    python benchmarks/shape_targets.py --quick    # fewer shapes, smaller sets

Generated shapes (log-normal of several medians and sigmas, bimodal, short-heavy
chat, small sets of 20,000 to 100,000 samples) and every bundled distribution,
each planned with the defaults (stratified, ``buckets="auto"``) under
``max_tokens=16384`` at 8 and 64 ranks. Every number comes from this run.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from lengthwise.planning.config import PlanConfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from planner_targets import fmt, machine, table  # noqa: E402

from lengthwise.planning import batching  # noqa: E402
from lengthwise.planning.cost import CostModel  # noqa: E402
from lengthwise.planning.edges import Histogram, auto_edges  # noqa: E402
from lengthwise.planning.lengths import bundled_names, load_lengths  # noqa: E402
from lengthwise.planning.metrics import recomposition  # noqa: E402
from lengthwise.planning.plan import plan_epoch  # noqa: E402

BUDGET = 16384


def lognormal(rng, n, median, sigma, lo=1, hi=8192):
    return np.clip(np.round(np.exp(rng.normal(np.log(median), sigma, n))), lo, hi).astype(np.int64)


def shapes(quick: bool) -> dict[str, np.ndarray]:
    """Generated distributions (seeded) and the bundled real ones, truncated at 8192."""
    rng = np.random.default_rng(2024)
    scale = 4 if quick else 1
    out = {
        "reference (ln 1050, 0.5)": lognormal(rng, 902_087 // scale, 1050, 0.5, 16),
        "ln 300, 1.0": lognormal(rng, 300_000 // scale, 300, 1.0),
        "ln 2000, 0.7 (long)": lognormal(rng, 200_000 // scale, 2000, 0.7, 16),
        "ln 600, 1.4 (wide)": lognormal(rng, 400_000 // scale, 600, 1.4),
        "bimodal 120 / 2500": np.concatenate([lognormal(rng, 150_000 // scale, 120, 0.4),
                                              lognormal(rng, 150_000 // scale, 2500, 0.4)]),
        "short 50 (100k)": lognormal(rng, 100_000, 50, 0.8),
        "chat 330 (22k)": lognormal(rng, 22_000, 330, 0.9),
        "ln 800, 1.0 (20k)": lognormal(rng, 20_000, 800, 1.0),
        "short 120, 0.6 (60k)": lognormal(rng, 60_000, 120, 0.6),
    }
    for name in bundled_names():
        out[f"bundled {name}"] = load_lengths(name, max_len=8192)
    return out


def calibrated_cost() -> tuple[CostModel, str]:
    """The cost model fitted by ``lengthwise.calibrate`` on a small causal LM on this CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lengthwise.pytorch.calibrate import calibrate

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg)

    def step(rows: int, padded_len: int) -> None:
        ids = torch.randint(0, 512, (rows, padded_len))
        model(input_ids=ids, labels=ids).loss.backward()

    cal = calibrate(step, shapes=[(r, p) for r in (1, 2, 4) for p in (128, 256, 512, 1024)],
                    repeats=5)
    # in microseconds: the figures below are ratios, so the unit does not matter
    model_ = CostModel(a=cal.a * 1e6, b=cal.b * 1e6, c=cal.c * 1e6)
    text = (f"Llama-style, 2 layers, hidden 128, eager attention, fp32 on this CPU, timed by "
            f"`lengthwise.calibrate` on rows 1-4 x lengths 128-1024: CostModel(a={model_.a:.3g}, "
            f"b={model_.b:.3g}, c={model_.c:.3g}) in microseconds")
    return model_, text


def step_time(plan, cost: CostModel) -> float:
    """Sum over optimizer steps (and accumulation slots) of the slowest rank's cost."""
    off = plan.offsets
    rows = np.diff(off)
    padded = batching.batch_padded_lengths(plan.lengths, plan.indices, off,
                                           plan.config.pad_multiple)
    c = cost.batch_cost(rows, padded)
    w = plan.world_size
    m = c.size - c.size % w
    return float(c[:m].reshape(-1, w).max(axis=1).sum() + (c[m:].max() if c.size > m else 0))


def padded_row(base: dict, rule: str, lens: np.ndarray, kw: PlanConfig, ref, cost: CostModel,
               buckets="auto") -> tuple[dict, object]:
    """One padded plan's figures (epochs 0 and 1), with its step times against ``ref``."""
    p0 = plan_epoch(lens, replace(kw, buckets=buckets))
    p1 = plan_epoch(lens, replace(kw, buckets=buckets), epoch=1)
    tokens = CostModel()
    # p0.stats holds budget_fill: padded tokens over max_tokens x micro-batches
    return {**base, "edge_rule": rule, **p0.stats, "recomposition": recomposition(p0, p1),
            "step_time_vs_sorted": step_time(p0, tokens) / step_time(ref, tokens),
            "calibrated_step_time_vs_sorted": step_time(p0, cost) / step_time(ref, cost)}, p0


def measure(name: str, lens: np.ndarray, world: int, cost: CostModel) -> list[dict]:
    kw = PlanConfig(max_tokens=BUDGET, world_size=world)
    ref = plan_epoch(lens, replace(kw, order="sorted"))
    base = {"shape": name, "samples": int(lens.size), "world": world}
    row, p0 = padded_row(base, "auto", lens, kw, ref, cost)
    rows = [row]
    if world == 64:
        hist = Histogram.of(p0.lengths[p0.indices])
        # the same lengths with padding-optimal edges (no budget share), and with edges priced
        # by their budget share alone (fill_weight=1: they sit at budget / rows)
        for rule, weight in (("padding-only", 0.0), ("budget-share", 1.0)):
            edges = auto_edges(hist, batch_size=None, max_tokens=BUDGET, fill_weight=weight)
            rows.append(padded_row(base, rule, lens, kw, ref, cost, buckets=tuple(edges))[0])
        # steps of one cost level: the same micro-batches, sorted by cost into steps
        rows.append(padded_row(base, "level", lens, replace(kw, balance="level"), ref, cost)[0])
        # the packed layout: rows of max_tokens filled end to end, so micro-batches cost alike
        k0 = plan_epoch(lens, replace(kw, layout="pack"))
        k1 = plan_epoch(lens, replace(kw, layout="pack"), epoch=1)
        rows.append({**base, "edge_rule": "packed layout", **k0.stats,
                     "recomposition": recomposition(k0, k1)})
    return rows


def shape_args(doc: str, out_name: str) -> argparse.Namespace:
    """``--quick`` (quarter-size shapes) and ``--out`` (default ``benchmarks/<out_name>``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / out_name))
    return ap.parse_args()


def publish(out: str, text: str) -> int:
    """Write the report to ``out`` and print it; the exit status."""
    Path(out).write_text(text)
    print(text)
    return 0


def main() -> int:
    args = shape_args(__doc__, "SHAPE_RESULTS.md")
    started = time.perf_counter()
    cost, cost_text = calibrated_cost()
    print(cost_text, flush=True)
    rows = []
    for name, lens in shapes(args.quick).items():
        for world in (8, 64):
            rows += measure(name, lens, world, cost)
            print(name, world, fmt(rows[-1]["padding_efficiency"]),
                  fmt(rows[-1]["rank_imbalance_p99"]), flush=True)
    auto8 = [r for r in rows if r["world"] == 8]
    # at 64 ranks a data set of a few thousand samples is a handful of steps: the balance
    # target counts the shapes with at least 20 optimizer steps
    auto64 = [r for r in rows if r["world"] == 64 and r["edge_rule"] == "auto"
              and r["optimizer_steps"] >= 20]
    level64 = [r for r in rows if r["world"] == 64 and r["edge_rule"] == "level"
               and r["optimizer_steps"] >= 20]
    pack64 = [r for r in rows if r["world"] == 64 and r["edge_rule"] == "packed layout"
              and r["optimizer_steps"] >= 20]
    small = [r for r in auto8 if r["micro_batches_per_rank"] * 8 <= 1500]

    def share(pred, group):
        return f"{sum(1 for r in group if pred(r))} of {len(group)}"

    checks = [
        ("8 ranks: padding_efficiency >= 0.97",
         share(lambda r: r["padding_efficiency"] >= 0.97, auto8)),
        ("8 ranks: step_cv_ratio <= 1", share(lambda r: r["step_cv_ratio"] <= 1, auto8)),
        ("8 ranks: recomposition <= 0.01", share(lambda r: r["recomposition"] <= 0.01, auto8)),
        ("small sets (<= 1,500 micro-batches): padding_efficiency >= 0.97",
         share(lambda r: r["padding_efficiency"] >= 0.97, small)),
        ("64 ranks (>= 20 steps): rank_imbalance p99 <= 1.05",
         share(lambda r: r["rank_imbalance_p99"] <= 1.05, auto64)),
        ("64 ranks (>= 20 steps): padding_efficiency >= 0.97",
         share(lambda r: r["padding_efficiency"] >= 0.97, auto64)),
        ("64 ranks (>= 20 steps): rank_imbalance p50 within 2% of 1 / budget_fill",
         share(lambda r: abs(r["rank_imbalance_p50"] * r["budget_fill"] - 1) <= 0.02, auto64)),
        ("64 ranks (>= 20 steps), balance='level': rank_imbalance p99 <= 1.05",
         share(lambda r: r["rank_imbalance_p99"] <= 1.05, level64)),
        ("64 ranks (>= 20 steps), balance='level': padding_efficiency >= 0.97",
         share(lambda r: r["padding_efficiency"] >= 0.97, level64)),
        ("64 ranks (>= 20 steps), balance='level': step_cv_ratio <= 1",
         share(lambda r: r["step_cv_ratio"] <= 1, level64)),
        ("64 ranks (>= 20 steps), packed layout: rank_imbalance p99 <= 1.05",
         share(lambda r: r["rank_imbalance_p99"] <= 1.05, pack64)),
        ("64 ranks (>= 20 steps), packed layout: fill (padding_efficiency) >= 0.97",
         share(lambda r: r["padding_efficiency"] >= 0.97, pack64)),
    ]
    keys = ["shape", "samples", "world", "edge_rule", "padding_efficiency",
            "efficiency_vs_sorted", "step_cv_ratio", "recomposition", "rank_imbalance_p50",
            "rank_imbalance_p99", "budget_fill", "step_time_vs_sorted",
            "calibrated_step_time_vs_sorted", "num_buckets", "optimizer_steps"]
    cmd = "python benchmarks/shape_targets.py" + (" --quick" if args.quick else "")
    text = f"""# Many length distributions: efficiency, composition, balance

Generated by `{cmd}` on {time.strftime('%Y-%m-%d')} in {time.perf_counter() - started:.0f} s;
do not edit by hand. Machine: {machine()}.

Every shape is planned with the defaults (stratified, `buckets="auto"`), `max_tokens={BUDGET}`,
`grad_accum=1`, seed 0; `recomposition` compares epochs 0 and 1. `rank_imbalance` prices
micro-batches in padded tokens. `step_time_vs_sorted` is the epoch's time, the sum over steps
of the slowest rank's cost, over that of globally sorted batches at the same ranks (lower is
better), with micro-batches priced in padded tokens; `calibrated_step_time_vs_sorted` prices
them with the calibrated cost model: {cost_text}. In that small model the quadratic term
(`b*P`) is {cost.b * 1024 / max(cost.a + cost.b * 1024, 1e-12):.0%} of a token's cost at 1,024
tokens, far more than in a large model, so under a
token budget its long-sample micro-batches cost several times the short ones, and every step
that mixes lengths waits for its long batch (sorted batches do not mix); with such a model, plan
with a cost budget (`max_cost` and the fitted `cost`). At 64 ranks a second row plans the same
lengths with padding-optimal edges (`fill_weight=0`), the rule before edges were priced by their
share of the budget, a third one with edges priced by that share alone (`fill_weight=1`: they
lean to `max_tokens / rows`), a fourth one plans them with `balance="level"` (auto edges, the
same micro-batches as the first row, sorted by cost into steps, `docs/planner.md`), and a fifth
one packs them (`layout="pack"`, rows of
`max_tokens` filled end to end; its `padding_efficiency` is the fill, and step times are not
priced).
`budget_fill` is the mean over micro-batches of their padded tokens over `max_tokens`: where long
samples leave a micro-batch two to five rows, whole rows cannot fill the budget (two rows of
5,700 tokens are 70% of 16,384), each step of a stratified plan holds such batches beside full
ones, and `rank_imbalance_p50` comes out near `1 / budget_fill`.

## Targets (how many shapes meet them)

| target | shapes |
|---|---|
""" + "\n".join(f"| {name} | {v} |" for name, v in checks) + f"""

## Every shape

{table(rows, keys)}
"""
    return publish(args.out, text)


if __name__ == "__main__":
    sys.exit(main())
