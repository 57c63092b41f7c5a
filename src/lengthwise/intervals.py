"""Means with 95 % t-intervals (over prompts, or over seeds).

Example::

    >>> iv = t_interval([1.0, 2.0, 3.0])
    >>> iv["mean"], round(iv["half"], 3), iv["n"]
    (2.0, 2.484, 3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["T975", "t_critical", "t_interval"]

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
