"""The two-arm experiment's figures from its runs: per cell, per order, intervals over seeds.

:func:`run_arms` trains every run of an :class:`~experiments.arms.ArmsConfig` (in
worker processes when asked) and :func:`summarise_arms` turns the runs into the figures
the benchmark commits. Per cell (arm x schedule x batch) and order: the held-out loss
overall and per length stratum, the steps, micro-batches, real tokens, FLOPs and
seconds, each as mean and 95 % t-interval over seeds; the paired difference (by seed)
from ``random``, overall and per stratum; the mean curve (held-out loss with its interval
at each measurement, against steps, real tokens and FLOPs); the held-out loss at the last
measurements and whether it has settled. Per cell: how equal the arm made the runs (real
tokens per step, FLOPs). Overall: the unigram level of the held-out set.

Example::

    >>> cell_key(("data", "cosine", 8))
    'data/cosine/8'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.intervals import t_interval

from experiments.arms import ArmsConfig, budgets, run_arm, unigram_loss

__all__ = ["cell_key", "map_jobs", "paired_by_seed", "paired_difference", "run_arms",
           "settle_index", "settled", "summarise_arms", "versus"]

#: the measurements whose held-out loss the figures quote as the end of the curve
LAST_POINTS = 3
#: a held-out loss has settled when it moves less than its interval over this last share
SETTLE_SHARE = 0.2


def cell_key(cell: tuple[str, str, int]) -> str:
    """The name of a cell in the figures: ``arm/schedule/batch``."""
    arm, schedule, batch = cell
    return f"{arm}/{schedule}/{batch}"


def settle_index(points: int, share: float = SETTLE_SHARE) -> int:
    """Index of the measurement at ``1 - share`` of the run (the start of the tail).

    Example::

        >>> settle_index(10)
        7
    """
    return max(0, int(math.ceil((1 - share) * points)) - 1)


def settled(final: dict[str, Any], move: dict[str, Any]) -> bool:
    """Whether a held-out loss has settled: its mean move over the tail (``move``, an
    interval over seeds) is smaller than the half-width of the final loss's interval.

    Example::

        >>> settled({"mean": 5.0, "half": 0.1}, {"mean": 0.05, "half": 0.02})
        True
        >>> settled({"mean": 5.0, "half": None}, {"mean": 0.0, "half": None})
        False
    """
    half = final["half"]
    return bool(half is not None and math.isfinite(half) and abs(move["mean"]) < half)


def paired_difference(a: Mapping[Any, float | None], b: Mapping[Any, float | None],
                      ) -> dict[str, Any]:
    """``a - b`` over the seeds both have a value for, with its 95 % t-interval.

    ``detected`` is whether the interval excludes 0.
    """
    keys = [k for k in a if k in b and a[k] is not None and b[k] is not None]
    out = t_interval([float(a[k]) - float(b[k]) for k in keys])
    half = out["half"]
    out["detected"] = bool(half is not None and math.isfinite(half)
                           and abs(out["mean"]) > half)
    return out


def paired_by_seed(runs: Sequence[Mapping[str, Any]], order: str, ref: str, get: Any,
                   ) -> dict[str, Any]:
    """:func:`paired_difference` of ``get(run)`` between two orders' runs, paired by seed.

    Example::

        >>> runs = [{"order": "a", "seed": 0, "x": 2.0}, {"order": "b", "seed": 0, "x": 1.0},
        ...         {"order": "a", "seed": 1, "x": 3.0}, {"order": "b", "seed": 1, "x": 2.5}]
        >>> paired_by_seed(runs, "a", "b", lambda r: r["x"])["mean"]
        0.75
    """
    def by_seed(name: str) -> dict[Any, Any]:
        return {r["seed"]: get(r) for r in runs if r["order"] == name}

    return paired_difference(by_seed(order), by_seed(ref))


def versus(table: dict[str, dict[str, Any]], pair: Any,
           refs: Sequence[str] = ("random", "sorted")) -> None:
    """Add ``vs_REF = pair(order, ref)`` to every other order's row of ``table``, per ref there.

    Example::

        >>> table = {"random": {}, "sorted": {}}
        >>> versus(table, lambda order, ref: f"{order}-{ref}")
        >>> table
        {'random': {'vs_sorted': 'random-sorted'}, 'sorted': {'vs_random': 'sorted-random'}}
    """
    for ref in refs:
        if ref not in table:
            continue
        for order in table:
            if order != ref:
                table[order][f"vs_{ref}"] = pair(order, ref)


def map_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], *, workers: int = 1,
             on_result: Callable[[Any], None] | None = None) -> list[Any]:
    """``fn`` of every job, in the jobs' order; ``workers`` > 1 runs them in that many spawned
    processes (``fn`` and the jobs must pickle). ``on_result(result)`` is called as each ends,
    so a long experiment can save its runs as it goes.

    Example::

        >>> done = []
        >>> map_jobs(abs, [-1, 2, -3], workers=1, on_result=done.append)
        [1, 2, 3]
        >>> done
        [1, 2, 3]
    """
    out: list[Any] = []
    if workers <= 1 or len(jobs) <= 1:
        results: Any = map(fn, jobs)
        pool = None
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
        results = pool.map(fn, jobs)
    try:
        for result in results:
            out.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return out


def _one(args: tuple[Any, ...]) -> dict[str, Any]:
    job, data, cfg, out, budget = args
    return run_arm(job, data, cfg, out=out, budget=budget)


def run_arms(cfg: ArmsConfig, data: Any, *, out: str | Path, workers: int = 1,
             skip: set[tuple[Any, ...]] | None = None, on_run: Any = None,
             ) -> list[dict[str, Any]]:
    """Every run of ``cfg`` on ``data`` but those in ``skip``, ``workers`` at a time (one
    thread each, so the figures do not depend on ``workers``); ``on_run(run)`` as each ends."""
    plans = {b: budgets(cfg, data.lengths, data.vocab_size, b) for b in cfg.batches}
    jobs = [(job, data, cfg, str(out), plans[job[2]]) for job in cfg.jobs()
            if job not in (skip or set())]
    return map_jobs(_one, jobs, workers=workers, on_result=on_run)


def summarise_arms(cfg: ArmsConfig, data: Any, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The experiment's figures (see the module doc), ready to be written as JSON."""
    strata = data.strata()
    cells: dict[str, Any] = {}
    for cell, orders in cfg.cells():
        mine = [r for r in runs if (r["arm"], r["schedule"], r["batch"]) == cell]
        if not mine:
            continue
        table = {o: _order_row([r for r in mine if r["order"] == o], strata, cfg.eval_points)
                 for o in orders if any(r["order"] == o for r in mine)}
        versus(table, lambda order, ref, rs=mine: _paired(rs, order, ref, strata),
               refs=("random",))
        cells[cell_key(cell)] = {"arm": cell[0], "schedule": cell[1], "batch": cell[2],
                                 "budget": mine[0]["budget"], "equal": _equal(cell[0], mine),
                                 "orders": table}
    return {
        "config": cfg.to_dict(),
        "data": data.info,
        "strata": strata,
        "edges": data.edges,
        "vocab_size": data.vocab_size,
        "unigram_loss": unigram_loss(data.train, data.eval, data.vocab_size),
        "unigram_smoothing": "add-one (Laplace) over the vocabulary, from the training tokens",
        "settle_share": SETTLE_SHARE,
        "last_points": LAST_POINTS,
        "runs_wall_seconds": float(sum(r.get("wall_seconds") or 0.0 for r in runs)),
        "runs_cpu_seconds": float(sum(r.get("cpu_seconds") or 0.0 for r in runs)),
        "cells": cells,
        "runs": [{k: v for k, v in r.items() if k not in ("log", "budget")} for r in runs],
    }


def _order_row(mine: list[dict[str, Any]], strata: list[str], points: int) -> dict[str, Any]:
    def iv(get: Any) -> dict[str, Any]:
        return t_interval([get(r) for r in mine])

    tail = settle_index(points)
    final = iv(lambda r: r["eval_loss"])
    move = iv(lambda r: r["curve"][tail]["eval_loss"] - r["eval_loss"])
    curve = _curve(mine, points)
    return {
        "seeds": sorted(r["seed"] for r in mine),
        "eval_loss": final,
        "strata": {s: iv(lambda r, k=k: r["strata"][k]) for k, s in enumerate(strata)},
        "steps": iv(lambda r: r["steps"]),
        "micro_batches": iv(lambda r: r["micro_batches"]),
        "real_tokens": iv(lambda r: r["real_tokens"]),
        "padded_tokens": iv(lambda r: r["padded_tokens"]),
        "padding_efficiency": iv(lambda r: r["padding_efficiency"]),
        "flops": iv(lambda r: r["flops"]),
        "train_seconds": iv(lambda r: r["train_seconds"]),
        "tail_move": move,
        "settled": settled(final, move),
        "last": [p["eval_loss"] for p in curve[-LAST_POINTS:]],
        "curve": curve,
    }


def _paired(runs: list[dict[str, Any]], order: str, ref: str, strata: list[str],
            ) -> dict[str, Any]:
    def diff(get: Any) -> dict[str, Any]:
        return paired_by_seed(runs, order, ref, get)

    return {"eval_loss": diff(lambda r: r["eval_loss"]),
            "strata": {s: diff(lambda r, k=k: r["strata"][k]) for k, s in enumerate(strata)},
            "flops": diff(lambda r: r["flops"]),
            "real_tokens": diff(lambda r: r["real_tokens"])}


def _equal(arm: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """How equal the arm made a cell's runs: steps and real tokens per step (arm ``data``),
    FLOPs against the budget (arm ``compute``)."""
    steps = [r["steps"] for r in runs]
    out: dict[str, Any] = {"steps_min": min(steps), "steps_max": max(steps)}
    if arm == "data":
        lo = min(r["step_tokens_min"] for r in runs)
        hi = max(r["step_tokens_max"] for r in runs)
        tokens = [r["real_tokens"] for r in runs]
        out.update({"step_tokens_min": lo, "step_tokens_max": hi,
                    "step_tokens_ratio": hi / lo if lo else None,
                    "real_tokens_min": min(tokens), "real_tokens_max": max(tokens)})
    else:
        flops = [r["flops"] for r in runs]
        out.update({"flops_budget": runs[0]["budget"]["flops"], "flops_min": min(flops),
                    "flops_max": max(flops)})
    return out


def _curve(mine: list[dict[str, Any]], n: int, figures: Sequence[str] = ("eval_loss",),
           ) -> list[dict[str, Any]]:
    """Mean step, real tokens, FLOPs and seconds, and the interval of each held-out figure
    of ``figures``, at each measurement."""
    out = []
    for i in range(n):
        pts = [r["curve"][i] for r in mine if len(r["curve"]) > i]
        out.append({k: float(np.mean([p[k] for p in pts]))
                    for k in ("step", "tokens", "flops", "seconds")}
                   | {k: t_interval([p[k] for p in pts]) for k in figures})
    return out
