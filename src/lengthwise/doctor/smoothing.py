"""Centred rolling statistics over a series, with points left out by a mask.

Windows count logged points, not steps. Near the ends a window holds only
the points that exist (it shrinks), so every point gets a value.

Example::

    >>> import numpy as np
    >>> rolling_mean(np.array([1.0, 2.0, 3.0, 100.0, 5.0]), 3,
    ...              valid=np.array([True, True, True, False, True])).tolist()
    [1.5, 2.0, 2.5, 4.0, 5.0]
"""

from __future__ import annotations

import numpy as np

#: the window of ``loss_roughness`` (docs/metrics.md): a centred rolling mean of 51 points
ROUGHNESS_WINDOW = 51
_MEDIAN_CHUNK = 1 << 16


def odd(n: float, lo: int = 1) -> int:
    """``n`` rounded down to an odd integer, at least ``lo``."""
    k = max(int(n), lo)
    return k if k % 2 else k - 1 if k - 1 >= lo else k + 1


def rolling_mean(y: np.ndarray, window: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Centred mean over ``window`` points, using only points where ``valid`` is true.

    A point whose window holds no valid point gets NaN.
    """
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    v = np.isfinite(y) if valid is None else (np.asarray(valid, dtype=bool) & np.isfinite(y))
    z = np.where(v, y, 0.0)
    cs = np.concatenate([[0.0], np.cumsum(z)])
    cc = np.concatenate([[0], np.cumsum(v)])
    half = window // 2
    idx = np.arange(n)
    lo = np.clip(idx - half, 0, n)
    hi = np.clip(idx + half + 1, 0, n)
    count = cc[hi] - cc[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, (cs[hi] - cs[lo]) / np.maximum(count, 1), np.nan)


def rolling_median(y: np.ndarray, window: int) -> np.ndarray:
    """Centred median over ``window`` points (edges reflected); ``y`` must be finite."""
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    if n == 0:
        return y.copy()
    window = min(odd(window), odd(n))
    half = window // 2
    if half == 0:
        return y.copy()
    padded = np.pad(y, half, mode="reflect") if n > half else np.pad(y, half, mode="edge")
    view = np.lib.stride_tricks.sliding_window_view(padded, window)
    out = np.empty(n)
    for start in range(0, n, _MEDIAN_CHUNK):
        out[start : start + _MEDIAN_CHUNK] = np.median(view[start : start + _MEDIAN_CHUNK], axis=1)
    return out


def robust_std(x: np.ndarray) -> float:
    """1.4826 x median absolute deviation: the standard deviation of the Gaussian part."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan")
    return float(1.4826 * np.median(np.abs(x - np.median(x))))
