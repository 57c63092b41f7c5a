"""The experiment's figures from its runs: means and 95 % intervals over seeds, paired differences.

:func:`run_experiment` trains every (order, seed) of an
:class:`~lengthwise.demo.evidence.EvidenceConfig` (in worker processes when asked)
and :func:`summarise` turns the runs into the committed figures:

* per order: held-out loss overall and per stratum, throughput, padding, real tokens,
  each as mean and 95 % t-interval over seeds;
* paired differences (by seed) against ``random`` and ``sorted``, overall and per stratum;
* tokens and training seconds to reach ``target_loss``, a held-out loss every run
  reaches (the highest loss any run has at half the budget);
* whether the held-out loss has settled: its move over the last 20 % of the budget
  against the interval of the final loss;
* the doctor on the step log and on rank 0's per-micro-batch log: bands (with the
  bucket and mean loss of each), verdict, and the noise budget with intervals.

Example::

    >>> curve = [{"tokens": 100, "seconds": 1.0, "eval_loss": 5.0},
    ...          {"tokens": 200, "seconds": 2.0, "eval_loss": 4.0}]
    >>> time_to_loss(curve, 4.5)
    {'tokens': 150.0, 'seconds': 1.5}
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.demo.evidence import EvidenceConfig, EvidenceData, build_data, run_one
from lengthwise.demo.pool import map_jobs
from lengthwise.intervals import equal_tokens, paired_by_seed, t_interval, versus

__all__ = ["doctor_figures", "run_experiment", "settle_index", "settled", "summarise",
           "time_to_loss"]

#: share of the budget whose move decides whether the held-out loss has settled
SETTLE_SHARE = 0.2
#: the target loss is the highest held-out loss of any run at this share of the budget
TARGET_SHARE = 0.5


def _one(args: tuple[str, int, EvidenceData, EvidenceConfig, str]) -> dict[str, Any]:
    order, seed, data, cfg, out = args
    run = run_one(order, seed, data, cfg, out=out)
    run["doctor"] = doctor_figures(run["log"], run["micro_log"], data)
    return run


def run_experiment(cfg: EvidenceConfig, *, out: str | Path, workers: int = 1,
                   texts: list[str] | None = None, cache_dir: str | Path | None = None,
                   skip: set[tuple[str, int]] | None = None,
                   on_run: Any = None) -> tuple[EvidenceData, list[dict[str, Any]]]:
    """Every (order, seed) run of ``cfg`` but those in ``skip``, ``workers`` at a time.

    Each run uses one thread, so its figures do not depend on ``workers`` (only its
    wall time does). ``on_run(run)`` is called as each run ends.
    """
    data = build_data(cfg, texts=texts, cache_dir=cache_dir)
    jobs = [(o, s, data, cfg, str(out)) for s in cfg.seeds for o in cfg.orders
            if (o, s) not in (skip or set())]
    return data, map_jobs(_one, jobs, workers=workers, on_result=on_run)


def doctor_figures(log: str | Path, micro_log: str | Path, data: EvidenceData,
                   ) -> dict[str, Any]:
    """The doctor on a run's step log and on its rank-0 per-micro-batch log: verdict, causes,
    bands (with the buckets behind each), each bucket's mean loss, the length ranges' levels
    (per-micro-batch log), noise budget."""
    from lengthwise.doctor import diagnose

    out: dict[str, Any] = {}
    for view, path in (("step", log), ("micro", micro_log)):
        report = diagnose(str(path), timing=False)
        noise, attr = report.noise, report.attribution
        out[view] = {
            "verdict": report.verdict.summary,
            "causes": [c.name for c in report.verdict.causes],
            "bands": _bands(report.bands, attr.per_bucket, data),
            "bucket_r2": attr.bucket_r2, "bucket_r2_adjusted": attr.bucket_r2_adjusted,
            "bucket_p_value": attr.bucket_p_value,
            "levels": [{"bucket": r["bucket"], "lengths": _label(r["bucket"], data),
                        "mean_loss": r["mean_loss"], "lines": r["steps"]}
                       for r in attr.per_bucket] if attr.single_bucket else [],
            # a per-micro-batch log's test of one level per length range
            "bucket_levels": None if attr.levels is None else attr.levels.to_dict(),
            "loss_roughness": float(report.stats.loss_roughness),
            "noise_shares": noise.shares if noise is not None else None,
            "excess": noise.excess if noise is not None else None,
        }
    return out


def _label(bucket: Any, data: EvidenceData) -> str | None:
    labels = data.strata()
    return labels[bucket] if isinstance(bucket, int) and 0 <= bucket < len(labels) else None


def _bands(bands: Any, per_bucket: list[dict[str, Any]], data: EvidenceData,
           ) -> list[dict[str, Any]]:
    """The bands the doctor found: each band's centre and share, and the buckets behind it."""
    from lengthwise.doctor.bands import band_buckets

    if bands is None or not bands.count or bands.count < 2:
        return []
    groups = band_buckets(bands, per_bucket)
    return [{"centre": float(c), "share": float(s),
             "buckets": [{"bucket": r["bucket"], "lengths": _label(r["bucket"], data),
                          "mean_loss": r["mean_loss"]} for r in g]}
            for c, s, g in zip(bands.centres, bands.shares, groups, strict=True)]


def time_to_loss(curve: list[dict[str, Any]], target: float) -> dict[str, float | None]:
    """Real tokens and training seconds at which the held-out ``curve`` first reaches
    ``target`` (linear between measurements; the first measurement when it is already
    below; ``None`` when never)."""
    prev = None
    for point in curve:
        if point["eval_loss"] <= target:
            if prev is None:
                return {"tokens": float(point["tokens"]), "seconds": float(point["seconds"])}
            a, b = prev["eval_loss"], point["eval_loss"]
            w = (a - target) / (a - b) if a != b else 1.0
            return {k: float(prev[k] + w * (point[k] - prev[k])) for k in ("tokens", "seconds")}
        prev = point
    return {"tokens": None, "seconds": None}


def settle_index(points: int, share: float = SETTLE_SHARE) -> int:
    """Index of the measurement at ``1 - share`` of the budget (the start of the tail).

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



def summarise(cfg: EvidenceConfig, data: EvidenceData, runs: list[dict[str, Any]],
              ) -> dict[str, Any]:
    """The experiment's figures (see the module doc), ready to be written as JSON."""
    orders = [o for o in cfg.orders if any(r["order"] == o for r in runs)]
    strata = data.strata()
    n = cfg.eval_points
    half_at = max(0, int(round(TARGET_SHARE * n)) - 1)
    target = max(r["curve"][half_at]["eval_loss"] for r in runs)
    for r in runs:
        r["time_to_loss"] = time_to_loss(r["curve"], target)
    tail = settle_index(n)
    table: dict[str, dict[str, Any]] = {}
    for order in orders:
        mine = [r for r in runs if r["order"] == order]

        def iv(get: Any, rows: list[dict[str, Any]] = mine) -> dict[str, Any]:
            return t_interval([get(r) for r in rows])

        final = iv(lambda r: r["eval_loss"])
        move = iv(lambda r: r["curve"][tail]["eval_loss"] - r["eval_loss"])
        table[order] = {
            "seeds": sorted(r["seed"] for r in mine),
            "eval_loss": final,
            "strata": {s: iv(lambda r, k=k: r["strata"][k]) for k, s in enumerate(strata)},
            "real_tokens": iv(lambda r: r["real_tokens"]),
            "steps": iv(lambda r: r["steps"]),
            "padding_efficiency": iv(lambda r: r["padding_efficiency"]),
            "step_cv_ratio": iv(lambda r: r["step_cv_ratio"]),
            "tokens_per_second": iv(lambda r: r["tokens_per_second"]),
            "train_seconds": iv(lambda r: r["train_seconds"]),
            "tokens_to_target": iv(lambda r: r["time_to_loss"]["tokens"]),
            "seconds_to_target": iv(lambda r: r["time_to_loss"]["seconds"]),
            "tail_move": move,
            "settled": settled(final, move),
            "noise": _noise(mine),
            "doctor": {view: _doctor_view(mine, view) for view in ("step", "micro")},
            "curve": _curve(mine, n),
        }
    versus(table, lambda order, ref: _paired(runs, order, ref, strata))
    return {
        "config": cfg.to_dict(),
        "data": data.info,
        "strata": strata,
        "edges": data.edges,
        "target_loss": target,
        "target_share": TARGET_SHARE,
        "settle_share": SETTLE_SHARE,
        "runs_wall_seconds": float(sum(r.get("wall_seconds") or 0.0 for r in runs)),
        "runs_cpu_seconds": (float(sum(r["cpu_seconds"] for r in runs))
                             if all(r.get("cpu_seconds") for r in runs) else None),
        "equal_tokens": equal_tokens(runs, int(data.info["token_budget"])),
        "orders": table,
        "runs": [_run_row(r) for r in runs],
    }


def _paired(runs: list[dict[str, Any]], order: str, ref: str, strata: list[str],
            ) -> dict[str, Any]:
    def diff(get: Any) -> dict[str, Any]:
        return paired_by_seed(runs, order, ref, get)

    return {
        "eval_loss": diff(lambda r: r["eval_loss"]),
        "strata": {s: diff(lambda r, k=k: r["strata"][k]) for k, s in enumerate(strata)},
        "tokens_to_target": diff(lambda r: r["time_to_loss"]["tokens"]),
    }


def _noise(mine: list[dict[str, Any]]) -> dict[str, Any]:
    """The doctor's noise budget of the step log: each share's mean and interval over seeds."""
    keys = sorted({k for r in mine for k in (r["doctor"]["step"]["noise_shares"] or {})})
    return {k: t_interval([(r["doctor"]["step"]["noise_shares"] or {}).get(k) for r in mine])
            for k in keys}


def _doctor_view(mine: list[dict[str, Any]], view: str) -> dict[str, Any]:
    """What the doctor says of one view of every seed's log: verdicts, band counts, bands."""
    rows = [r["doctor"][view] for r in mine]
    return {
        "verdicts": [x["verdict"] for x in rows],
        "band_counts": [len(x["bands"]) for x in rows],
        # a per-micro-batch log's one-level-per-length-range test: run, and levels found
        "levels_tested": [(x.get("bucket_levels") or {}).get("p_value") is not None
                          for x in rows],
        "levels_found": [bool((x.get("bucket_levels") or {}).get("found")) for x in rows],
        "bands": [x["bands"] for x in rows],
        "loss_roughness": t_interval([x["loss_roughness"] for x in rows]),
    }


def _curve(mine: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Mean and interval of the held-out loss, tokens and seconds at each measurement."""
    out = []
    for i in range(n):
        pts = [r["curve"][i] for r in mine if len(r["curve"]) > i]
        out.append({"tokens": float(np.mean([p["tokens"] for p in pts])),
                    "seconds": float(np.mean([p["seconds"] for p in pts])),
                    "eval_loss": t_interval([p["eval_loss"] for p in pts])})
    return out


def _run_row(r: dict[str, Any]) -> dict[str, Any]:
    """A run as committed: its figures and curve, not its log paths."""
    keep = ("order", "seed", "steps", "real_tokens", "padded_tokens", "padding_efficiency",
            "train_seconds", "wall_seconds", "cpu_seconds", "tokens_per_second", "eval_loss",
            "strata",
            "step_cv_ratio", "time_to_loss", "curve", "doctor")
    return {k: r[k] for k in keep if k in r}
