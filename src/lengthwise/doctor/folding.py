"""Period test for short logs: fold the residual at each period, against AR(1) surrogates.

With a few dozen to a few hundred points a periodogram has too few frequencies
for a local noise floor. Instead the detrended residual is folded at every
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
    >>> x = np.tile([0.3, 0.1, -0.1, -0.3], 10) + 0.05 * rng.standard_normal(40)
    >>> f = fold_test(x, window=19, rng=rng)
    >>> f.period, f.p_value < 0.01
    (4, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.doctor.smoothing import local_linear

SURROGATES = 499
MIN_CYCLES = 4
#: the lag-1 autocorrelation used for surrogates is capped here (a near-unit root is a trend)
MAX_PHI = 0.95


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
