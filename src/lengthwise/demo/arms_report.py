"""The two-arm experiment's figures from its runs: per cell, per order, intervals over seeds.

:func:`run_arms` trains every run of an :class:`~lengthwise.demo.arms.ArmsConfig` (in
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

from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.demo.arms import ArmsConfig, budgets, run_arm, unigram_loss
from lengthwise.demo.evidence_report import SETTLE_SHARE, settle_index, settled
from lengthwise.demo.pool import map_jobs
from lengthwise.intervals import paired_by_seed, t_interval, versus

__all__ = ["cell_key", "run_arms", "summarise_arms"]

#: the measurements whose held-out loss the figures quote as the end of the curve
LAST_POINTS = 3


def cell_key(cell: tuple[str, str, int]) -> str:
    """The name of a cell in the figures: ``arm/schedule/batch``."""
    arm, schedule, batch = cell
    return f"{arm}/{schedule}/{batch}"


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


def _curve(mine: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Mean step, real tokens, FLOPs and seconds, and the held-out loss's interval, at each
    measurement."""
    out = []
    for i in range(n):
        pts = [r["curve"][i] for r in mine if len(r["curve"]) > i]
        out.append({k: float(np.mean([p[k] for p in pts]))
                    for k in ("step", "tokens", "flops", "seconds")}
                   | {"eval_loss": t_interval([p["eval_loss"] for p in pts])})
    return out
