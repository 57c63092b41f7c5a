"""The DFlash order experiment's figures from its runs, and their reading.

:func:`summarise_dflash` turns the runs of a :class:`~experiments.dflash_arms.DFlashArms`
into the figures the benchmark commits. Per cell (arm x schedule x batch) and order,
as mean and 95 % t-interval over seeds: the held-out loss, teacher-forced accuracy
overall and per block position, expected acceptance at temperature 0 and 1, the
acceptance length the accuracies imply, ``tokens_per_second`` and
``padding_efficiency``, steps, micro-batches, real tokens and FLOPs; the paired
difference (by seed) from ``random``; the loss log's stable-region figures and the
doctor's findings (:mod:`experiments.loss_log`); the bucket edges each order's plan
used. Per cell: how equal the arm made the runs. :func:`table` and :func:`decisions`
read them.

Example::

    >>> cell = {"arm": "compute", "schedule": "cosine", "batch": 2, "orders": {
    ...     "random": {}, "sorted": {"vs_random": {"eval_loss": {"mean": 0.1, "half": 0.3,
    ...     "detected": False}}}}}
    >>> decision_sentence(cell, seeds=5).split(": ")[:3]
    ['Same compute, cosine, against random (5 seeds)', 'held-out loss', 'no difference \
detected at this size; expected acceptance (T = 0)']
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lengthwise.intervals import t_interval

from experiments.arms_report import _curve, _equal, cell_key, paired_by_seed, versus

__all__ = ["decision_sentence", "decisions", "summarise_dflash", "table"]

#: the run figures compared against random's, paired by seed
PAIRED = ("eval_loss", "eval_accuracy", "expected_acceptance", "expected_acceptance_t1",
          "flops", "real_tokens")
#: the held-out figures of each measurement of the curve
CURVE = ("eval_loss", "eval_accuracy", "expected_acceptance")
#: a run's figures summarised over seeds
FIGURES = ("eval_loss", "eval_accuracy", "expected_acceptance", "expected_acceptance_t1",
           "simulated_acceptance", "tokens_per_second", "padding_efficiency", "steps",
           "micro_batches", "real_tokens", "padded_tokens", "flops", "train_seconds",
           "skipped_steps")
#: the figures runs have only when measured (real acceptance: a design with prompts)
MEASURED = ("acceptance_length",)
#: the most words of a decision sentence
MAX_WORDS = 60


def _stable(mine: list[dict[str, Any]]) -> dict[str, Any]:
    """The loss logs' stable-region figures over seeds, and each seed's doctor findings."""
    logs = [r["loss_log"] for r in mine]
    ok = [x["stable"] for x in logs if "stable" in x]

    def iv(get: Any) -> dict[str, Any]:
        return t_interval([get(s) for s in ok])

    return {
        "mean": iv(lambda s: s["mean"]), "std": iv(lambda s: s["std"]),
        "bands_at_0_1": iv(lambda s: s["bands_at_0_1"]),
        "longest_same_bucket_run": iv(lambda s: s["longest_same_bucket_run"]),
        "low_to_low_gap": iv(lambda s: s["low_to_low_gaps"]["mean"]),
        "findings": {str(r["seed"]): [f["name"] for f in r["loss_log"].get("findings", [])]
                     for r in mine},
        "step_findings": {str(r["seed"]): [f["name"] for f in r["step_loss_log"].get(
            "findings", [])] for r in mine if "step_loss_log" in r},
        "errors": [x["error"] for x in logs if "error" in x],
    }


def _row(mine: list[dict[str, Any]], points: int) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": sorted(r["seed"] for r in mine)}
    out.update({k: t_interval([r[k] for r in mine]) for k in _figures(FIGURES, mine)})
    width = max(len(r["slot_accuracy"]) for r in mine)
    out["slot_accuracy"] = [t_interval([r["slot_accuracy"][k] for r in mine
                                        if len(r["slot_accuracy"]) > k]) for k in range(width)]
    out["edges"] = mine[0]["edges"]
    out["loss_log"] = _stable(mine)
    out["curve"] = _curve(mine, points, CURVE)
    return out


def _paired(runs: list[dict[str, Any]], order: str, ref: str) -> dict[str, Any]:
    """The paired differences (by seed) of :data:`PAIRED` between two orders' runs."""
    def get(key: str) -> Any:
        return lambda r: r[key]

    return {k: paired_by_seed(runs, order, ref, get(k)) for k in _figures(PAIRED, runs)}


def _figures(names: tuple[str, ...], runs: list[dict[str, Any]]) -> tuple[str, ...]:
    """``names`` and the :data:`MEASURED` figures every one of ``runs`` holds."""
    return (*names, *(k for k in MEASURED if runs and all(k in r for r in runs)))


def summarise_dflash(design: Any, runs: list[dict[str, Any]], info: dict[str, Any],
                     ) -> dict[str, Any]:
    """The experiment's figures (see the module doc), ready to be written as JSON."""
    cells: dict[str, Any] = {}
    for cell, orders in design.cells():
        mine = [r for r in runs if (r["arm"], r["schedule"], r["batch"]) == cell]
        if not mine:
            continue
        rows = {o: _row([r for r in mine if r["order"] == o], design.eval_points)
                for o in orders if any(r["order"] == o for r in mine)}
        versus(rows, lambda order, ref, rs=mine: _paired(rs, order, ref), refs=("random",))
        cells[cell_key(cell)] = {"arm": cell[0], "schedule": cell[1], "batch": cell[2],
                                 "budget": mine[0]["budget"], "equal": _equal(cell[0], mine),
                                 "orders": rows}
    return {"config": design.to_dict(), "data": info, "cells": cells,
            "runs_wall_seconds": float(sum(r.get("wall_seconds") or 0.0 for r in runs)),
            "runs_cpu_seconds": float(sum(r.get("cpu_seconds") or 0.0 for r in runs)),
            "runs": [{k: v for k, v in r.items() if k not in ("log", "micro_log", "budget")}
                     for r in runs]}


def _pm(d: dict[str, Any] | None, fmt: str = ".3f") -> str:
    if not d or d.get("mean") is None:
        return "-"
    half = d.get("half")
    text = format(d["mean"], fmt)
    return text if half is None or not math.isfinite(half) else (
        f"{text} ± {format(half, fmt.lstrip('+'))}")


def _where(cell: dict[str, Any]) -> str:
    arm = "Same data" if cell["arm"] == "data" else "Same compute"
    return f"{arm}, {cell['schedule']}"


def table(cell: dict[str, Any]) -> str:
    """One Markdown row per order of ``cell`` (at most 8): held-out figures, their paired
    difference from random, throughput, padding, compute and the loss log's shape."""
    head = ["order", "held-out loss", "vs random", "accuracy", "E[accept] T=0", "vs random",
            "E[accept] T=1", "accept length T=0", "tokens/s", "padding eff.", "GFLOP",
            "steps", "micro-batches", "bands (0.1)", "same-bucket run"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, row in list(cell["orders"].items())[:8]:
        vs = row.get("vs_random") or {}
        log = row["loss_log"]
        lines.append("| " + " | ".join([
            name, _pm(row["eval_loss"]), _pm(vs.get("eval_loss"), "+.3f"),
            _pm(row["eval_accuracy"]), _pm(row["expected_acceptance"]),
            _pm(vs.get("expected_acceptance"), "+.3f"), _pm(row["expected_acceptance_t1"]),
            _pm(row.get("acceptance_length")), _pm(row["tokens_per_second"], ".0f"),
            _pm(row["padding_efficiency"], ".2f"),
            f"{row['flops']['mean'] / 1e9:,.0f}", f"{row['steps']['mean']:.0f}",
            f"{row['micro_batches']['mean']:.0f}", _pm(log["bands_at_0_1"], ".1f"),
            _pm(log["longest_same_bucket_run"], ".1f")]) + " |")
    return "\n".join(lines)


def _detected(d: dict[str, Any] | None) -> bool:
    return bool(d and d.get("detected"))


def decision_sentence(cell: dict[str, Any], *, seeds: int) -> str:
    """The setting's reading in one sentence of at most :data:`MAX_WORDS` words: per figure
    (held-out loss, expected acceptance at T = 0, the real acceptance length when measured)
    the orders that differ from random (paired 95 % intervals that exclude zero), else no
    difference detected at this size;
    in arm ``data``, random's micro-batches against the fewest of another order."""
    parts = []
    figures = [("eval_loss", "held-out loss", -1),
               ("expected_acceptance", "expected acceptance (T = 0)", 1)]
    if all("acceptance_length" in row for row in cell["orders"].values()):
        figures.append(("acceptance_length", "acceptance length", 1))
    for key, what, better in figures:
        found = []
        for name, row in cell["orders"].items():
            d = (row.get("vs_random") or {}).get(key)
            if _detected(d):
                word = "better" if d["mean"] * better > 0 else "worse"
                found.append(f"{name}'s is {word} by {abs(d['mean']):.3f} "
                             f"(± {d['half']:.3f})")
        parts.append(f"{what}: " + ("; ".join(found[:3]) if found else
                                    "no difference detected at this size"))
    text = f"{_where(cell)}, against random ({seeds} seed{'s' * (seeds != 1)}): " + \
        "; ".join(parts) + "."
    orders = cell["orders"]
    if cell["arm"] == "data" and "random" in orders and len(orders) > 1:
        fewest = min((o for o in orders if o != "random"),
                     key=lambda o: orders[o]["micro_batches"]["mean"])
        ratio = orders["random"]["micro_batches"]["mean"] / orders[fewest]["micro_batches"][
            "mean"]
        text += f" Random took {ratio:.2f}x {fewest}'s micro-batches."
    words = text.split()
    return text if len(words) <= MAX_WORDS else " ".join(words[:MAX_WORDS - 1]) + " ..."


def decisions(summary: dict[str, Any]) -> list[str]:
    """One :func:`decision_sentence` per setting."""
    seeds = len(summary["config"]["seeds"])
    return [decision_sentence(c, seeds=seeds) for c in summary["cells"].values()]


def edges_text(summary: dict[str, Any]) -> str:
    """The bucket edges each order's plan used, with its padding efficiency (first cell)."""
    cell = next(iter(summary["cells"].values()))
    return "\n".join(f"- {name}: edges {row['edges'] or '-'}, padding efficiency "
                     f"{_pm(row['padding_efficiency'], '.3f')}"
                     for name, row in cell["orders"].items())


def micro_losses(summary: dict[str, Any], cell: str) -> dict[str, list[float]]:
    """The per-micro-batch loss of each order's first seed in ``cell`` (for the plot)."""
    c = summary["cells"][cell]
    out = {}
    for name in c["orders"]:
        runs = [r for r in summary["runs"] if cell_key((r["arm"], r["schedule"], r["batch"]))
                == cell and r["order"] == name]
        if runs:
            first = min(runs, key=lambda r: r["seed"])
            out[name] = [np.nan if x is None else float(x) for x in first["micro_loss"]]
    return out
