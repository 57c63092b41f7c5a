"""Calibrate the cost model ``rows * (a*P + b*P**2 + c)`` from measured step times.

:func:`calibrate` times a user's forward and backward, ``step_fn(rows, padded_len)``,
on a grid of micro-batch shapes and fits the coefficients by non-negative least
squares on relative residuals (every shape counts alike, short or long). A
constant per-call ``overhead`` (optimizer, launch) is fitted beside them; it is
the same for every micro-batch, so it is reported but not part of the
:class:`~lengthwise.planning.cost.CostModel`. :func:`fit_cost` fits times you measured
yourself.

Example (a fake clock stands in for a real step)::

    >>> clock = [0.0]
    >>> def step(rows, p):
    ...     clock[0] += rows * (2e-6 * p + 1e-9 * p * p + 5e-5)
    >>> cal = calibrate(step, clock=lambda: clock[0], sync=lambda: None)
    >>> round(cal.a / 2e-6, 6), round(cal.b / 1e-9, 6), round(cal.c / 5e-5, 6)
    (1.0, 1.0, 1.0)
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lengthwise.errors import ConfigError, DataError
from lengthwise.planning.cost import CostModel

__all__ = ["DEFAULT_SHAPES", "Calibration", "calibrate", "fit_cost"]

#: rows in {1, 2, 4} x padded length in {32, 64, 128, 256}: small enough for a CPU
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = tuple(
    itertools.product((1, 2, 4), (32, 64, 128, 256)))


@dataclass(frozen=True)
class Calibration:
    """Fitted ``seconds = rows*(a*P + b*P**2 + c) + overhead`` and the measurements behind it."""

    a: float
    b: float
    c: float
    overhead: float
    rows: np.ndarray  # int64, one entry per measured shape
    padded_len: np.ndarray  # int64
    seconds: np.ndarray  # float64, seconds per call of each shape (min or median of repeats)
    relative_error: float  # median of |predicted - measured| / measured
    max_relative_error: float

    @property
    def cost_model(self) -> CostModel:
        """The per-row coefficients as a :class:`CostModel` (cost in seconds)."""
        if self.a + self.b + self.c <= 0:
            raise DataError("the fit found no per-row cost (a = b = c = 0): the step time does "
                            "not grow with the shape; measure larger shapes")
        return CostModel(a=self.a, b=self.b, c=self.c)

    def token_cost_model(self) -> CostModel:
        """The cost model scaled so that ``a = 1``: cost in token-equivalents.

        Example::

            >>> Calibration(2.0, 0.5, 8.0, 0.0, *[np.zeros(0)] * 3, 0.0, 0.0).token_cost_model()
            CostModel(a=1.0, b=0.25, c=4.0)
        """
        if self.a <= 0:
            raise DataError("a = 0: the step time has no per-token term to scale by")
        return CostModel(a=1.0, b=self.b / self.a, c=self.c / self.a)

    def predict(self, rows: Any, padded_len: Any) -> np.ndarray | float:
        """Predicted seconds of a micro-batch of ``rows`` rows padded to ``padded_len``."""
        r = np.asarray(rows, dtype=np.float64)
        p = np.asarray(padded_len, dtype=np.float64)
        out = r * (self.a * p + self.b * p * p + self.c) + self.overhead
        return float(out) if out.ndim == 0 else out

    def __str__(self) -> str:
        lines = [f"cost = rows * (a*P + b*P^2 + c) + overhead:  a={self.a:.4g}  b={self.b:.4g}  "
                 f"c={self.c:.4g}  overhead={self.overhead:.4g} (seconds)",
                 f"relative error: median {self.relative_error:.2%}, "
                 f"max {self.max_relative_error:.2%}",
                 f"{'rows':>6} {'P':>7} {'measured':>11} {'predicted':>11}"]
        pred = self.predict(self.rows, self.padded_len)
        for r, p, t, q in zip(self.rows, self.padded_len, self.seconds, pred, strict=True):
            lines.append(f"{r:>6} {p:>7} {t:>11.4g} {q:>11.4g}")
        return "\n".join(lines)


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min ||x @ w - y|| subject to w >= 0, exactly, by trying every support (few columns)."""
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    best, best_res = np.zeros(x.shape[1]), float(np.sum(y * y))
    for k in range(1, x.shape[1] + 1):
        for support in itertools.combinations(range(x.shape[1]), k):
            cols = list(support)
            w, *_ = np.linalg.lstsq(xs[:, cols], y, rcond=None)
            if np.any(w < 0):
                continue
            res = float(np.sum((xs[:, cols] @ w - y) ** 2))
            if res < best_res:
                best = np.zeros(x.shape[1])
                best[cols] = w
                best_res = res
    return best / scale


def fit_cost(rows: Iterable[int], padded_len: Iterable[int], seconds: Iterable[float], *,
             fit_overhead: bool = True) -> Calibration:
    """Fit ``seconds = rows*(a*P + b*P**2 + c) [+ overhead]`` with non-negative coefficients.

    The residuals are relative (``(predicted - measured) / measured``), so short
    and long shapes weigh alike. Needs at least three padded lengths and, with
    ``fit_overhead``, two row counts.

    Example::

        >>> r, p = np.array([1, 1, 1, 2]), np.array([10, 20, 40, 10])
        >>> fit = fit_cost(r, p, r * (3 * p + 0.5 * p * p + 7.0))
        >>> round(fit.a, 9), round(fit.b, 9), round(fit.c, 9), round(fit.overhead, 9)
        (3.0, 0.5, 7.0, 0.0)
    """
    r, p, t = (np.asarray(v if isinstance(v, np.ndarray) else list(v), dtype=np.float64)
               for v in (rows, padded_len, seconds))
    if not (r.ndim == p.ndim == t.ndim == 1 and r.size == p.size == t.size):
        raise DataError("rows, padded_len and seconds must be 1-D and of one length")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise DataError("every measured time must be positive and finite")
    if np.any(r < 1) or np.any(p < 1):
        raise ConfigError("rows and padded lengths must be at least 1")
    columns = [r * p, r * p * p, r] + ([np.ones_like(r)] if fit_overhead else [])
    x = np.stack(columns, axis=1)
    if np.linalg.matrix_rank(x / np.linalg.norm(x, axis=0)) < x.shape[1]:
        need = "three padded lengths and two row counts" if fit_overhead else (
            "three padded lengths")
        raise DataError(f"the shapes cannot separate the coefficients: measure at least {need} "
                        f"(got padded lengths {sorted(set(p.astype(int).tolist()))}, row counts "
                        f"{sorted(set(r.astype(int).tolist()))})")
    w = _nnls(x / t[:, None], np.ones_like(t))
    pred = x @ w
    rel = np.abs(pred - t) / t
    return Calibration(a=float(w[0]), b=float(w[1]), c=float(w[2]),
                       overhead=float(w[3]) if fit_overhead else 0.0,
                       rows=r.astype(np.int64), padded_len=p.astype(np.int64), seconds=t,
                       relative_error=float(np.median(rel)),
                       max_relative_error=float(rel.max()))


def _device_sync() -> None:
    """Wait for queued GPU work when torch has a GPU in use (torch is not imported here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        torch.mps.synchronize()


def _check_shapes(shapes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for shape in shapes:
        try:
            rows, p = shape
        except (TypeError, ValueError):
            raise ConfigError(
                f"each shape must be a pair (rows, padded_len), got {shape!r}") from None
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
                   for v in (rows, p)):
            raise ConfigError(f"rows and padded_len must be positive integers, got {shape!r}")
        out.append((int(rows), int(p)))
    if len(set(out)) != len(out):
        raise ConfigError("shapes has duplicates")
    return out


def calibrate(
    step_fn: Callable[[int, int], Any],
    *,
    shapes: Iterable[tuple[int, int]] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    fit_overhead: bool = True,
    reduce: Literal["min", "median"] = "min",
    sync: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Calibration:
    """Time ``step_fn(rows, padded_len)`` on ``shapes`` and fit the cost model.

    ``step_fn`` runs one forward and backward on a ``rows x padded_len`` batch.
    Every shape first runs ``warmup`` times untimed, then each is timed
    ``repeats`` times, shapes interleaved; the fastest time of each shape is fitted
    (``reduce="min"``: other work on the machine only ever adds time), or the
    median (``reduce="median"``). ``sync`` is called
    before reading the clock (default: ``torch.cuda.synchronize`` when CUDA is in
    use). ``shapes`` defaults to :data:`DEFAULT_SHAPES`; for a GPU use real sizes,
    e.g. ``itertools.product((1, 2, 4, 8), (512, 1024, 2048, 4096, 8192))``.

    Example::

        >>> t = [0.0]
        >>> def step(rows, p):
        ...     t[0] += rows * 1e-6 * p + 0.01
        >>> cal = calibrate(step, clock=lambda: t[0], repeats=1, warmup=0)
        >>> round(cal.a, 12), round(cal.overhead, 9), cal.rows.size
        (1e-06, 0.01, 12)
    """
    if not callable(step_fn):
        raise TypeError("step_fn must be callable as step_fn(rows, padded_len)")
    if not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be a positive integer, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be a non-negative integer, got {warmup!r}")
    if reduce not in ("min", "median"):
        raise ConfigError(f"reduce must be 'min' or 'median', got {reduce!r}")
    grid = _check_shapes(DEFAULT_SHAPES if shapes is None else shapes)
    sync = sync or _device_sync
    for rows, p in grid:
        for _ in range(warmup):
            step_fn(rows, p)
    sync()
    times = np.empty((repeats, len(grid)))
    for rep in range(repeats):
        for i, (rows, p) in enumerate(grid):
            sync()
            start = clock()
            step_fn(rows, p)
            sync()
            times[rep, i] = clock() - start
    seconds = times.min(axis=0) if reduce == "min" else np.median(times, axis=0)
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        bad = [grid[i] for i in np.flatnonzero(~(seconds > 0))]
        raise DataError(f"shapes {bad} took no measurable time; use larger shapes or a finer "
                        "clock")
    return fit_cost([g[0] for g in grid], [g[1] for g in grid], seconds,
                    fit_overhead=fit_overhead)
