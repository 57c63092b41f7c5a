"""Periodicity of the detrended loss, and the run-length structure of low and high steps.

The stable-region loss is detrended by a local straight line on its log
(:mod:`lengthwise.doctor.smoothing`; a quarter of the region, 101 to 2,001
points, half of it in short logs; cliff points are left out and read as 0).
Logs of 30 to 511 points go to the fold test (:func:`fold_test`, below).
In longer ones the periodogram ``I_k`` is compared with a local noise floor (the running
median of ``I`` over nearby frequencies, divided by ln 2, which is the median of
an exponential): under noise ``I_k / floor_k`` is exponential with mean 1, so
the largest ratio ``r`` over the ``q`` candidate frequencies has the p-value
``1 - (1 - e^-r)^q``. This holds for coloured noise too, since the floor
follows the spectrum. A sawtooth puts power in harmonics; the fundamental is
the lowest significant frequency of which the strongest peak is a multiple
(up to the 12th harmonic).
The period is refined at the highest autocorrelation within 20 % of ``n/k``,
and it counts only when that autocorrelation clears its noise band ``2/sqrt(n)``.

Runs: the signs of the detrended loss around its median form runs of high and
low steps; the Wald-Wolfowitz runs test says whether they are longer (sorted
or cyclic composition) or shorter than chance.

The fold test (short logs) folds the residual at each period, against AR(1)
surrogates. With a few dozen to a few hundred points a periodogram has too few
frequencies for a local noise floor. Instead the detrended residual is folded at every
whole period ``P`` from 2 to ``n / 4`` points: ``eta^2(P)`` is the share of its
variance explained by the phase ``t mod P``. A real cycle puts most of the
variance into one fold. Chance folds are judged against surrogates that share
the residual's autocorrelation (AR(1) noise with its lag-1 autocorrelation and
variance, detrended the same way): for each period the p-value is the rank of
the observed ``eta^2`` among the surrogates', and the smallest p-value over the
periods is calibrated against the smallest p-values of the surrogates
themselves: each period's ``eta^2`` is standardised by the surrogates' mean and
spread at that period, and the largest standardised value is compared with the
surrogates' own largest ones (max-T), so testing many periods does not inflate
the false-positive rate. A divisor of the best period that stands out nearly
as much is reported instead (the fundamental of a cycle folds at its multiples too).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> t = np.arange(3000)
    >>> x = 0.05 * ((t % 50) / 50 - 0.5) + 0.01 * rng.standard_normal(3000)
    >>> p = find_periodicity(x, interval=1.0)
    >>> p.period, p.p_value < 1e-6
    (50.0, True)
    >>> short = np.tile([0.3, 0.1, -0.1, -0.3], 10) + 0.05 * rng.standard_normal(40)
    >>> f = fold_test(short, window=19, rng=rng)
    >>> f.period, f.p_value < 0.01
    (4, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from lengthwise.doctor.numbers import num, significant
from lengthwise.doctor.smoothing import detrend_window, detrended, local_linear

ALPHA = 0.01
#: fewest points for any period test (a period of 4-7 points seen 4+ times)
MIN_POINTS = 30
#: below this many points the fold test (AR(1) surrogates) runs instead of the periodogram
FOLD_BELOW = 512
MIN_CYCLES = 4
FLOOR_HALF_WIDTH = 25
MAX_HARMONIC = 12
FLOOR_NEIGHBOURS = 2 * FLOOR_HALF_WIDTH
FLOOR_RANK = FLOOR_HALF_WIDTH
#: AR(1) surrogates of the fold test
SURROGATES = 499
#: the lag-1 autocorrelation used for surrogates is capped here (a near-unit root is a trend)
MAX_PHI = 0.95


def _num3(x: float | None) -> int | float | None:
    return num(x, 3)


@dataclass
class Runs:
    """Wald-Wolfowitz runs of above/below-median steps."""

    runs: int
    expected: float
    z: float
    p_value: float
    mean_high: float
    mean_low: float
    max_high: int
    max_low: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "runs": self.runs,
            "expected_runs": round(self.expected, 2),
            "z": round(self.z, 3),
            "p_value": significant(self.p_value),
            "mean_high_run": round(self.mean_high, 3),
            "mean_low_run": round(self.mean_low, 3),
            "max_high_run": self.max_high,
            "max_low_run": self.max_low,
        }


@dataclass(frozen=True)
class Periodicity:
    """Dominant period of the detrended loss (``period`` in steps, None when none)."""

    period: float | None
    p_value: float | None
    period_points: float | None = None
    power_share: float | None = None
    acf_at_period: float | None = None
    best_period: float | None = None
    #: the period (points) of the periodogram bin it was found at, before any refinement
    peak_points: float | None = None
    #: standard error of ``period`` (steps) when it was read at its own, fractional frequency
    period_error: float | None = None
    candidates: list[dict[str, float]] = field(default_factory=list)
    runs: Runs | None = None
    window: int = 0
    points: int = 0
    acf: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    test: str = f"periodogram peak vs local noise floor, alpha={ALPHA}"
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``periodicity`` key of the report)."""
        return {
            "period": _num3(self.period),
            "period_error": significant(self.period_error, 2),
            "p_value": significant(self.p_value),
            "period_points": _num3(self.period_points),
            "power_share": None if self.power_share is None else round(self.power_share, 4),
            "acf_at_period": None if self.acf_at_period is None else round(self.acf_at_period, 4),
            "best_period": _num3(self.best_period),
            "candidates": self.candidates,
            "runs": None if self.runs is None else self.runs.to_dict(),
            "detrend_window": self.window,
            "points": self.points,
            "test": self.test,
            "note": self.note,
        }



def autocorrelation(x: np.ndarray, max_lag: int) -> np.ndarray:
    """Sample autocorrelation at lags 0..max_lag (FFT, zero-padded)."""
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    n = x.size
    size = 1 << int(np.ceil(np.log2(2 * n)))
    f = np.fft.rfft(x, size)
    acov = np.fft.irfft(f * np.conj(f), size)[: max_lag + 1]
    return acov / acov[0] if acov[0] > 0 else np.zeros(max_lag + 1)


def runs_test(x: np.ndarray) -> Runs | None:
    """Runs of values above / below the median (ties dropped)."""
    med = np.median(x)
    sign = x[x != med] > med
    n = sign.size
    n1 = int(sign.sum())
    n2 = n - n1
    if n1 == 0 or n2 == 0:
        return None
    change = np.flatnonzero(sign[1:] != sign[:-1]) + 1
    bounds = np.concatenate([[0], change, [n]])
    lengths = np.diff(bounds)
    high = sign[bounds[:-1]]
    runs = int(lengths.size)
    expected = 1.0 + 2.0 * n1 * n2 / n
    var = 2.0 * n1 * n2 * (2.0 * n1 * n2 - n) / (n * n * (n - 1.0)) if n > 1 else 0.0
    z = (runs - expected) / math.sqrt(var) if var > 0 else 0.0
    return Runs(
        runs=runs,
        expected=expected,
        z=z,
        p_value=math.erfc(abs(z) / math.sqrt(2.0)),
        mean_high=float(lengths[high].mean()) if high.any() else 0.0,
        mean_low=float(lengths[~high].mean()) if (~high).any() else 0.0,
        max_high=int(lengths[high].max()) if high.any() else 0,
        max_low=int(lengths[~high].max()) if (~high).any() else 0,
    )


def _single_tail(ratio: float) -> float:
    """``P(I / floor > ratio)`` for exponential ``I`` and the floor of ``FLOOR_NEIGHBOURS``.

    The floor is the ``FLOOR_RANK``-th smallest of the neighbouring ordinates over
    ln 2; by Renyi's representation of exponential order statistics this tail is
    exactly ``prod_i (m - i + 1) / (m - i + 1 + ratio / ln 2)`` for ``i = 1..rank``.
    """
    t = max(ratio, 0.0) / math.log(2.0)
    m = FLOOR_NEIGHBOURS
    logp = sum(math.log((m - i + 1) / (m - i + 1 + t)) for i in range(1, FLOOR_RANK + 1))
    return math.exp(logp)


def _pvalue(ratio: float, q: int) -> float:
    """Chance that the largest of ``q`` noise ratios reaches ``ratio``."""
    single = _single_tail(ratio)
    if single >= 1.0:
        return 1.0
    return float(-math.expm1(q * math.log1p(-single)))


def find_periodicity(
    resid: np.ndarray,
    *,
    interval: float,
    max_period: float | None = None,
    window: int = 0,
    alpha: float = ALPHA,
) -> Periodicity:
    """Dominant period (in steps, via ``interval``) of an evenly logged detrended series."""
    x = np.asarray(resid, dtype=np.float64)
    n = x.size
    if n < MIN_POINTS:
        return Periodicity(period=None, p_value=None, points=n, window=window,
                           note=f"not tested: {n} points in the stable region (need {MIN_POINTS})")
    x = x - x.mean()
    runs = runs_test(x)
    power = np.abs(np.fft.rfft(x)) ** 2
    max_p = n / MIN_CYCLES if max_period is None else min(max_period, n / MIN_CYCLES)
    k_lo = max(1, int(math.ceil(n / max_p)))
    k_hi = n // 2
    acf = autocorrelation(x, min(n - 1, max(200, int(2.5 * max_p))))
    if k_hi - k_lo < 4:
        return Periodicity(period=None, p_value=None, runs=runs, points=n, window=window, acf=acf,
                           note="stable region too short for a period search")
    floor = _local_floor(power, k_lo, k_hi)
    ks = np.arange(k_lo, k_hi + 1)
    ratio = power[ks] / floor[ks]
    q = ks.size
    best = int(ks[np.argmax(ratio)])
    p_best = _pvalue(float(ratio.max()), q)
    fundamental = _fundamental(best, ks, ratio, q, alpha)
    candidates = _candidates(power, floor, ks, ratio, q, alpha, interval, n)
    bands = _band_peaks(ratio, q, alpha)
    for i, p_i in bands:
        band_period = n / int(ks[i]) * interval
        if not any(abs(c["period"] - band_period) <= 0.01 * band_period for c in candidates):
            candidates.append({"period": round(band_period, 3), "p_value": significant(p_i)})
    period_pts, acf_at = _refine(acf, n / fundamental)
    share = _harmonic_share(power, fundamental, k_lo, k_hi)
    found = p_best < alpha and acf_holds(acf_at, n)
    return Periodicity(
        period=period_pts * interval if found else None,
        p_value=p_best,
        period_points=period_pts if found else None,
        power_share=share if found else None,
        acf_at_period=acf_at if found else None,
        best_period=period_pts * interval,
        peak_points=n / fundamental,
        candidates=candidates,
        runs=runs,
        window=window,
        points=n,
        acf=acf,
    )


#: bins summed by the band test
BAND = 5


def _band_peaks(ratio: np.ndarray, q: int, alpha: float) -> list[tuple[int, float]]:
    """Up to three significant bands of ``BAND`` adjacent ordinates (centre, p), strongest first.

    A cycle whose length wanders a little (a data order read in shards) spreads its
    power over a few neighbouring bins, none of which stands out alone. A band only
    joins the candidates that an unexplained period is re-tested with
    (:mod:`lengthwise.doctor.cycles`, against AR(1) surrogates): alone it does not
    make a period, the floor's own noise making its p-value approximate. Under noise
    each ``I_k / floor_k`` is exponential with mean 1, so a band's sum is
    Gamma(``BAND``, 1); its tail ``e^-r sum_{i<BAND} r^i / i!`` is corrected for all
    ``q`` bands (overlapping, so the correction is conservative).
    """
    if ratio.size < BAND:
        return []
    sums = np.convolve(ratio, np.ones(BAND), mode="valid")
    out: list[tuple[int, float]] = []
    for at in np.argsort(sums)[::-1][:200].tolist():
        r = float(sums[at])
        tail = math.exp(-r) * sum(r**i / math.factorial(i) for i in range(BAND))
        p = 1.0 if tail >= 1.0 else float(-math.expm1(q * math.log1p(-tail)))
        if p >= alpha or len(out) >= 3:
            break
        if all(abs(at + BAND // 2 - c) > BAND for c, _ in out):
            out.append((at + BAND // 2, p))
    return out


#: frequency steps (in periodogram bins) of the fine scan around a peak
FINE_STEP = 0.01


def fine_period(x: np.ndarray, approx_points: float) -> tuple[float, float, float]:
    """A peak's period at its own frequency: ``(period, standard error, peak ratio)`` in points.

    The periodogram of ``x`` (mean removed) is evaluated on a grid of ``FINE_STEP``
    bins within 1.5 bins of ``n / approx_points`` (a periodogram bin) and read
    at its highest point, so a cycle of 46.6 points is not rounded to 46 or 47.
    The standard error is the Cramer-Rao bound of a sinusoid's frequency,
    ``sqrt(6 / ratio) / n`` radians per point, with ``ratio`` the peak over the
    local noise floor (the median of the periodogram within ``FLOOR_HALF_WIDTH``
    bins, leaving the peak's own three out, over ln 2), turned into a period
    error by ``P^2 / (2 pi)``.

    >>> t = np.arange(20000)
    >>> x = np.sin(2 * np.pi * t / 46.6) + np.random.default_rng(0).standard_normal(t.size)
    >>> p, err, _ = fine_period(x, 20000 / 429)  # the periodogram's bin 429 (46.62 points)
    >>> abs(p - 46.6) < 3 * err < 0.05
    True
    """
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    n = x.size
    k0 = n / approx_points
    grid = np.arange(max(0.5, k0 - 1.5), k0 + 1.5 + FINE_STEP / 2, FINE_STEP)
    t = np.arange(n, dtype=np.float64)
    y = x * np.exp(-2j * np.pi * grid[0] * t / n)
    turn = np.exp(-2j * np.pi * FINE_STEP * t / n)
    power = np.empty(grid.size)
    for i in range(grid.size):  # one frequency step at a time: y holds x at grid[i]
        power[i] = abs(y.sum()) ** 2
        y *= turn
    top = int(np.argmax(power))
    k = float(grid[top])
    if 0 < top < grid.size - 1:  # parabola through the top three points
        a, b, c = power[top - 1], power[top], power[top + 1]
        den = a - 2 * b + c
        if den < 0:
            k += 0.5 * FINE_STEP * (a - c) / den
    spectrum = np.abs(np.fft.rfft(x)) ** 2
    centre = int(round(k))
    lo, hi = max(1, centre - FLOOR_HALF_WIDTH), min(spectrum.size, centre + FLOOR_HALF_WIDTH + 1)
    near = np.r_[spectrum[lo : max(lo, centre - 1)], spectrum[min(hi, centre + 2) : hi]]
    floor = float(np.median(near)) / math.log(2.0) if near.size else 0.0
    ratio = float(power.max()) / floor if floor > 0 else float("inf")
    period = n / k
    sigma_omega = math.sqrt(6.0 / max(ratio, 1e-12)) / n
    return float(period), float(period * period * sigma_omega / (2 * math.pi)), ratio


def acf_at(acf: np.ndarray, lag: float) -> float | None:
    """The autocorrelation at a fractional ``lag`` (linear between whole lags; None: beyond)."""
    lo = int(math.floor(lag))
    if lag < 0 or lo + 1 >= acf.size:
        return None
    w = lag - lo
    return float((1 - w) * acf[lo] + w * acf[lo + 1])


def acf_holds(acf_at: float | None, n: int) -> bool:
    """True when the autocorrelation at the period clears its 95 % noise band ``2 / sqrt(n)``."""
    return acf_at is not None and acf_at > 2.0 / math.sqrt(max(n, 1))


def periodicity_of(
    loss: np.ndarray,
    cliff_mask: np.ndarray,
    *,
    interval: float,
    note: str = "",
    rng: np.random.Generator | None = None,
) -> Periodicity:
    """Periodicity of a stable-region loss series (cliff points left out of the trend).

    The loss is detrended by :func:`lengthwise.doctor.smoothing.detrended` (a local
    line on its log); up to ``FOLD_BELOW`` points the fold test with AR(1)
    surrogates runs, above it the periodogram test. Either way a period counts
    only when the autocorrelation at it clears ``2 / sqrt(n)`` too.
    """
    n = int((~cliff_mask).sum())
    if n < MIN_POINTS:
        why = f"not tested: {n} points in the stable region (need {MIN_POINTS})"
        return Periodicity(period=None, p_value=None, points=n, note=why)
    window = detrend_window(n)
    rw = detrended(loss, window, valid=~cliff_mask)
    if n >= FOLD_BELOW:
        res = find_periodicity(rw, interval=interval, max_period=window // 2, window=window)
        if note:
            res = replace(res, note=note)
        return res
    return _fold_periodicity(rw, window, interval, note, rng)


def _fold_periodicity(
    rw: np.ndarray, window: int, interval: float, note: str, rng: np.random.Generator | None
) -> Periodicity:
    rng = np.random.default_rng(0) if rng is None else rng
    n = rw.size
    x = rw - rw.mean()
    acf = autocorrelation(x, max(1, n // 2))
    fold = fold_test(x, window=window, rng=rng, max_period=max(2, window // 2))
    per = float(fold.period or 0)
    acf_at = float(acf[int(per)]) if fold.period and int(per) < acf.size else None
    found = fold.p_value < ALPHA and acf_holds(acf_at, n)
    return Periodicity(
        period=per * interval if found else None,
        p_value=fold.p_value,
        period_points=per if found else None,
        power_share=fold.share if found else None,
        acf_at_period=acf_at if found else None,
        best_period=per * interval,
        runs=runs_test(x),
        window=window,
        points=n,
        acf=acf,
        test=f"fold test vs AR(1) surrogates (max-T), alpha={ALPHA}",
        note=note,
    )


def _fundamental(best: int, ks: np.ndarray, ratio: np.ndarray, q: int, alpha: float) -> int:
    """Lowest significant peak frequency of which ``best`` is a harmonic (else ``best``).

    A sawtooth or any non-sinusoidal cycle puts power at multiples of its
    frequency, and a higher harmonic can stand out more than the fundamental.
    """
    significant = ks[ratio > _threshold(q, alpha)].tolist()
    for k in sorted(significant):
        if k >= best:
            break
        m = round(best / k)
        if 2 <= m <= MAX_HARMONIC and abs(best - m * k) <= max(1.0, 0.01 * best):
            return k
    return best


def _threshold(q: int, alpha: float) -> float:
    """The ratio above which a peak among ``q`` is significant (``_pvalue(r, q) < alpha``).

    The p-value falls as the ratio grows, so one bisection replaces a p-value per frequency.
    """
    lo, hi = 1.0, 2.0
    while _pvalue(hi, q) >= alpha:
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _pvalue(mid, q) < alpha:
            hi = mid
        else:
            lo = mid
    return hi


def _local_floor(power: np.ndarray, k_lo: int, k_hi: int) -> np.ndarray:
    """Noise floor at each frequency: a middle order statistic of its neighbours, over ln 2.

    The neighbours are ``FLOOR_HALF_WIDTH`` ordinates on each side, leaving out the
    frequency itself and the adjacent ones (where a peak leaks).
    """
    half = FLOOR_HALF_WIDTH
    values = power[1:]
    padded = np.pad(values, half + 1, mode="reflect")
    width = 2 * half + 3
    keep = np.r_[0:half, half + 3 : width]
    floor = np.empty(values.size)
    for start in range(0, values.size, 1 << 15):
        part = padded[start : start + (1 << 15) + width - 1]
        view = np.lib.stride_tricks.sliding_window_view(part, width)[:, keep]
        floor[start : start + view.shape[0]] = np.partition(view, FLOOR_RANK - 1, axis=1)[
            :, FLOOR_RANK - 1
        ]
    out = np.concatenate([[np.inf], floor]) / math.log(2.0)
    return np.maximum(out, 1e-300)


def _refine(acf: np.ndarray, approx: float) -> tuple[float, float | None]:
    """Lag of the highest autocorrelation within 20 % of ``approx`` (else ``approx``)."""
    lo = max(2, int(math.floor(0.8 * approx)))
    hi = min(acf.size - 1, int(math.ceil(1.2 * approx)))
    if hi <= lo:
        return float(approx), None
    lag = lo + int(np.argmax(acf[lo : hi + 1]))
    if acf[lag] <= 0:
        return float(approx), float(acf[lag])
    return float(lag), float(acf[lag])


def _harmonic_share(power: np.ndarray, k: int, k_lo: int, k_hi: int) -> float:
    """Share of the detrended variance at ``k`` and its first harmonics (+-1 bin)."""
    total = float(power[1:].sum())
    if total <= 0:
        return 0.0
    picked: set[int] = set()
    for h in range(1, 6):
        for j in (h * k - 1, h * k, h * k + 1):
            if 1 <= j < power.size:
                picked.add(j)
    return float(power[sorted(picked)].sum() / total)


def _candidates(
    power: np.ndarray,
    floor: np.ndarray,
    ks: np.ndarray,
    ratio: np.ndarray,
    q: int,
    alpha: float,
    interval: float,
    n: int,
) -> list[dict[str, float]]:
    """Up to three significant local peaks, strongest first."""
    out: list[dict[str, float]] = []
    order = np.argsort(ratio)[::-1]
    for idx in order[:50]:
        k = int(ks[idx])
        p = _pvalue(float(ratio[idx]), q)
        if p >= alpha or len(out) >= 3:
            break
        if any(abs(k - c["_k"]) <= 1 for c in out):
            continue
        out.append({"_k": k, "period": round(n / k * interval, 3), "p_value": significant(p)})
    return [{"period": c["period"], "p_value": c["p_value"]} for c in out]


@dataclass(frozen=True)
class FoldResult:
    """Best fold period (points), its min-p p-value, its eta^2 above chance."""

    period: int | None
    p_value: float
    share: float
    eta2: dict[int, float]


def _eta2(x: np.ndarray, period: int) -> np.ndarray:
    """eta^2 of the phase ``t mod period`` for each row of ``x`` (2-D)."""
    n = x.shape[1]
    phase = np.arange(n) % period
    order = np.argsort(phase, kind="stable")
    starts = np.searchsorted(phase[order], np.arange(period))
    counts = np.diff(np.append(starts, n)).astype(np.float64)
    xc = x - x.mean(axis=1, keepdims=True)
    sums = np.add.reduceat(xc[:, order], starts, axis=1)
    ssb = (sums * sums / counts).sum(axis=1)
    sst = (xc * xc).sum(axis=1)
    return ssb / np.maximum(sst, 1e-300)


def ar1_surrogates(x: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` AR(1) series with the lag-1 autocorrelation and variance of ``x``."""
    n = x.size
    xc = x - x.mean()
    var = float(xc @ xc) / n
    phi = float(xc[1:] @ xc[:-1]) / max(float(xc @ xc), 1e-300)
    phi = float(np.clip(phi, -MAX_PHI, MAX_PHI))
    e = rng.standard_normal((count, n)) * np.sqrt(var * (1 - phi * phi))
    e[:, 0] = rng.standard_normal(count) * np.sqrt(var)
    return ar1_filter(e, phi)


def ar1_filter(e: np.ndarray, phi: float) -> np.ndarray:
    """``out[:, i] = phi * out[:, i - 1] + e[:, i]`` (``out[:, 0] = e[:, 0]``), a block at a time.

    Within a block of ``B`` points the recursion is a cumulative sum of
    ``e * phi^-j`` scaled by ``phi^j``; ``B`` keeps ``|phi|^-B`` below 1e100.

    >>> ar1_filter(np.ones((1, 4)), 0.5).tolist()
    [[1.0, 1.5, 1.75, 1.875]]
    """
    out = np.array(e, dtype=np.float64)
    n = out.shape[1]
    if abs(phi) < 1e-9 or n < 2:
        return out
    block = int(max(1, min(256, 100 * np.log(10) // -np.log(abs(phi)))))
    carry = out[:, 0].copy()
    j = np.arange(1, block + 1, dtype=np.float64)
    up, down = phi**j, phi**-j
    for a in range(1, n, block):
        b = min(n, a + block)
        m = b - a
        part = np.cumsum(out[:, a:b] * down[:m], axis=1) * up[:m]
        out[:, a:b] = part + carry[:, None] * up[:m]
        carry = out[:, b - 1].copy()
    return out


def fold_test(
    x: np.ndarray,
    *,
    window: int,
    rng: np.random.Generator,
    max_period: int | None = None,
    surrogates: int = SURROGATES,
) -> FoldResult:
    """Fold test of a detrended residual ``x`` (periods 2 .. ``n / MIN_CYCLES`` points)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    top = n // MIN_CYCLES if max_period is None else min(max_period, n // MIN_CYCLES)
    periods = list(range(2, max(top, 2) + 1))
    sur = ar1_surrogates(x, surrogates, rng)
    sur = sur - local_linear(sur, window)
    obs = np.array([_eta2(x[None, :], p)[0] for p in periods])
    null = np.column_stack([_eta2(sur, p) for p in periods])  # (surrogates, periods)
    mu, sd = null.mean(axis=0), np.maximum(null.std(axis=0), 1e-300)
    z_obs = (obs - mu) / sd
    z_null = ((null - mu) / sd).max(axis=1)
    top_z = float(z_obs.max())
    p = float((1 + np.sum(z_null >= top_z)) / (surrogates + 1))
    best = [periods[i] for i in np.flatnonzero(z_obs >= top_z - 1e-12)]
    pick = best[0]
    for d in periods:
        if d >= pick:
            break
        # a divisor of the best period that stands out about as much is the fundamental
        if pick % d == 0 and z_obs[periods.index(d)] >= 0.8 * top_z:
            pick = d
            break
    i = periods.index(pick)
    chance = (pick - 1) / max(n - 1, 1)
    return FoldResult(period=pick, p_value=p, share=float(max(0.0, obs[i] - chance)),
                      eta2={q: float(obs[j]) for j, q in enumerate(periods)})
