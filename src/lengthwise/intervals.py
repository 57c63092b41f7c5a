"""Means with 95 % t-intervals (over seeds, or over prompts), and differences paired by seed.

Example::

    >>> iv = t_interval([1.0, 2.0, 3.0])
    >>> iv["mean"], round(iv["half"], 3), iv["n"]
    (2.0, 2.484, 3)
    >>> paired_difference({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.5})["mean"]
    0.75
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["T975", "equal_tokens", "overlap", "paired_by_seed", "paired_difference",
           "t_critical", "t_interval", "versus"]

#: two-sided 95 % critical values of Student's t, by degrees of freedom 1-30
T975: tuple[float, ...] = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


def t_critical(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (``nan`` for df < 1).

    Example::

        >>> t_critical(4), t_critical(1000)
        (2.776, 1.96)
    """
    if df < 1:
        return math.nan
    return T975[df - 1] if df <= len(T975) else 1.96


def t_interval(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, standard deviation and 95 % t-interval (``lo``, ``hi``, ``half``) of ``values``.

    ``None`` and non-finite values are left out; one value gives no interval (``half`` nan).
    """
    x = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return {"mean": None, "sd": None, "half": None, "lo": None, "hi": None, "n": 0}
    mean = float(x.mean())
    sd = float(x.std(ddof=1)) if n > 1 else math.nan
    half = t_critical(n - 1) * sd / math.sqrt(n) if n > 1 else math.nan
    return {"mean": mean, "sd": sd, "half": half, "lo": mean - half, "hi": mean + half, "n": n}


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


def equal_tokens(runs: Sequence[Mapping[str, Any]], budget: int) -> dict[str, Any]:
    """How close the runs' real tokens are to their shared ``budget``.

    Example::

        >>> equal_tokens([{"real_tokens": 99}, {"real_tokens": 100}], 100)["spread"]
        0.01
    """
    tokens = [r["real_tokens"] for r in runs]
    return {"budget": budget, "min": min(tokens), "max": max(tokens),
            "spread": (max(tokens) - min(tokens)) / budget}


def overlap(x: Mapping[str, Any], y: Mapping[str, Any]) -> bool:
    """Whether two intervals (``lo``/``hi``) overlap; a missing interval counts as overlapping.

    Example::

        >>> overlap({"lo": 1.0, "hi": 2.0}, {"lo": 2.5, "hi": 3.0})
        False
    """
    if None in (x.get("lo"), x.get("hi"), y.get("lo"), y.get("hi")):
        return True
    if not all(math.isfinite(v) for v in (x["lo"], x["hi"], y["lo"], y["hi"])):
        return True
    return x["lo"] <= y["hi"] and y["lo"] <= x["hi"]
