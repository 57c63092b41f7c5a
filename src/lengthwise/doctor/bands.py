"""Bands: is the per-step loss multimodal, and if so where are the modes?

Silverman's critical-bandwidth test with a smoothed bootstrap on the detrended loss (thinned
when autocorrelated); bands must be separated by a clear valley, and a Gaussian mixture
gives their centres, widths and shares. The method is in docs/doctor.md (Bands).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> x = rng.permutation(np.concatenate([rng.normal(m, 0.02, 600) for m in (-0.2, 0, 0.2)]))
    >>> b = find_bands(x, rng=np.random.default_rng(0))
    >>> b.count, [round(c, 2) + 0.0 for c in b.offsets]
    (3, [-0.2, 0.0, 0.2])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numeric import (
    ROUGHNESS_WINDOW,
    JsonForm,
    each,
    fixed,
    local_linear,
    log_scale,
    odd,
    significant,
)

ALPHA = 0.05
BOOTSTRAP = 199
GRID = 2048
MAX_BANDS = 6
MIN_POINTS = 30
#: a band holds at least this many points (fewer are outliers)
MIN_BAND_POINTS = 5
MAX_POINTS = 20_000
TRIM = 0.005
MODE_FLOOR = 0.02
#: a band needs a valley below this fraction of the lower neighbouring peak
VALLEY = 0.8
#: the effect-size check smooths with this fraction of the fitted bands' median width
REF_WIDTH = 0.5


@dataclass
class Bands(JsonForm):
    """Multimodality of the detrended stable-region loss."""

    count: int | None
    p_value: float | None
    p_values: list[float] = field(default_factory=list)
    offsets: list[float] = field(default_factory=list)
    centres: list[float] = field(default_factory=list)
    widths: list[float] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)
    separation: float | None = None
    between_share: float | None = None
    bic_components: int | None = None
    points: int = 0
    note: str = ""

    TEST = f"Silverman critical bandwidth, smoothed bootstrap B={BOOTSTRAP}, alpha={ALPHA}"
    JSON = {"count": None, "multimodal": None, "p_value": significant,
            "p_values_at_most_k": ("p_values", each(significant)), "centres": each(fixed(6)),
            "offsets": each(fixed(6)), "widths": each(fixed(6)), "shares": each(fixed(4)),
            "separation": fixed(3), "between_share": fixed(4), "bic_components": None,
            "points": None, "test": "TEST", "note": None}

    @property
    def multimodal(self) -> bool | None:
        """More than one band (None: not tested)."""
        return None if self.count is None else self.count > 1


class _Kde:
    """Gaussian kernel density estimates on a fixed grid, by FFT."""

    def __init__(self, lo: float, hi: float) -> None:
        span = max(hi - lo, 1e-12)
        self.g0 = lo - 0.5 * span
        self.dx = 2.0 * span / (GRID - 1)
        freq = np.fft.rfftfreq(GRID, d=self.dx)
        self._w2 = (2.0 * np.pi * freq) ** 2

    def binned(self, x: np.ndarray) -> np.ndarray:
        pos = np.clip((x - self.g0) / self.dx, 0.0, GRID - 1.000001)
        i = pos.astype(np.int64)
        frac = pos - i
        counts = np.bincount(i, weights=1.0 - frac, minlength=GRID)
        counts += np.bincount(i + 1, weights=frac, minlength=GRID + 1)[:GRID]
        return np.fft.rfft(counts)

    def density(self, spectrum: np.ndarray, h: float) -> np.ndarray:
        return np.fft.irfft(spectrum * np.exp(-0.5 * self._w2 * h * h), GRID)

    def modes(self, spectrum: np.ndarray, h: float) -> np.ndarray:
        f = self.density(spectrum, h)
        d = np.diff(f)
        peak = (d[:-1] > 0) & (d[1:] <= 0) & (f[1:-1] > MODE_FLOOR * f.max())
        return np.flatnonzero(peak) + 1

    def count(self, spectrum: np.ndarray, h: float) -> int:
        return int(self.modes(spectrum, h).size)


def critical_bandwidth(kde: _Kde, spectrum: np.ndarray, k: int, span: float) -> float:
    """Smallest bandwidth (to 1 %) whose estimate has at most ``k`` modes."""
    lo, hi = kde.dx, max(span, kde.dx * 2)
    if kde.count(spectrum, lo) <= k:
        return lo
    while kde.count(spectrum, hi) > k:
        hi *= 2.0
    while hi / lo > 1.01:
        mid = float(np.sqrt(lo * hi))
        if kde.count(spectrum, mid) <= k:
            hi = mid
        else:
            lo = mid
    return hi


def silverman_p(
    x: np.ndarray, kde: _Kde, h: float, k: int, rng: np.random.Generator
) -> float:
    """Smoothed-bootstrap p-value of "at most ``k`` modes" at critical bandwidth ``h``."""
    n = x.size
    mean, var = float(x.mean()), float(x.var())
    scale = 1.0 / np.sqrt(1.0 + h * h / max(var, 1e-300))
    exceed = 0
    for _ in range(BOOTSTRAP):
        draw = x[rng.integers(0, n, n)]
        y = mean + (draw - mean + h * rng.standard_normal(n)) * scale
        if kde.count(kde.binned(y), h) > k:
            exceed += 1
    return (1 + exceed) / (1 + BOOTSTRAP)


def fit_mixture(
    x: np.ndarray,
    means: np.ndarray,
    sd: float,
    *,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """EM for a 1-D Gaussian mixture started at ``means`` (``weights``: per-point counts, for
    binned data); returns weights, means, sds, loglik."""
    k = means.size
    c = np.ones(x.size) if weights is None else np.asarray(weights, dtype=np.float64)
    total = float(c.sum())
    w = np.full(k, 1.0 / k)
    mu = means.astype(np.float64).copy()
    s = np.full(k, max(sd, 1e-12))
    floor = max(float(np.sqrt(np.average((x - np.average(x, weights=c)) ** 2, weights=c))) * 1e-3,
                1e-12)
    ll_old = -np.inf
    for _ in range(200):
        z = (x[:, None] - mu[None, :]) / s[None, :]
        logp = -0.5 * z * z - np.log(s)[None, :] + np.log(w)[None, :] - 0.5 * np.log(2 * np.pi)
        top = logp.max(axis=1, keepdims=True)
        dens = np.exp(logp - top)
        tot = dens.sum(axis=1, keepdims=True)
        resp = dens / tot * c[:, None]
        ll = float(((np.log(tot[:, 0]) + top[:, 0]) * c).sum())
        nk = resp.sum(axis=0) + 1e-12
        w = nk / total
        mu = (resp * x[:, None]).sum(axis=0) / nk
        s = np.sqrt(np.maximum((resp * (x[:, None] - mu[None, :]) ** 2).sum(axis=0) / nk, floor**2))
        if ll - ll_old < 1e-9 * abs(ll):
            break
        ll_old = ll
    order = np.argsort(mu)
    return w[order], mu[order], s[order], ll


def bic_components(x: np.ndarray) -> int:
    """Number of mixture components (1..5) with the lowest BIC (EM on 256 bins)."""
    counts, edges = np.histogram(x, bins=256)
    centres = 0.5 * (edges[1:] + edges[:-1])
    keep = counts > 0
    centres, counts = centres[keep], counts[keep].astype(np.float64)
    best_k, best = 1, np.inf
    sd = float(np.std(x))
    for k in range(1, 6):
        starts = np.quantile(x, (np.arange(k) + 0.5) / k)
        _, _, _, ll = fit_mixture(centres, starts, sd / k, weights=counts)
        bic = -2.0 * ll + (3 * k - 1) * np.log(x.size)
        if bic < best:
            best_k, best = k, bic
    return best_k


def merge_peaks(f: np.ndarray, valley: float = 0.8, floor: float = 0.0) -> list[int]:
    """Local maxima of density ``f`` (above ``floor`` x its maximum), shallow neighbours merged.

    >>> x = np.linspace(-1, 1, 201)
    >>> len(merge_peaks(np.exp(-((x - 0.5) / 0.1) ** 2) + np.exp(-((x + 0.5) / 0.1) ** 2)))
    2
    """
    d = np.diff(f)
    top = float(f.max())
    peaks = [int(i) for i in np.flatnonzero((d[:-1] > 0) & (d[1:] <= 0)) + 1
             if f[i + 1] > floor * top and f[i + 1] > 0]
    while len(peaks) > 1:
        ratios = [float(f[a : b + 1].min()) / min(f[a], f[b])
                  for a, b in zip(peaks[:-1], peaks[1:], strict=True)]
        i = int(np.argmax(ratios))
        if ratios[i] <= valley:
            break
        a, b = peaks[i], peaks[i + 1]
        peaks.remove(a if f[a] < f[b] else b)
    return peaks


def band_residual(loss: np.ndarray, cliff_mask: np.ndarray, points: int) -> np.ndarray:
    """The loss minus its trend, a local line on its log over 51 points (fewer in short
    regions), in loss units.

    >>> t = np.arange(300.0)
    >>> float(np.abs(band_residual(3 * np.exp(-t / 30), np.zeros(300, bool), 300)).max()) < 1e-9
    True
    """
    z, logscale = log_scale(loss)
    window = min(ROUGHNESS_WINDOW, odd(max(points // 2, 9)))
    trend = local_linear(z, window, valid=~cliff_mask)
    return loss - np.exp(trend) if logscale else loss - trend


def interleaved(x: np.ndarray, centres: np.ndarray, shares: np.ndarray) -> bool:
    """Whether the points' nearest modes switch at least a quarter of the
    ``(n - 1)(1 - sum w^2)`` times bands do (a level shift switches a few times).

    >>> interleaved(np.tile([0.0, 1.0], 50), np.array([0.0, 1.0]), np.array([0.5, 0.5]))
    True
    >>> interleaved(np.repeat([0.0, 1.0], 50), np.array([0.0, 1.0]), np.array([0.5, 0.5]))
    False
    """
    labels = np.argmin(np.abs(x[:, None] - centres[None, :]), axis=1)
    switches = int(np.count_nonzero(np.diff(labels)))
    expected = (x.size - 1) * (1.0 - float(np.sum(shares**2)))
    return switches >= 0.25 * expected


def decorrelating_stride(x: np.ndarray) -> int:
    """Every how many points the detrended loss is about independent, ``(1 + r) / (1 - r)``
    for a lag-1 autocorrelation ``r`` of 0.1 or more (the bootstrap's points are thinned to it).

    >>> decorrelating_stride(np.tile([1.0, -1.0], 50))
    1
    """
    xc = x - x.mean()
    den = float(xc @ xc)
    r = float(xc[1:] @ xc[:-1]) / den if den > 0 else 0.0
    if r < 0.1:
        return 1
    return int(round((1 + min(r, 0.95)) / (1 - min(r, 0.95))))


def find_bands(resid: np.ndarray, *, level: float = 0.0,
               rng: np.random.Generator | None = None) -> Bands:
    """Count the modes of detrended losses ``resid``; ``level`` turns offsets into centres."""
    rng = np.random.default_rng(0) if rng is None else rng
    sample = _test_sample(resid, rng)
    if isinstance(sample, Bands):
        return sample
    x, ordered, lo_q, hi_q = sample
    span = float(hi_q - lo_q)
    if span <= 0:
        return Bands(count=1, p_value=1.0, points=int(x.size), offsets=[float(x.mean())],
                     centres=[level + float(x.mean())], widths=[0.0], shares=[1.0],
                     note="the detrended loss is constant")
    kde = _Kde(lo_q, hi_q)
    spectrum = kde.binned(x)
    count, h_count, p_values = _silverman_count(x, kde, spectrum, span, rng)
    count, starts, note = _valley_check(x, kde, spectrum, count, h_count, p_values)
    count, (w, mu, sd), note = _fit_bands(x, ordered, count, starts, h_count, note)
    sep = None
    if count > 1:
        pooled = np.sqrt((sd[1:] ** 2 + sd[:-1] ** 2) / 2.0)
        sep = float(np.min(np.diff(mu) / pooled))
    between = float((w * (mu - (w * mu).sum()) ** 2).sum() / max(float(x.var()), 1e-300))
    return Bands(count=count, p_value=p_values[count - 2] if count > 1 else p_values[0],
                 p_values=p_values, offsets=mu.tolist(), centres=(level + mu).tolist(),
                 widths=sd.tolist(), shares=w.tolist(), separation=sep,
                 between_share=min(1.0, between) if count > 1 else 0.0,
                 bic_components=bic_components(x), points=int(x.size), note=note)


def _fit_bands(x: np.ndarray, ordered: np.ndarray, count: int, starts: np.ndarray, h_count: float,
               note: str) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray], str]:
    """Fit the mixture, dropping outlier modes and level shifts: count, (w, mu, sd), note."""
    if starts.size != count:
        starts = np.quantile(x, (np.arange(count) + 0.5) / count)
    w, mu, sd, _ = fit_mixture(x, starts, h_count)
    big = w * x.size >= MIN_BAND_POINTS
    if count > 1 and not big.all():
        note = (f"{int((~big).sum())} mode(s) of fewer than {MIN_BAND_POINTS} points left out: "
                "outliers, not bands")
        count = max(1, int(big.sum()))
        w, mu, sd, _ = fit_mixture(x, mu[big] if big.any() else np.array([float(np.median(x))]),
                                   h_count)
    if count > 1 and not interleaved(ordered, mu, w):
        note = (f"{count} modes, but each holds one stretch of the run rather than steps spread "
                "over it: a level shift, not bands")
        count = 1
        w, mu, sd, _ = fit_mixture(x, np.array([float(np.median(x))]), float(np.std(x)))
    return count, (w, mu, sd), note


def _test_sample(
    resid: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, float, float] | Bands:
    """The points tested, thinned and trimmed, with the thinned run order and trim bounds (an
    untested :class:`Bands` when too few independent points are left)."""
    x = np.asarray(resid, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size < MIN_POINTS:
        return Bands(count=None, p_value=None, points=int(x.size),
                     note=f"not tested: {x.size} points in the stable region (need {MIN_POINTS})")
    stride = decorrelating_stride(x)
    if stride > 1:
        x = x[rng.integers(0, stride) :: stride]
        if x.size < MIN_POINTS:
            return Bands(count=None, p_value=None, points=int(x.size),
                         note=f"not tested: {x.size} effectively independent points in the "
                         f"stable region (autocorrelated; need {MIN_POINTS})")
    ordered = x
    if x.size > MAX_POINTS:
        x = rng.choice(x, MAX_POINTS, replace=False)
    lo_q, hi_q = np.quantile(x, [TRIM, 1.0 - TRIM])
    x = x[(x >= lo_q) & (x <= hi_q)]
    return x, ordered, float(lo_q), float(hi_q)


def _silverman_count(x: np.ndarray, kde: _Kde, spectrum: np.ndarray, span: float,
                     rng: np.random.Generator) -> tuple[int, float, list[float]]:
    """The first mode count not rejected, its critical bandwidth, and the p-values tested."""
    p_values: list[float] = []
    count, h_count = MAX_BANDS, None
    for k in range(1, MAX_BANDS + 1):
        h = critical_bandwidth(kde, spectrum, k, span)
        p = silverman_p(x, kde, h, k, rng)
        p_values.append(p)
        if p >= ALPHA:
            count, h_count = k, h
            break
    if h_count is None:
        h_count = critical_bandwidth(kde, spectrum, count, span)
    return count, h_count, p_values


def _valley_check(x: np.ndarray, kde: _Kde, spectrum: np.ndarray, count: int, h_count: float,
                  p_values: list[float]) -> tuple[int, np.ndarray, str]:
    """Merge modes without a clear valley between them: the count, the modes and a note."""
    note = ""
    starts = kde.g0 + kde.dx * kde.modes(spectrum, h_count)
    if count > 1:
        if starts.size != count:
            starts = np.quantile(x, (np.arange(count) + 0.5) / count)
        _, _, sd0, _ = fit_mixture(x, starts, h_count)
        h_ref = REF_WIDTH * float(np.median(sd0))
        f = kde.density(spectrum, max(h_ref, kde.dx))
        peaks = merge_peaks(f, VALLEY, MODE_FLOOR)
        if len(peaks) < count:
            note = (f"the test rejects {count - 1} mode(s) (p={p_values[count - 2]:.3g}), but at "
                    f"half the bands' width only {len(peaks)} mode(s) have a valley "
                    f"{1 - VALLEY:.0%} deep: a flat-topped or skewed, not a banded, distribution")
            count = max(1, len(peaks))
            starts = kde.g0 + kde.dx * np.asarray(peaks, dtype=np.float64)
    return count, starts, note
