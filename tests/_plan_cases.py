"""Plans of many shapes and options, reduced to digests: the fixture that pins plans down.

``python tests/_plan_cases.py`` rewrites ``tests/data/plan_digests.json`` from the
current planner; ``tests/planning/test_plan_digests.py`` compares fresh plans with it, so a
change to the planner that moves any sample of any plan fails there.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parent / "data" / "plan_digests.json"
STAT_KEYS = ("padding_efficiency", "efficiency_vs_sorted", "step_length_cv",
             "step_sample_cv", "step_cv_ratio", "rank_imbalance_p50", "rank_imbalance_p99",
             "max_same_bucket_run", "unique_samples", "repeated_in_schedule", "planned")


def _lengths(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 7])
    if kind == "lognormal":
        return np.clip(np.round(np.exp(rng.normal(np.log(1050), 0.5, 30_000))), 16,
                       8192).astype(np.int64)
    if kind == "wide":
        return np.clip(np.round(np.exp(rng.normal(np.log(600), 1.4, 20_000))), 1,
                       8192).astype(np.int64)
    if kind == "bimodal":
        return np.concatenate([
            np.clip(np.round(np.exp(rng.normal(np.log(120), 0.4, 6_000))), 1, 8192),
            np.clip(np.round(np.exp(rng.normal(np.log(2500), 0.4, 6_000))), 1, 8192),
        ]).astype(np.int64)
    if kind == "ties":  # few distinct lengths: exact ties in the edge search
        return rng.choice(np.array([16, 32, 48, 64, 128, 256, 512]), 5_000)
    if kind == "small":
        return rng.integers(1, 3000, 700)
    raise ValueError(kind)


def cases() -> list[tuple[str, str, int, dict]]:
    """(name, lengths kind, lengths seed, plan_epoch keywords)."""
    from lengthwise.planning.cost import CostModel

    out = []
    orders = ("sorted", "random", "bucket-random", "interleave", "stratified")
    for kind in ("lognormal", "wide", "bimodal", "ties", "small"):
        for order in orders:
            out.append((f"{kind}-{order}", kind, 0,
                        dict(max_tokens=16384, world_size=8, grad_accum=4, order=order)))
        out.append((f"{kind}-w64", kind, 1, dict(max_tokens=16384, world_size=64)))
        out.append((f"{kind}-bs8", kind, 2, dict(batch_size=8, world_size=3, grad_accum=2,
                                                 seed=5, epoch=1)))
        out.append((f"{kind}-cost", kind, 3, dict(
            max_cost=3e5, cost=CostModel(a=1.0, b=0.01, c=40.0), world_size=4, grad_accum=2,
            pad_multiple=8)))
        out.append((f"{kind}-k6", kind, 4, dict(max_tokens=8192, buckets=6, world_size=2,
                                                even_out="drop", seed=1)))
        out.append((f"{kind}-repeat", kind, 5, dict(max_tokens=4096, world_size=5,
                                                    even_out="repeat", max_len=2048)))
        out.append((f"{kind}-w1", kind, 6, dict(max_tokens=16384, pad_multiple=64)))
    return out


def digest(plan) -> dict:
    """sha256 of a plan's arrays and edges, and the figures of ``stats`` as text."""
    h = hashlib.sha256()
    for arr in (plan.indices, plan.offsets, plan.bucket):
        h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    h.update(json.dumps([int(e) for e in plan.edges]).encode())
    stats = plan.stats
    return {"plan": h.hexdigest(), "edges": [int(e) for e in plan.edges],
            "stats": {k: repr(stats.get(k)) for k in STAT_KEYS}}


def planned(kind: str, seed: int, kw: dict):
    """The plan of a case: its ``seed`` and ``epoch`` keywords go to ``plan_epoch``, the others
    to its ``PlanConfig``."""
    from lengthwise.planning.config import PlanConfig
    from lengthwise.planning.plan import plan_epoch

    own = {k: v for k, v in kw.items() if k in ("seed", "epoch")}
    config = PlanConfig(**{k: v for k, v in kw.items() if k not in own})
    return plan_epoch(_lengths(kind, seed), config, **own)


def compute() -> dict:
    out = {}
    for name, kind, seed, kw in cases():
        with warnings.catch_warnings():  # max_len cuts some samples on purpose
            warnings.simplefilter("ignore", UserWarning)
            out[name] = digest(planned(kind, seed, kw))
    return out


if __name__ == "__main__":
    rows = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(compute().items())]
    FIXTURE.write_text("{\n" + ",\n".join(rows) + "\n}\n")
    sys.exit(0)
