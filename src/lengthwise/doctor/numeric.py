"""Rolling statistics, the trend of a series, and numbers as the report writes them.

Windows count logged points and shrink at the ends. The trend (:func:`detrended`) is a local
straight line on the log of a positive loss, so fast decay leaves no residual.

Example::

    >>> num(3.0), num(2.5), num(None)
    (3, 2.5, None)
    >>> json_ready({"a": float("nan"), "b": [1.0, float("inf")]})
    {'a': None, 'b': [1.0, None]}
    >>> fmt_num(0.123456), fmt_num(2.0, 3), fmt_num(None)
    ('0.1235', '2', '-')
    >>> significant(0.000123456), significant(None)
    (0.0001235, None)
    >>> with_error(46.6162, 0.0731), with_error(50.0, None)
    ('46.62 +/- 0.07', '50')
    >>> counted(1, "evaluation"), counted(3, "evaluation")
    ('1 evaluation', '3 evaluations')
    >>> import numpy as np
    >>> rolling_mean(np.array([1.0, 2.0, 3.0, 100.0, 5.0]), 3,
    ...              valid=np.array([True, True, True, False, True])).tolist()
    [1.5, 2.0, 2.5, 4.0, 5.0]
    >>> loss = 5 * np.exp(-np.arange(400.0) / 40)                 # falls 20,000x
    >>> float(np.abs(detrended(loss, 101)).max()) < 1e-9
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np


def num(x: float | None, digits: int | None = None) -> int | float | None:
    """``x`` as an int when integral, else a float (rounded to ``digits``); None stays None."""
    if x is None:
        return None
    x = float(x)
    if not np.isfinite(x):
        return None
    if digits is not None:
        x = round(x, digits)
    return int(x) if x.is_integer() else x


def significant(x: float | None, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits (how p-values are reported); None stays None."""
    return None if x is None else float(f"{x:.{digits}g}")


def fmt_num(x: float | None, digits: int = 4) -> str:
    """``x`` as text with ``digits`` significant digits (``g`` format); None is ``-``."""
    return "-" if x is None else f"{x:.{digits}g}"


def steps_text(values: list[float], limit: int = 5, *, total: bool = False) -> str:
    """The first ``limit`` of ``values`` and how many more (``total``: how many in all).

    >>> steps_text([1.0, 2.0, 3.0], 2), steps_text([1.0, 2.0, 3.0], 2, total=True)
    ('1, 2 (+1 more)', '1, 2, ... (3 in all)')
    """
    shown = ", ".join(fmt_num(v) for v in values[:limit])
    if len(values) <= limit:
        return shown
    return shown + (f", ... ({len(values)} in all)" if total else
                    f" (+{len(values) - limit} more)")


def with_error(x: float, error: float | None) -> str:
    """``x +/- error`` with ``x`` to the decimal of the error's first digit (``x`` alone when
    there is no error or ``x`` is a whole number)."""
    if error is None or not np.isfinite(error) or error <= 0 or float(x).is_integer():
        return fmt_num(x, 6)
    decimals = max(0, -int(np.floor(np.log10(error))))
    return f"{x:.{decimals}f} +/- {error:.{decimals}f}" if decimals else (
        f"{x:.0f} +/- {max(1, round(error)):.0f}")


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def json_ready(obj: Any) -> Any:
    """Replace NaN/inf floats by None and numpy scalars by Python numbers, recursively."""
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


#: a value :class:`JsonForm` leaves out of its dict
OMIT = object()


def digits(n: int) -> Callable[[float | None], int | float | None]:
    """:func:`num` to ``n`` decimals (an int when integral)."""
    return lambda x: num(x, n)


def fixed(n: int) -> Callable[[float | None], float | None]:
    """Rounded to ``n`` decimals, always a float (None stays None)."""
    return lambda x: None if x is None else round(float(x), n)


def each(write: Callable[[Any], Any], limit: int | None = None) -> Callable[[Any], list[Any]]:
    """``write`` applied to each of the first ``limit`` values of a list."""
    return lambda xs: [write(x) for x in xs[:limit]]


def unless_none(x: Any) -> Any:
    """``x``, or :data:`OMIT` (the key left out) when it is None."""
    return OMIT if x is None else x


def plain(x: Any) -> Any:
    """``x`` with its :class:`JsonForm` s (and lists of them) as dicts."""
    if isinstance(x, JsonForm):
        return x.to_dict()
    return [plain(v) for v in x] if isinstance(x, list) else x


class JsonForm:
    """A result written to JSON by its ``JSON`` table, key by key in order: each key maps to None
    (the attribute of that name), a function of it, another attribute's name, or
    ``(attribute, function)``.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Span(JsonForm):
    ...     start: float
    ...     end: float
    ...     JSON = {"from": ("start", num), "end": digits(1), "length": None}
    ...     length = property(lambda self: self.end - self.start)
    >>> Span(2.0, 3.25).to_dict()
    {'from': 2, 'end': 3.2, 'length': 1.25}
    """

    JSON: ClassVar[dict[str, Any]] = {}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (its keys are those of ``JSON``)."""
        out = {}
        for key, how in self.JSON.items():
            name, write = how if isinstance(how, tuple) else (
                (how, None) if isinstance(how, str) else (key, how))
            value = (write or plain)(getattr(self, name))
            if value is not OMIT:
                out[key] = value
        return out


#: the window of ``loss_roughness`` (docs/metrics.md): a centred rolling mean of 51 points
ROUGHNESS_WINDOW = 51
_MEDIAN_CHUNK = 1 << 16


def odd(n: float) -> int:
    """``n`` rounded down to an odd integer, at least 1."""
    k = max(int(n), 1)
    return k if k % 2 else k - 1


def rolling_mean(y: np.ndarray, window: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Centred mean over ``window`` points where ``valid`` is true (NaN: none in the window)."""
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


def rolling_median(y: np.ndarray, window: int, *, edges: str = "reflect") -> np.ndarray:
    """Centred median over ``window`` points; ``y`` must be finite. ``edges``: the window past
    the ends sees the series mirrored (``reflect``; the window shrinks to the series) or the
    end values repeated (``edge``).

    Example::

        >>> y = np.array([1.0, 9.0, 2.0, 3.0, 4.0])
        >>> rolling_median(y, 3).tolist(), rolling_median(y, 3, edges="edge").tolist()
        ([9.0, 2.0, 3.0, 3.0, 3.0], [1.0, 2.0, 3.0, 3.0, 4.0])
    """
    if edges not in ("reflect", "edge"):
        raise ValueError(f"edges must be reflect or edge, got {edges!r}")
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    if n == 0:
        return y.copy()
    window = odd(window) if edges == "edge" else min(odd(window), odd(n))
    half = window // 2
    if half == 0:
        return y.copy()
    mode = "reflect" if edges == "reflect" and n > half else "edge"
    padded = np.pad(y, half, mode=mode)
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


def step_noise(x: np.ndarray) -> float:
    """The noise of one point of ``x``: :func:`robust_std` of its successive differences over
    the square root of 2 (a slow trend cancels).

        >>> x = 0.01 * np.arange(10_000) + np.random.default_rng(0).normal(0.0, 0.5, 10_000)
        >>> round(step_noise(x), 1)
        0.5
    """
    return robust_std(np.diff(np.asarray(x, dtype=np.float64))) / float(np.sqrt(2.0))


def local_linear(y: np.ndarray, window: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Centred local straight-line fit of ``y`` (last axis) over ``window`` points, leaving out
    points where ``valid`` is false (windows shrink at the ends)."""
    n = np.shape(y)[-1]
    half, i = window // 2, np.arange(n)
    return line_fits(y, np.clip(i - half, 0, n), np.clip(i + half + 1, 0, n),
                     np.arange(n, dtype=np.float64), valid)


def line_fits(y: np.ndarray, lo: np.ndarray, hi: np.ndarray, at: np.ndarray,
              valid: np.ndarray | None = None) -> np.ndarray:
    """The straight lines through ``y[..., lo[j]:hi[j]]`` (points where ``valid``), each read at
    index ``at[j]`` (0 slope where the points do not make a line).

    >>> line_fits(np.array([1.0, 2.0, 3.0, 5.0]), np.array([0]), np.array([3]), np.array([3.0]))
    array([4.])
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
    k = c0[hi] - c0[lo]
    st, stt = c1[hi] - c1[lo], c2[hi] - c2[lo]
    sy, sty = cy[..., hi] - cy[..., lo], cty[..., hi] - cty[..., lo]
    den = k * stt - st * st
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(den > 1e-9, (k * sty - st * sy) / np.where(den > 1e-9, den, 1.0), 0.0)
        level = (sy - slope * st) / np.maximum(k, 1e-12)
    return level + slope * at


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
