"""Centred rolling statistics over a series, with points left out by a mask, and its trend.

Windows count logged points, not steps. Near the ends a window holds only
the points that exist (it shrinks), so every point gets a value.

The trend (:func:`detrended`) is robust to fast decay: a rolling mean of a loss
that falls by orders of magnitude lags the fall and leaves it in the residual,
where it hides a staircase or a cycle. Here the loss is read on a log scale
(when it is positive: a fall by a constant factor is a straight line there) and
the trend at each point is a straight line fitted by least squares to the
``window`` points centred on it (fewer at the ends), with masked points
(cliffs) left out. A straight line follows a slope without lag and the log
scale keeps decay near straight, so the residual holds the cycles and steps,
not the decay.

Example::

    >>> import numpy as np
    >>> rolling_mean(np.array([1.0, 2.0, 3.0, 100.0, 5.0]), 3,
    ...              valid=np.array([True, True, True, False, True])).tolist()
    [1.5, 2.0, 2.5, 4.0, 5.0]
    >>> loss = 5 * np.exp(-np.arange(400.0) / 40)                 # falls 20,000x
    >>> float(np.abs(detrended(loss, 101)).max()) < 1e-9
    True
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


def local_linear(y: np.ndarray, window: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Centred local straight-line fit of ``y`` (last axis) over ``window`` points.

    Points where ``valid`` is false are left out of the fits; windows shrink at
    the ends (so they hold only existing points). Works on 1-D or 2-D arrays.
    """
    y = np.asarray(y, dtype=np.float64)
    n = y.shape[-1]
    v = np.ones(n, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    t = np.arange(n, dtype=np.float64)
    w = v.astype(np.float64)
    z = np.where(v, y, 0.0)

    def csum(a: np.ndarray) -> np.ndarray:
        pad = [(0, 0)] * (a.ndim - 1) + [(1, 0)]
        return np.pad(np.cumsum(a, axis=-1), pad)

    c0, c1, c2 = csum(w), csum(w * t), csum(w * t * t)
    cy, cty = csum(z), csum(z * t)
    half = window // 2
    i = np.arange(n)
    lo = np.clip(i - half, 0, n)
    hi = np.clip(i + half + 1, 0, n)
    k = c0[hi] - c0[lo]
    st, stt = c1[hi] - c1[lo], c2[hi] - c2[lo]
    sy, sty = cy[..., hi] - cy[..., lo], cty[..., hi] - cty[..., lo]
    den = k * stt - st * st
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(den > 1e-9, (k * sty - st * sy) / np.where(den > 1e-9, den, 1.0), 0.0)
        level = (sy - slope * st) / np.maximum(k, 1e-12)
    return level + slope * t


def log_scale(y: np.ndarray) -> tuple[np.ndarray, bool]:
    """``log(y)`` when every value is positive (True), else ``y`` itself (False)."""
    y = np.asarray(y, dtype=np.float64)
    if y.size and np.all(y > 0):
        return np.log(y), True
    return y, False


def detrend_window(points: int) -> int:
    """Window of the detrending line: a quarter of the region (101..2001), half when short.

    >>> detrend_window(40), detrend_window(300), detrend_window(4000)
    (19, 149, 999)
    """
    if points < 404:
        return odd(max(points // 2, 9))
    return odd(min(max(101, points // 4), 2001))


def detrended(y: np.ndarray, window: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Residual of (the log of) ``y`` around its local straight line; masked points read 0."""
    z, _ = log_scale(y)
    r = z - local_linear(z, window, valid)
    if valid is not None:
        r = np.where(valid, r, 0.0)
    return r
