"""``lengthwise plan``: bucket edges, one epoch's plan and its figures, or every order side by side.

Example::

    $ lengthwise plan sft_mix --max-len 8192 --max-tokens 16384 --world-size 8 --compare
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from typing import TYPE_CHECKING

from lengthwise.atomic import atomic_open
from lengthwise.cli._options import add_config_flags, config_from_args
from lengthwise.errors import ConfigError
from lengthwise.planning.vocabulary import ORDERS, PACK_ORDERS, SEQUENCE_ORDERS
from lengthwise.progress import progress
from lengthwise.terminal import TEXT_WIDTH, fit_lines

if TYPE_CHECKING:
    import numpy as np

    from lengthwise.planning.config import PlanConfig

HELP = "plan an epoch of length-aware batches and report its figures"

COMPARE_ORDERS = ORDERS
DEFAULT_MAX_TOKENS = 16384
#: figures printed per order; micro-batch counts are named per rank or over all ranks
SUMMARY_KEYS = (
    "padding_efficiency", "budget_fill", "efficiency_vs_sorted", "step_length_cv", "step_sample_cv",
    "step_cv_ratio", "rank_imbalance_p50", "rank_imbalance_p99", "max_same_bucket_run",
    "recomposition", "micro_batches_per_rank", "micro_batches", "optimizer_steps",
    "plan_seconds",
)
COUNT_KEYS = ("samples", "planned", "truncated", "truncated_tokens", "dropped_empty",
              "dropped_overflow", "split_batches", "dropped_to_even_out", "repeated")
#: why the step figures cannot separate orders with one micro-batch per step
ONE_STEP_NOTE = (
    "note: with 1 rank and no gradient accumulation every optimizer step is one micro-batch, "
    "so no order can mix lengths inside a step and step_length_cv / step_cv_ratio cannot tell "
    "the orders apart; give the run's --world-size and --grad-accum (e.g. --world-size 8 "
    "--grad-accum 4) to compare them")
#: the edge table's rows without --wide: the first and last this many buckets
EDGE_ROWS_SHOWN = 5
#: the orders that cut the same batches inside buckets
BUCKET_ORDERS = tuple(o for o in ORDERS if o not in SEQUENCE_ORDERS)


def register(subparsers) -> None:
    from lengthwise.planning.config import PlanConfig

    p = subparsers.add_parser(
        "plan", help=HELP,
        description="Plan one epoch of micro-batches from per-sample lengths and report "
                    "the figures of docs/metrics.md (padding efficiency, step composition, ...).")
    p.add_argument("lengths", help="a bundled name (sft_mix, ...; a file of that name in the "
                   "working folder wins), .npy, .txt, FILE.jsonl:FIELD, FILE.parquet:COLUMN, "
                   "FILE.arrow:COLUMN, a Megatron index PREFIX.idx, or FOLDER:COLUMN (a folder "
                   "of Parquet shards)")
    add_config_flags(p, PlanConfig, skip=("cost", "max_cost"),
                     exclusive=("batch_size", "max_tokens"),
                     defaults={"max_tokens": DEFAULT_MAX_TOKENS})
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--epoch", type=int, default=0, help="epoch to plan (default: 0)")
    p.add_argument("--compare", action="store_true",
                   help="one row per order on the same lengths (default: off)")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: off)")
    p.add_argument("--wide", action="store_true",
                   help=f"every bucket's row, and --compare as one row per order; without it "
                        f"the text fits {TEXT_WIDTH} columns (default: off)")
    p.add_argument("--out", metavar="PLAN.npz", default=None,
                   help="save the plan (indices, offsets, ...) to this file (default: not saved)")
    p.set_defaults(func=run)


def _plan_with_recomposition(lengths: np.ndarray, config: PlanConfig, seed: int, epoch: int,
                             formed: dict) -> dict:
    """One order's plan and its figures, ``recomposition`` against the next epoch's batches.

    ``formed`` keeps the next epoch's padded batch sets by :func:`_formation`, so that the
    orders of a comparison that cut the same batches form them once.
    """
    from lengthwise.planning.metrics import recomposition, recomposition_of
    from lengthwise.planning.padded import padded_batch_sets
    from lengthwise.planning.plan import plan_epoch

    plan = plan_epoch(lengths, config, seed=seed, epoch=epoch)
    stats = dict(plan.stats)
    if config.layout == "pad":  # the next epoch's batches, not their order
        key = _formation(plan)
        if key not in formed:
            formed[key] = padded_batch_sets(lengths, plan.config, seed=plan.seed,
                                            epoch=plan.epoch + 1)
        idx, off = formed[key]
        stats["recomposition"] = recomposition_of(plan.offsets, plan.indices, off, idx)
    else:
        stats["recomposition"] = recomposition(plan, plan_epoch(lengths, config, seed=seed,
                                                                epoch=epoch + 1))
    return {"plan": plan, "stats": stats}


def _formation(plan) -> tuple:
    """What forms the next epoch's padded batches: the plan's settings but those of the
    order (the orders that cut batches inside buckets cut the same ones), its seed, the
    next epoch."""
    cfg = plan.config
    order = cfg.order if cfg.order in SEQUENCE_ORDERS else BUCKET_ORDERS[0]
    return (dataclasses.replace(cfg, order=order, balance="none", max_run=1), plan.seed,
            plan.epoch + 1)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _edge_table(plan, wide: bool = False) -> str:
    """Edges with samples, share and padding efficiency of each bucket's micro-batches: the first
    and last :data:`EDGE_ROWS_SHOWN` buckets unless ``wide``."""
    import numpy as np

    from lengthwise.planning.batching import longest_per_batch
    from lengthwise.planning.cost import round_up
    from lengthwise.planning.edges import bucket_counts
    from lengthwise.planning.metrics import gathered_lengths

    edges = np.asarray(plan.edges)
    lens = gathered_lengths(plan.lengths, plan.indices)  # narrow: once for every sum
    counts = bucket_counts(lens, edges)  # from the histogram: a pass, not a search per sample
    rows = np.diff(plan.offsets)
    longest = longest_per_batch(lens, plan.offsets).astype(np.int64)
    padded_len = round_up(longest, plan.config.pad_multiple)
    real = np.bincount(plan.bucket, minlength=edges.size,
                       weights=np.add.reduceat(lens, plan.offsets[:-1], dtype=np.int64))
    padded = np.bincount(plan.bucket, weights=rows * padded_len, minlength=edges.size)
    shown = np.arange(edges.size)
    if not wide and edges.size > 2 * EDGE_ROWS_SHOWN + 1:
        shown = np.r_[shown[:EDGE_ROWS_SHOWN], shown[-EDGE_ROWS_SHOWN:]]
    out = [f"{edges.size} buckets", "bucket  upper_edge  samples   share  efficiency"]
    total = counts.sum()
    for k in shown:
        if shown.size < edges.size and k == shown[-EDGE_ROWS_SHOWN]:
            out.append(f"{'...':>6}  ({edges.size - shown.size} buckets more: --wide lists "
                       "every bucket)")
        eff = f"{real[k] / padded[k]:10.3f}" if padded[k] else "         -"
        out.append(f"{k:>6}  {edges[k]:>10}  {counts[k]:>7}  {counts[k] / total:6.1%}  {eff}")
    return "\n".join(out)


def _rows_table(stats: dict) -> str:
    """The packed layout's rows: capacity, count, fill."""
    return (f"packed rows of {stats['capacity']} tokens: {stats['rows']} rows "
            f"({stats['rows_per_batch']} per micro-batch), fill {stats['fill']:.4f}, "
            f"fewest possible {stats['best_rows']}")


def _check_out(path: str | None) -> None:
    """Fail before planning when ``--out`` cannot be written."""
    if path is None:
        return
    if os.path.isdir(path):
        raise ConfigError(f"--out {path} is a folder; give a file name, e.g. "
                          f"{os.path.join(path, 'plan.npz')}")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise ConfigError(f"--out {path}: {folder} {what}")


def _save(path: str, plan) -> None:
    import numpy as np

    arrays = dict(indices=plan.indices, offsets=plan.offsets, world_size=plan.world_size,
                  grad_accum=plan.grad_accum)
    if hasattr(plan, "edges"):
        arrays.update(bucket=plan.bucket, edges=np.asarray(plan.edges))
    if getattr(plan, "row_offsets", None) is not None:
        arrays["row_offsets"] = plan.row_offsets
    with atomic_open(path) as fh:  # exactly this name (np.savez would add ".npz"), all or none
        np.savez(fh, **arrays)


def _warnings(main: dict) -> list[str]:
    """Lines about figures a reader could misread: cut tokens, one micro-batch per step."""
    from lengthwise.planning.prepare import cut_message

    plan = main["plan"]
    out = []
    cut = cut_message(main["stats"], plan.config.sample_limit(), plan.config)
    if cut is not None:
        out.append(f"warning: {cut}")
    if main["stats"].get("edges_note"):
        out.append(f"note: {main['stats']['edges_note']}")
    return out


def run(args: argparse.Namespace) -> int:
    from lengthwise.planning.config import PlanConfig
    from lengthwise.planning.lengths import load_lengths

    _check_out(args.out)
    lengths = load_lengths(args.lengths)
    if args.batch_size is not None:  # the flags exclude each other: the budget is the default
        args.max_tokens = None
    config = config_from_args(PlanConfig, args)
    if args.layout == "pack" and args.buckets != "auto":
        edges = args.buckets
        given = ",".join(map(str, edges)) if isinstance(edges, tuple) else edges
        raise ConfigError(f"--buckets {given} sets the buckets of padded rows, but "
                          "--layout pack has no buckets; leave --buckets out, or use --layout pad")
    if args.layout == "pack" and args.pad_multiple != 1:
        raise ConfigError(f"--pad-multiple {args.pad_multiple} rounds padded rows up, but "
                          "--layout pack has no padded rows (its rows are --max-tokens long); "
                          "leave --pad-multiple out, or use --layout pad")
    orders = COMPARE_ORDERS if args.layout == "pad" else PACK_ORDERS
    orders = orders if args.compare else (args.order,)
    results = {}
    show = len(lengths) >= 1_000_000 or args.compare
    with warnings.catch_warnings():  # the cut share is reported below, once
        warnings.simplefilter("ignore", UserWarning)
        formed: dict = {}  # the next epoch's batch sets, formed once per formation
        for order in progress(orders, desc="planning", unit="order", enable=show):
            balance = args.balance if order == args.order else "none"
            results[order] = _plan_with_recomposition(
                lengths, dataclasses.replace(config, order=order, balance=balance), args.seed,
                args.epoch, formed)
    main = results[args.order if args.order in results else orders[-1]]
    notes = _warnings(main)
    if args.world_size * args.grad_accum == 1:
        notes.append(ONE_STEP_NOTE)  # step_cv_ratio is printed with or without --compare
    if args.out:
        _save(args.out, main["plan"])
    if args.json:
        out = _clean(main["stats"])
        out["notes"] = notes
        if args.compare:
            out["strategies"] = {o: _clean(r["stats"]) for o, r in results.items()}
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    _print_text(args, results, main, notes)
    return 0


def _print_text(args: argparse.Namespace, results: dict, main: dict, notes: list[str]) -> None:
    stats = main["stats"]
    rule = (f"batch_size={args.batch_size}" if args.batch_size is not None
            else f"max_tokens={args.max_tokens}")
    print(f"lengths: {args.lengths}  samples: {stats['samples']:,}  rule: {rule}  "
          f"layout: {args.layout}  world_size={args.world_size}  grad_accum={args.grad_accum}")
    print(_rows_table(stats) if args.layout == "pack"
          else _edge_table(main["plan"], wide=args.wide))
    print()
    counts = "  ".join(f"{k}={stats.get(k, 0)}" for k in COUNT_KEYS)
    lines = [f"counts: {counts}", *notes]
    print("\n".join(lines) if args.wide else fit_lines(lines))
    print("micro_batches_per_rank: on each rank; micro_batches: over all ranks")
    if args.compare:
        names = [_order_name(o, r["stats"]) for o, r in results.items()]
        cells = [[_fmt(r["stats"].get(k)) for k in SUMMARY_KEYS] for r in results.values()]
        if args.wide:  # one row per order
            print(_aligned([["order", *SUMMARY_KEYS]]
                           + [[n, *c] for n, c in zip(names, cells, strict=True)]))
        else:  # one column per order, so that five orders fit the text width
            print(_aligned([["figure", *names]]
                           + [[k, *(c[i] for c in cells)] for i, k in enumerate(SUMMARY_KEYS)]))
    else:
        print(f"order: {_order_name(args.order, stats)}")
        for key in SUMMARY_KEYS:
            print(f"  {key:<24} {_fmt(stats.get(key))}")


def _aligned(table: list[list[str]]) -> str:
    """Rows of cells as text: the first column flush left, the others right-aligned.

    Example::

        >>> print(_aligned([["figure", "random"], ["padding_efficiency", "0.5"]]))
        figure              random
        padding_efficiency     0.5
    """
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join([row[0].ljust(widths[0])]
                               + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)])
                     .rstrip() for row in table)


def _order_name(order: str, stats: dict) -> str:
    """The order as a row of the figures names it, with its balance when it has one."""
    balance = stats.get("balance", "none")
    return order if balance == "none" else f"{order} (balance {balance})"


def _clean(stats: dict) -> dict:
    """JSON-ready figures (NaN and inf as null); the per-rank count is named
    ``micro_batches_per_rank`` only."""
    from lengthwise.doctor.numeric import json_ready

    # num_batches is the same as micro_batches_per_rank, named ambiguously
    return json_ready({k: v for k, v in stats.items() if k != "num_batches"})
