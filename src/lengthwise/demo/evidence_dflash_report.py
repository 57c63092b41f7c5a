"""The DFlash experiment's figures from its runs: means and 95 % intervals over seeds, paired
differences.

:func:`run_dflash_experiment` trains every (order, seed) draft of a
:class:`~lengthwise.demo.evidence_dflash.DFlashEvidenceConfig` (in worker processes
when asked) and :func:`summarise_dflash` turns the runs into the committed figures:

* per order: acceptance length at temperature 0 from real decoding, overall and per
  length stratum; teacher-forced accuracy and loss, overall and per stratum; steps,
  padding, throughput; each as mean and 95 % t-interval over seeds; whether every
  decoding was lossless;
* paired differences (by seed) against ``random`` and ``sorted`` of the acceptance
  length and the accuracy, overall and per stratum.

Example::

    >>> runs = [{"order": "random", "seed": s, "acceptance_length": a}
    ...         for s, a in ((0, 2.0), (1, 2.2))]
    >>> round(_iv(runs, "random", lambda r: r["acceptance_length"])["mean"], 2)
    2.1
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lengthwise.demo.evidence_dflash import (
    DFlashEvidence,
    DFlashEvidenceConfig,
    build_dflash_data,
    run_dflash_one,
)
from lengthwise.demo.pool import map_jobs
from lengthwise.intervals import equal_tokens, paired_by_seed, t_interval, versus

__all__ = ["METRICS", "run_dflash_experiment", "summarise_dflash"]

#: the compared figures of a draft: overall key, per-stratum key (higher is better for both)
METRICS: dict[str, tuple[str, str]] = {
    "acceptance_length": ("acceptance_length", "strata_acceptance"),
    "accuracy": ("accuracy", "strata_accuracy"),
}


def _one(args: tuple[str, int, DFlashEvidence, DFlashEvidenceConfig, str]) -> dict[str, Any]:
    order, seed, ev, cfg, out = args
    return run_dflash_one(order, seed, ev, cfg, out=out)


def run_dflash_experiment(cfg: DFlashEvidenceConfig, *, out: str | Path, workers: int = 1,
                          texts: list[str] | None = None, cache_dir: str | Path | None = None,
                          target_cache: str | Path | None = None,
                          skip: set[tuple[str, int]] | None = None,
                          on_run: Any = None) -> tuple[DFlashEvidence, list[dict[str, Any]]]:
    """Every (order, seed) draft of ``cfg`` but those in ``skip``, ``workers`` at a time.

    Each run uses ``cfg.threads`` threads, so its figures do not depend on ``workers``
    (only its wall time does). ``on_run(run)`` is called as each run ends. The corpus is
    cached in ``cache_dir``, the target in ``target_cache``
    (:func:`~lengthwise.demo.evidence_dflash.build_dflash_data`).
    """
    ev = build_dflash_data(cfg, texts=texts, cache_dir=cache_dir, target_cache=target_cache)
    jobs = [(o, s, ev, cfg, str(out)) for s in cfg.seeds for o in cfg.orders
            if (o, s) not in (skip or set())]
    return ev, map_jobs(_one, jobs, workers=workers, on_result=on_run)


def _iv(runs: list[dict[str, Any]], order: str, get: Any) -> dict[str, Any]:
    return t_interval([get(r) for r in runs if r["order"] == order])



def summarise_dflash(cfg: DFlashEvidenceConfig, ev: DFlashEvidence, runs: list[dict[str, Any]],
                     ) -> dict[str, Any]:
    """The experiment's figures (see the module doc), ready to be written as JSON."""
    orders = [o for o in cfg.orders if any(r["order"] == o for r in runs)]
    strata = ev.strata
    table: dict[str, dict[str, Any]] = {}
    for order in orders:
        mine = [r for r in runs if r["order"] == order]

        def iv(get: Any, o: str = order) -> dict[str, Any]:
            return _iv(runs, o, get)

        row: dict[str, Any] = {"seeds": sorted(r["seed"] for r in mine)}
        for name, (overall, per) in METRICS.items():
            row[name] = iv(lambda r, k=overall: r[k])
            row[per] = {s: iv(lambda r, k=k, p=per: r[p][k]) for k, s in enumerate(strata)}
        row.update({
            "eval_loss": iv(lambda r: r["eval_loss"]),
            "real_tokens": iv(lambda r: r["real_tokens"]),
            "steps": iv(lambda r: r["steps"]),
            "padding_efficiency": iv(lambda r: r["padding_efficiency"]),
            "tokens_per_second": iv(lambda r: r["tokens_per_second"]),
            "train_seconds": iv(lambda r: r["train_seconds"]),
            "lossless": all(r["lossless"] for r in mine),
            "mismatches": sum(r["mismatches"] for r in mine),
        })
        table[order] = row
    versus(table, lambda order, ref: _paired(runs, order, ref, strata))
    return {
        "config": cfg.to_dict(),
        "data": ev.info,
        "strata": strata,
        "edges": ev.edges,
        "prompt_strata": [sum(z == k for z in ev.prompt_stratum) for k in range(len(strata))],
        "runs_wall_seconds": float(sum(r.get("wall_seconds") or 0.0 for r in runs)),
        "runs_cpu_seconds": float(sum(r.get("cpu_seconds") or 0.0 for r in runs)),
        "equal_tokens": equal_tokens(runs, int(ev.info["token_budget"])),
        "orders": table,
        "runs": [_run_row(r) for r in runs],
    }


def _paired(runs: list[dict[str, Any]], order: str, ref: str, strata: list[str],
            ) -> dict[str, Any]:
    def diff(get: Any) -> dict[str, Any]:
        return paired_by_seed(runs, order, ref, get)

    out: dict[str, Any] = {}
    for name, (overall, per) in METRICS.items():
        out[name] = diff(lambda r, k=overall: r[k])
        out[per] = {s: diff(lambda r, k=k, p=per: r[p][k]) for k, s in enumerate(strata)}
    return out


def _run_row(r: dict[str, Any]) -> dict[str, Any]:
    """A run as committed: its figures, not its log path."""
    keep = ("order", "seed", "steps", "real_tokens", "padded_tokens", "padding_efficiency",
            "train_seconds", "eval_seconds", "wall_seconds", "cpu_seconds",
            "tokens_per_second", "acceptance_length", "strata_acceptance", "verify_forwards",
            "mismatches", "lossless", "accuracy", "strata_accuracy", "eval_loss",
            "strata_detail", "train_accuracy")
    return {k: r[k] for k in keep if k in r}
