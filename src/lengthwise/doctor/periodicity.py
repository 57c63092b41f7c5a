"""Periods of the detrended loss: periodogram, fold test, predicted cycles, runs test.

Logs of 30 to 511 points are folded at every period against AR(1) surrogates (max-T); longer
ones compare the periodogram with a local noise floor. A cycle the run's mechanisms predict
(:mod:`lengthwise.doctor.context`) is tested at its phase, and a period no mechanism
explains must pass the same surrogate test. The method is in docs/doctor.md (Periodicity).

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
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(10.0, 1210.0, 10.0)
    >>> x = 0.1 * np.cos(2 * np.pi * steps / 12.5) + 0.05 * rng.standard_normal(120)
    >>> t, best = phase_test(x, [cycle_groups(steps, 12.5, [])], window=59, rng=rng)
    >>> t.p_value < 0.01, t.groups
    (True, 5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from lengthwise.doctor.context import RunContext, apparent_period, candidates, match_period
from lengthwise.doctor.numeric import (
    JsonForm,
    detrend_window,
    detrended,
    digits,
    fixed,
    local_linear,
    significant,
)

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


@dataclass
class Runs(JsonForm):
    """Wald-Wolfowitz runs of above/below-median steps."""

    runs: int
    expected: float
    z: float
    p_value: float
    mean_high: float
    mean_low: float
    max_high: int
    max_low: int

    JSON = {"runs": None, "expected_runs": ("expected", fixed(2)), "z": fixed(3),
            "p_value": significant, "mean_high_run": ("mean_high", fixed(3)),
            "mean_low_run": ("mean_low", fixed(3)), "max_high_run": "max_high",
            "max_low_run": "max_low"}


@dataclass(frozen=True)
class Periodicity(JsonForm):
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

    JSON = {"period": digits(3), "period_error": lambda e: significant(e, 2),
            "p_value": significant, "period_points": digits(3), "power_share": fixed(4),
            "acf_at_period": fixed(4), "best_period": digits(3), "candidates": None,
            "runs": None, "detrend_window": "window", "points": None, "test": None,
            "note": None}


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
    return Runs(runs=runs, expected=expected, z=z, p_value=math.erfc(abs(z) / math.sqrt(2.0)),
                mean_high=float(lengths[high].mean()) if high.any() else 0.0,
                mean_low=float(lengths[~high].mean()) if (~high).any() else 0.0,
                max_high=int(lengths[high].max()) if high.any() else 0,
                max_low=int(lengths[~high].max()) if (~high).any() else 0)


def _single_tail(ratio: float) -> float:
    """``P(I / floor > ratio)`` for exponential ``I`` and the floor of ``FLOOR_NEIGHBOURS``
    (exact, by Renyi's representation of exponential order statistics)."""
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


def find_periodicity(resid: np.ndarray, *, interval: float, max_period: float | None = None,
                     window: int = 0) -> Periodicity:
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
    floor = _local_floor(power)
    ks = np.arange(k_lo, k_hi + 1)
    ratio = power[ks] / floor[ks]
    q = ks.size
    best = int(ks[np.argmax(ratio)])
    p_best = _pvalue(float(ratio.max()), q)
    fundamental = _fundamental(best, ks, ratio, q)
    candidates = _candidates(ks, ratio, q, interval, n)
    for i, p_i in _band_peaks(ratio, q):
        band_period = n / int(ks[i]) * interval
        if not any(abs(c["period"] - band_period) <= 0.01 * band_period for c in candidates):
            candidates.append({"period": round(band_period, 3), "p_value": significant(p_i)})
    period_pts, acf_at = _refine(acf, n / fundamental)
    share = _harmonic_share(power, fundamental)
    return _best(period_pts, p_best, share, acf_at, interval=interval, n=n,
                 peak_points=n / fundamental, candidates=candidates, runs=runs, window=window,
                 acf=acf)


def _best(points: float, p: float, share: float, acf_at: float | None, *, interval: float,
          n: int, **rest: Any) -> Periodicity:
    """The strongest period of ``points`` of ``n``: found when ``p < ALPHA`` and the
    autocorrelation at it holds (else only ``best_period``)."""
    found = p < ALPHA and acf_holds(acf_at, n)
    return Periodicity(period=points * interval if found else None, p_value=p,
                       period_points=points if found else None,
                       power_share=share if found else None,
                       acf_at_period=acf_at if found else None, best_period=points * interval,
                       points=n, **rest)


#: bins summed by the band test
BAND = 5


def _band_peaks(ratio: np.ndarray, q: int) -> list[tuple[int, float]]:
    """Up to three significant bands of ``BAND`` adjacent ordinates (centre, p), strongest first:
    a cycle whose length wanders spreads its power over neighbouring bins. A band's sum is
    Gamma(``BAND``, 1) under noise, corrected for ``q`` bands; bands only join the candidates
    an unexplained period is re-tested with."""
    if ratio.size < BAND:
        return []
    sums = np.convolve(ratio, np.ones(BAND), mode="valid")
    out: list[tuple[int, float]] = []
    for at in np.argsort(sums)[::-1][:200].tolist():
        r = float(sums[at])
        tail = math.exp(-r) * sum(r**i / math.factorial(i) for i in range(BAND))
        p = 1.0 if tail >= 1.0 else float(-math.expm1(q * math.log1p(-tail)))
        if p >= ALPHA or len(out) >= 3:
            break
        if all(abs(at + BAND // 2 - c) > BAND for c, _ in out):
            out.append((at + BAND // 2, p))
    return out


#: frequency steps (in periodogram bins) of the fine scan around a peak
FINE_STEP = 0.01


def fine_period(x: np.ndarray, approx_points: float) -> tuple[float, float, float]:
    """A peak's period at its own frequency: ``(period, standard error, peak ratio)`` in points.

    The periodogram is read on a grid of ``FINE_STEP`` bins within 1.5 bins of
    ``n / approx_points``; the error is the Cramer-Rao bound of a sinusoid's frequency for the
    peak's ratio to the local noise floor.

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


def periodicity_of(loss: np.ndarray, cliff_mask: np.ndarray, *, interval: float,
                   note: str = "") -> Periodicity:
    """Periodicity of a stable-region loss series (cliff points left out of the trend): the fold
    test below ``FOLD_BELOW`` points, else the periodogram test."""
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
    return _fold_periodicity(rw, window, interval, note)


def _fold_periodicity(
    rw: np.ndarray, window: int, interval: float, note: str
) -> Periodicity:
    rng = np.random.default_rng(0)
    n = rw.size
    x = rw - rw.mean()
    acf = autocorrelation(x, max(1, n // 2))
    fold = fold_test(x, window=window, rng=rng, max_period=max(2, window // 2))
    per = float(fold.period or 0)
    acf_at = float(acf[int(per)]) if fold.period and int(per) < acf.size else None
    return _best(per, fold.p_value, fold.share, acf_at, interval=interval, n=n,
                 runs=runs_test(x), window=window, acf=acf,
                 test=f"fold test vs AR(1) surrogates (max-T), alpha={ALPHA}", note=note)


def _fundamental(best: int, ks: np.ndarray, ratio: np.ndarray, q: int) -> int:
    """Lowest significant peak frequency of which ``best`` is a harmonic (else ``best``)."""
    significant = ks[ratio > _threshold(q)].tolist()
    for k in sorted(significant):
        if k >= best:
            break
        m = round(best / k)
        if 2 <= m <= MAX_HARMONIC and abs(best - m * k) <= max(1.0, 0.01 * best):
            return k
    return best


def _threshold(q: int) -> float:
    """The ratio above which a peak among ``q`` is significant (``_pvalue(r, q) < ALPHA``)."""
    lo, hi = 1.0, 2.0
    while _pvalue(hi, q) >= ALPHA:
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _pvalue(mid, q) < ALPHA:
            hi = mid
        else:
            lo = mid
    return hi


def _local_floor(power: np.ndarray) -> np.ndarray:
    """Noise floor at each frequency: a middle order statistic of the ``FLOOR_HALF_WIDTH``
    ordinates on each side (not the adjacent ones), over ln 2."""
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


def _harmonic_share(power: np.ndarray, k: int) -> float:
    """Share of the detrended variance at ``k`` and its first harmonics (+-1 bin)."""
    total = float(power[1:].sum())
    if total <= 0:
        return 0.0
    picked = (np.arange(1, 6)[:, None] * k + np.arange(-1, 2)).ravel()
    return float(power[np.unique(picked[(picked >= 1) & (picked < power.size)])].sum() / total)


def _candidates(ks: np.ndarray, ratio: np.ndarray, q: int, interval: float,
                n: int) -> list[dict[str, float]]:
    """Up to three significant local peaks, strongest first."""
    out: list[dict[str, float]] = []
    taken: list[int] = []  # their frequencies
    for idx in np.argsort(ratio)[::-1][:50]:
        k = int(ks[idx])
        p = _pvalue(float(ratio[idx]), q)
        if p >= ALPHA or len(out) >= 3:
            break
        if any(abs(k - t) <= 1 for t in taken):
            continue
        taken.append(k)
        out.append({"period": round(n / k * interval, 3), "p_value": significant(p)})
    return out


@dataclass(frozen=True)
class FoldResult:
    """Best fold period (points), its min-p p-value, its eta^2 above chance."""

    period: int | None
    p_value: float
    share: float
    eta2: dict[int, float]


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


def fold_test(x: np.ndarray, *, window: int, rng: np.random.Generator,
              max_period: int | None = None, surrogates: int = SURROGATES) -> FoldResult:
    """Fold test of a detrended residual ``x`` (periods 2 .. ``n / MIN_CYCLES`` points)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    top = n // MIN_CYCLES if max_period is None else min(max_period, n // MIN_CYCLES)
    periods = list(range(2, max(top, 2) + 1))
    obs, z_obs, p = _max_t(x, [_grouping(np.arange(n) % q, q) for q in periods], window=window,
                           rng=rng, surrogates=surrogates)
    top_z = float(z_obs.max())
    pick = periods[int(np.flatnonzero(z_obs >= top_z - 1e-12)[0])]
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


#: fewest rows per phase group for a grouping to be tested
MIN_PER_GROUP = 4
#: surrogate values held at once (surrogates x rows), to bound memory on long logs
SURROGATE_CELLS = 2_000_000
#: surrogate values per test (surrogates x rows): long logs get fewer surrogates, at least 199
SURROGATE_BUDGET = 5_000_000
#: predicted cycles are tested in logs of fewer rows (longer ones resolve them in the periodogram)
PREDICTED_MAX_ROWS = 2048
#: an unexplained period is re-tested on the last this many rows of the stable region at most,
#: so the surrogate test costs the same on any longer log (a period of up to a thousand rows
#: repeats 100+ times in them)
PHASE_TEST_ROWS = 100_000
#: peaks of at least this many rows are read at their own, fractional frequency
FRACTIONAL_MIN_ROWS = 10


@dataclass(frozen=True)
class PhaseTest:
    """``eta^2`` of a phase grouping, its surrogate p-value and the number of groups."""

    p_value: float
    eta2: float
    share: float
    groups: int


def cycle_groups(
    steps: np.ndarray, length: float, epoch_starts: list[float]
) -> np.ndarray:
    """Phase group of each row for a cycle of ``length`` steps that restarts at ``epoch_starts``
    (``q`` groups when ``interval / length`` is ``p / q``, ``q <= 200``).

    >>> cycle_groups(np.arange(10.0, 110.0, 10.0), 12.5, []).tolist()
    [3, 2, 1, 0, 4, 3, 2, 1, 0, 4]
    """
    steps = np.asarray(steps, dtype=np.float64)
    starts = np.sort(np.asarray(epoch_starts, dtype=np.float64))
    origin = np.ones(steps.size)  # steps count from 1: the first epoch starts at step 1
    if starts.size:
        at = np.searchsorted(starts, steps, side="right") - 1
        origin = np.where(at >= 0, starts[np.clip(at, 0, None)], 1.0)
    interval = float(np.median(np.diff(steps))) if steps.size > 1 else 1.0
    ratio = Fraction(interval / length).limit_denominator(200)
    exact = abs(float(ratio) - interval / length) < 1e-9
    groups = ratio.denominator if exact else max(2, round(length / interval))
    phase = np.mod(steps - origin, length) / length
    return np.mod(np.floor(phase * groups + 1e-6), groups).astype(np.int64)


def _grouping(groups: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The row order, group starts and group sizes of a grouping (labels ``0..count-1``)."""
    order = np.argsort(groups, kind="stable")
    starts = np.searchsorted(groups[order], np.arange(count))
    sizes = np.bincount(groups, minlength=count).astype(np.float64)
    return order, starts, sizes


def _group_eta2(x: np.ndarray, order: np.ndarray, starts: np.ndarray,
                sizes: np.ndarray) -> np.ndarray:
    """eta^2 of a grouping (from :func:`_grouping`) for each row of ``x`` (2-D)."""
    xc = x - x.mean(axis=1, keepdims=True)
    sums = np.add.reduceat(xc[:, order], starts, axis=1)
    ssb = (sums * sums / sizes).sum(axis=1)
    return ssb / np.maximum((xc * xc).sum(axis=1), 1e-300)


def _max_t(x: np.ndarray, groupings: list[tuple[np.ndarray, np.ndarray, np.ndarray]], *,
           window: int, rng: np.random.Generator, surrogates: int,
           ) -> tuple[np.ndarray, np.ndarray, float]:
    """eta^2 of each grouping (from :func:`_grouping`) of ``x``, standardised by its spread over
    AR(1) surrogates (drawn ``SURROGATE_CELLS`` values at a time), and the max-T p-value of
    the largest."""
    obs = np.array([_group_eta2(x[None, :], *g)[0] for g in groupings])
    chunk = max(1, min(surrogates, SURROGATE_CELLS // x.size))
    null = np.empty((surrogates, len(groupings)))
    for done in range(0, surrogates, chunk):
        size = min(chunk, surrogates - done)
        sur = ar1_surrogates(x, size, rng)
        sur = sur - local_linear(sur, window)
        for j, g in enumerate(groupings):
            null[done : done + size, j] = _group_eta2(sur, *g)
    mu, sd = null.mean(axis=0), np.maximum(null.std(axis=0), 1e-300)
    z_obs = (obs - mu) / sd
    z_null = ((null - mu) / sd).max(axis=1)
    return obs, z_obs, float((1 + np.sum(z_null >= z_obs.max())) / (surrogates + 1))


def phase_test(x: np.ndarray, groupings: list[np.ndarray], *, window: int, rng: np.random.Generator,
               surrogates: int = SURROGATES) -> tuple[PhaseTest, int]:
    """Max-T AR(1) surrogate test of the phase grouping that best explains ``x``: the test and
    the grouping's index (p-value 1 and index 0 when none has 2+ phases of ``MIN_PER_GROUP``)."""
    x = np.asarray(x, dtype=np.float64)
    inverses = [np.unique(np.asarray(g, dtype=np.int64), return_inverse=True)[1] for g in groupings]
    labelled = [(inv, int(inv.max()) + 1 if inv.size else 0) for inv in inverses]
    usable = [i for i, (_, c) in enumerate(labelled) if c >= 2 and x.size >= MIN_PER_GROUP * c]
    if not usable:
        return PhaseTest(p_value=1.0, eta2=0.0, share=0.0,
                         groups=labelled[0][1] if labelled else 0), 0
    obs, z_obs, p = _max_t(x, [_grouping(*labelled[i]) for i in usable], window=window, rng=rng,
                           surrogates=surrogates)
    top = int(np.argmax(z_obs))
    count = labelled[usable[top]][1]
    chance = (count - 1) / max(x.size - 1, 1)
    return PhaseTest(p_value=p, eta2=float(obs[top]), share=max(0.0, float(obs[top]) - chance),
                     groups=count), usable[top]


def distinct_groupings(groupings: list[np.ndarray]) -> list[int]:
    """Indices of the groupings that split the rows differently (a relabelling is the same)."""
    seen: list[np.ndarray] = []
    keep = []
    for i, g in enumerate(groupings):
        _, first, inverse = np.unique(g, return_index=True, return_inverse=True)
        canon = np.argsort(np.argsort(first))[inverse]  # labels in order of first appearance
        if not any(np.array_equal(canon, s) for s in seen):
            seen.append(canon)
            keep.append(i)
    return keep


def checked_periodicity(per: Periodicity, steps: np.ndarray, loss: np.ndarray,
                        cliff_mask: np.ndarray, ctx: RunContext,
                        rng: np.random.Generator) -> Periodicity:
    """``per`` with an unexplained periodogram period re-tested, else a predicted cycle tested
    (``steps``/``loss``/``cliff_mask``: the stable region's rows)."""
    n = int((~cliff_mask).sum())
    if n < MIN_POINTS:
        return per
    window = detrend_window(n)
    rw = detrended(loss, window, valid=~cliff_mask)
    rw = np.where(cliff_mask, 0.0, rw - rw[~cliff_mask].mean())
    if per.period is None:
        return _predicted(per, steps, rw, ctx, window, rng)
    if match_period(per.period, ctx).mechanism or not per.test.startswith("periodogram"):
        return per
    return _retest(per, steps, rw, window, rng)


def _retest(per: Periodicity, steps: np.ndarray, rw: np.ndarray, window: int,
            rng: np.random.Generator) -> Periodicity:
    """An unexplained periodogram period re-tested: the whole lag found and the significant
    peaks (not harmonics), each read at its own frequency (:func:`fine_period`), on the same
    AR(1) surrogates (max-T). The best that passes is the period, with its standard error (or
    half the difference of its halves' periods); within 3 errors of a whole lag it is that."""
    interval = float(np.median(np.diff(steps))) if steps.size > 1 else 1.0
    tail = slice(max(0, rw.size - PHASE_TEST_ROWS), rw.size)
    x, s = rw[tail], steps[tail]
    approx = [per.peak_points or 0.0, *(c["period"] / interval for c in per.candidates)]
    tries: list[tuple[float, float]] = [(float(per.period_points or 0.0), 0.0)]
    for a in approx:
        if a >= FRACTIONAL_MIN_ROWS and not any(abs(a - b) <= 0.01 * a for b, _ in tries[1:]):
            tries.append(fine_period(x, a)[:2])
    tries = [t for t in tries if not any(_harmonic(t[0], u[0]) for u in tries)]
    t, j = phase_test(x, [cycle_groups(s, p * interval, []) for p, _ in tries], window=window,
                      rng=rng, surrogates=_surrogates(x.size))
    points, error = tries[j]
    if error > 0:  # read at its own frequency
        error = max(error, _split_error(x, points))
        if abs(points - round(points)) <= 3 * error:
            points = float(round(points))
    acf = acf_at(autocorrelation(x, int(points) + 2), points)
    if t.p_value < ALPHA and acf_holds(acf, x.size):
        if error == 0:
            return replace(per, note=_join(per.note, f"the period passes the AR(1) surrogate "
                                                    f"test too (p={t.p_value:.3g})"))
        return replace(per, period=points * interval, period_points=points,
                       period_error=error * interval, power_share=t.share, acf_at_period=acf,
                       note=_join(per.note, f"read at its own frequency, {t.groups} phases; it "
                                            f"passes the AR(1) surrogate test too "
                                            f"(p={t.p_value:.3g})"))
    return replace(per, period=None, period_points=None, power_share=None, acf_at_period=None,
                   note=_join(per.note, f"the periodogram peak at {per.period:g} steps "
                                        f"(p={per.p_value:.3g}) fails the AR(1) surrogate "
                                        f"test at its length (p={t.p_value:.3g}): "
                                        "drift or persistent noise, not a cycle"))


def _predicted(per: Periodicity, steps: np.ndarray, rw: np.ndarray, ctx: RunContext, window: int,
               rng: np.random.Generator) -> Periodicity:
    if rw.size >= PREDICTED_MAX_ROWS:
        return per
    tries = []
    for name, length, how in candidates(ctx):
        seen = apparent_period(length, ctx.interval)
        if name == "megabatch" and seen is not None and seen <= rw.size * ctx.interval / 4:
            tries.append((length, seen, how))
    if not tries:
        return per
    groupings = [cycle_groups(steps, length, ctx.epoch_starts) for length, _, _ in tries]
    keep = distinct_groupings(groupings)
    best, j = phase_test(rw, [groupings[i] for i in keep], window=window, rng=rng,
                         surrogates=_surrogates(rw.size))
    i = keep[j]
    p = best.p_value
    if p >= ALPHA:
        return replace(per, note=_join(per.note, f"predicted cycle ({tries[i][0]:g} steps) "
                                                 f"not found (p={p:.3g})"))
    length, seen, how = tries[i]
    points = seen / ctx.interval
    lag = int(round(points))
    reset = "reset at each epoch start" if ctx.epoch_starts else "one phase through the log"
    return replace(
        per, period=seen, p_value=p, period_points=points, power_share=best.share,
        acf_at_period=float(per.acf[lag]) if 0 < lag < per.acf.size else None, best_period=seen,
        test=(f"predicted cycle of {length:g} steps ({best.groups} phases, {reset}) vs AR(1) "
              f"surrogates, max-T over {len(keep)} grouping(s), alpha={ALPHA}"),
        note=_join(per.note, f"tested because {how}"),
    )


def _harmonic(short: float, long: float) -> bool:
    """True when ``short`` is a harmonic of ``long`` (``long / short`` within 0.5 % of 2..50)."""
    m = round(long / short)
    return 2 <= m <= 50 and abs(long / short - m) <= 0.005 * m


def _split_error(x: np.ndarray, points: float) -> float:
    """Half the difference of the period read in each half of ``x`` (0 when too short)."""
    half = x.size // 2
    if half < 8 * points:
        return 0.0
    first, _, _ = fine_period(x[:half], half / round(half / points))
    second, _, _ = fine_period(x[half:], half / round(half / points))
    return abs(first - second) / 2


def _surrogates(rows: int) -> int:
    """Surrogates for a log of ``rows``: ``SURROGATES``, fewer (not under 199) on very long logs."""
    return int(max(199, min(SURROGATES, SURROGATE_BUDGET // max(rows, 1))))


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
