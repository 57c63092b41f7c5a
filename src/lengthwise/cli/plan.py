"""``lengthwise plan``: bucket edges, one epoch's plan and its figures, or every order side by side.

Example::

    $ lengthwise plan sft_mix --max-len 8192 --max-tokens 16384 --world-size 8 --compare
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from lengthwise.planning.batching import batch_padded_lengths
from lengthwise.progress import progress

COMPARE_ORDERS = ("sorted", "random", "bucket-random", "interleave", "stratified")
SUMMARY_KEYS = (
    "padding_efficiency", "efficiency_vs_sorted", "step_length_cv", "step_sample_cv",
    "step_cv_ratio", "rank_imbalance_p50", "rank_imbalance_p99", "max_same_bucket_run",
    "recomposition", "num_batches", "plan_seconds",
)
COUNT_KEYS = ("samples", "planned", "truncated", "dropped_empty", "dropped_overflow",
              "split_batches", "dropped_to_even_out", "repeated")


def _buckets(text: str) -> int | str | list[int]:
    if text == "auto":
        return "auto"
    if "," in text:
        try:
            return [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"edges must be integers: {text!r}") from None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--buckets takes a count, 'auto' or edges E1,E2,...; got {text!r}") from None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan", help="plan an epoch of length-aware batches and report its figures",
        description="Plan one epoch of micro-batches from per-sample lengths and report "
                    "the figures of docs/metrics.md (padding efficiency, step composition, ...).")
    p.add_argument("lengths", help="a bundled name (sft_mix, ...), .npy, .txt, "
                   "FILE.jsonl:FIELD, FILE.parquet:COLUMN or FILE.arrow:COLUMN")
    p.add_argument("--max-len", type=int, default=None, help="longest sample kept (tokens)")
    p.add_argument("--on-overflow", choices=("truncate", "drop", "error"), default="truncate",
                   help="what to do with samples over --max-len or the budget (default truncate)")
    rule = p.add_mutually_exclusive_group()
    rule.add_argument("--batch-size", type=int, help="rows per micro-batch")
    rule.add_argument("--max-tokens", type=int, help="padded tokens per micro-batch "
                      "(rows x padded length); the default is 16384")
    p.add_argument("--buckets", type=_buckets, default="auto",
                   help="number of buckets, 'auto' (default) or upper edges E1,E2,...")
    p.add_argument("--order", choices=COMPARE_ORDERS, default="stratified")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--max-run", type=int, default=3)
    p.add_argument("--pad-multiple", type=int, default=1)
    p.add_argument("--even-out", choices=("split", "drop", "repeat"), default="split",
                   help="how ranks get equal micro-batch counts: split batches (default, every "
                        "sample once), drop or repeat whole batches (counted)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--compare", action="store_true", help="one row per order on the same lengths")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="PLAN.npz", help="save the plan (indices, offsets, ...)")
    p.set_defaults(func=run)


def _plan_with_recomposition(lengths: np.ndarray, kwargs: dict) -> dict:
    from lengthwise.planning.metrics import recomposition
    from lengthwise.planning.plan import plan_epoch

    plan = plan_epoch(lengths, **kwargs)
    stats = dict(plan.stats)
    nxt = plan_epoch(lengths, **{**kwargs, "epoch": kwargs["epoch"] + 1})
    stats["recomposition"] = recomposition(plan, nxt)
    return {"plan": plan, "stats": stats}


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _edge_table(plan) -> str:
    """Edges with samples, share and padding efficiency of each bucket's micro-batches."""
    edges = np.asarray(plan.edges)
    lens = plan.lengths[plan.indices]
    counts = np.bincount(np.searchsorted(edges, lens, side="left"), minlength=edges.size)
    rows = np.diff(plan.offsets)
    padded_len = batch_padded_lengths(plan.lengths, plan.indices, plan.offsets,
                                      plan.config.pad_multiple)
    real = np.bincount(plan.bucket, weights=np.add.reduceat(lens, plan.offsets[:-1]),
                       minlength=edges.size)
    padded = np.bincount(plan.bucket, weights=rows * padded_len, minlength=edges.size)
    out = ["bucket  upper_edge  samples   share  efficiency"]
    total = counts.sum()
    for k in range(edges.size):
        eff = f"{real[k] / padded[k]:10.3f}" if padded[k] else "         -"
        out.append(f"{k:>6}  {edges[k]:>10}  {counts[k]:>7}  {counts[k] / total:6.1%}  {eff}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from lengthwise.planning.lengths import load_lengths

    lengths = load_lengths(args.lengths)
    if args.batch_size is None and args.max_tokens is None:
        args.max_tokens = 16384
    base = dict(
        epoch=args.epoch, seed=args.seed, max_tokens=args.max_tokens, batch_size=args.batch_size,
        buckets=args.buckets, world_size=args.world_size, grad_accum=args.grad_accum,
        max_run=args.max_run, max_len=args.max_len, pad_multiple=args.pad_multiple,
        on_overflow=args.on_overflow, even_out=args.even_out)
    orders = COMPARE_ORDERS if args.compare else (args.order,)
    results = {}
    show = len(lengths) >= 1_000_000 or args.compare
    for order in progress(orders, desc="planning", unit="order", enable=show):
        results[order] = _plan_with_recomposition(lengths, {**base, "order": order})
    main = results[args.order if args.order in results else orders[-1]]
    if args.out:
        plan = main["plan"]
        np.savez(args.out, indices=plan.indices, offsets=plan.offsets, bucket=plan.bucket,
                 edges=np.asarray(plan.edges), world_size=plan.world_size,
                 grad_accum=plan.grad_accum)
    if args.json:
        out = _clean({k: v for k, v in main["stats"].items()})
        if args.compare:
            out["strategies"] = {o: _clean(r["stats"]) for o, r in results.items()}
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    stats = main["stats"]
    rule = (f"batch_size={args.batch_size}" if args.batch_size is not None
            else f"max_tokens={args.max_tokens}")
    print(f"lengths: {args.lengths}  samples: {stats['samples']:,}  rule: {rule}  "
          f"world_size={args.world_size}  grad_accum={args.grad_accum}")
    print(f"{len(main['plan'].edges)} buckets")
    print(_edge_table(main["plan"]))
    print()
    counts = "  ".join(f"{k}={stats.get(k, 0)}" for k in COUNT_KEYS)
    print(f"counts: {counts}")
    if args.compare:
        header = ["order", *SUMMARY_KEYS]
        table = [header] + [[o, *(_fmt(r["stats"].get(k)) for k in SUMMARY_KEYS)]
                            for o, r in results.items()]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    else:
        print(f"order: {args.order}")
        for key in SUMMARY_KEYS:
            print(f"  {key:<22} {_fmt(stats.get(key))}")
    return 0


def _clean(stats: dict) -> dict:
    out = {}
    for k, v in stats.items():
        if isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out
