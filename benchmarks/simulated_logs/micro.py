"""Simulated per-micro-batch logs with known per-bucket loss levels (or none).

Each line is one micro-batch's loss: a decaying curve, plus its bucket's level, plus
noise (independent, or AR(1) with ``ar``, as a slowly wandering loss). The buckets
come in random order (``order="random"``, as bucket-random draws them) or in sorted runs
that sweep the lengths ``sweeps`` times (``order="sorted"``). The levels rise linearly
with the bucket from ``-effect / 2`` to ``+effect / 2``, so ``effect=0`` is a log without
levels. The first row is the ``plan`` event of the training loop's micro log.

Example::

    >>> rows = simulate_micro_log(200, effect=0.3, seed=1)
    >>> rows[0]["view"], len(rows), rows[1]["buckets"]
    ('micro-batch', 201, [25])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lengthwise.errors import ConfigError

from simulated_logs.runs import ar1_noise

ORDERS = ("random", "sorted")


def simulate_micro_log(
    lines: int,
    *,
    buckets: int = 54,
    effect: float = 0.0,
    noise: float = 0.12,
    ar: float = 0.0,
    order: str = "random",
    sweeps: int = 3,
    decay: float = 1.5,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The rows of one simulated per-micro-batch log (see the module docstring)."""
    if order not in ORDERS:
        raise ConfigError(f"unknown order {order!r}; choose one of {', '.join(ORDERS)}")
    if lines < 1 or buckets < 1:
        raise ConfigError(f"lines and buckets must be positive, got {lines}, {buckets}")
    rng = np.random.default_rng(seed)
    if order == "random":
        ids = rng.integers(0, buckets, lines)
    else:
        ids = (np.arange(lines) * sweeps * buckets // lines) % buckets
    level = effect * (ids / max(buckets - 1, 1) - 0.5)
    eps = ar1_noise(lines, noise, ar, rng) if ar else noise * rng.standard_normal(lines)
    t = np.arange(lines, dtype=np.float64)
    loss = 6.0 + decay * np.exp(-t / (lines / 4.0)) + level + eps
    edges = [int(8 * 1.1**k) + k for k in range(buckets)]
    rows: list[dict[str, Any]] = [{"event": "plan", "order": "bucket-random", "view": "micro-batch",
                                   "rank": 0, "world_size": 8, "edges": edges}]
    rows += [{"step": i + 1, "loss": float(loss[i]), "lr": 1e-3, "buckets": [int(ids[i])]}
             for i in range(lines)]
    return rows
