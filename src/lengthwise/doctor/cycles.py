"""Cycles the run's mechanisms predict, tested at their phase, and unexplained periods re-tested.

A blind period search has to pay for every period it tries; a cycle whose
length the run's own numbers predict (the length-grouped mega-batch of
:mod:`lengthwise.doctor.mechanisms`) can be tested where it must be. Each
logged row gets the phase the predicted cycle has at its step,
``((step - epoch start) mod L) / L``, with the phase reset at each known epoch
start (samplers restart their cycle there; without known epochs one phase runs
through the log). A cycle of ``L`` steps logged every ``k`` steps shows only
the phases ``j * k / L mod 1``: every aliasing of the cycle by the logging
interval is a grouping of the rows by those phases. The share of the detrended
residual's variance the grouping explains (``eta^2``) is compared with the same
share in AR(1) surrogates of the residual, detrended the same way
(:func:`lengthwise.doctor.folding.ar1_surrogates`); the p-value is the rank
among them, times the number of distinct groupings tried (Bonferroni).

A period the blind search found but no mechanism explains must pass the same
surrogate test at its length (one phase through the log), so slow drift or
long-memory noise that the periodogram reads as a peak is not reported as a
periodic component of unknown cause.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(10.0, 1210.0, 10.0)
    >>> x = 0.1 * np.cos(2 * np.pi * steps / 12.5) + 0.05 * rng.standard_normal(120)
    >>> t = phase_test(x, cycle_groups(steps, 12.5, []), window=59, rng=rng)
    >>> t.p_value < 0.01, t.groups
    (True, 5)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from lengthwise.doctor.context import RunContext
from lengthwise.doctor.detrend import detrend_window, detrended, local_linear
from lengthwise.doctor.folding import SURROGATES, ar1_surrogates
from lengthwise.doctor.mechanisms import apparent_period, candidates, match_period
from lengthwise.doctor.periodicity import ALPHA, MIN_POINTS, Periodicity

#: fewest rows per phase group for a grouping to be tested
MIN_PER_GROUP = 4
#: surrogates of the predicted-cycle test (its p-value is multiplied by the groupings tried)
PREDICTED_SURROGATES = 999


@dataclass(frozen=True)
class PhaseTest:
    """``eta^2`` of a phase grouping, its surrogate p-value and the number of groups."""

    p_value: float
    eta2: float
    share: float
    groups: int


def cycle_groups(
    steps: np.ndarray, length: float, epoch_starts: list[float], *, max_groups: int = 200,
) -> np.ndarray:
    """Phase group of each row for a cycle of ``length`` steps that restarts at ``epoch_starts``.

    The phases a row can have are multiples of ``1 / q`` when ``interval / length``
    is ``p / q`` in lowest terms (``q <= max_groups``); otherwise the phase is cut
    into ``round(length / interval)`` equal parts.

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
    ratio = Fraction(interval / length).limit_denominator(max_groups)
    exact = abs(float(ratio) - interval / length) < 1e-9
    groups = ratio.denominator if exact else max(2, round(length / interval))
    phase = np.mod(steps - origin, length) / length
    return np.mod(np.floor(phase * groups + 1e-6), groups).astype(np.int64)


def _eta2(x: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """eta^2 of the grouping for each row of ``x`` (2-D)."""
    xc = x - x.mean(axis=1, keepdims=True)
    sums = np.zeros((x.shape[0], count))
    for g in range(count):
        sel = groups == g
        if sel.any():
            sums[:, g] = xc[:, sel].sum(axis=1)
    sizes = np.maximum(np.bincount(groups, minlength=count), 1).astype(np.float64)
    ssb = (sums * sums / sizes).sum(axis=1)
    return ssb / np.maximum((xc * xc).sum(axis=1), 1e-300)


def phase_test(
    x: np.ndarray,
    groups: np.ndarray,
    *,
    window: int,
    rng: np.random.Generator,
    surrogates: int = SURROGATES,
) -> PhaseTest:
    """Surrogate test of how much of the detrended residual ``x`` the phase ``groups`` explain."""
    x = np.asarray(x, dtype=np.float64)
    groups = np.asarray(groups, dtype=np.int64)
    _, groups = np.unique(groups, return_inverse=True)
    count = int(groups.max()) + 1 if groups.size else 0
    if count < 2 or x.size < MIN_PER_GROUP * count:
        return PhaseTest(p_value=1.0, eta2=0.0, share=0.0, groups=count)
    obs = float(_eta2(x[None, :], groups, count)[0])
    sur = ar1_surrogates(x, surrogates, rng)
    sur = sur - local_linear(sur, window)
    null = _eta2(sur, groups, count)
    p = float((1 + np.sum(null >= obs)) / (surrogates + 1))
    chance = (count - 1) / max(x.size - 1, 1)
    return PhaseTest(p_value=p, eta2=obs, share=max(0.0, obs - chance), groups=count)


def distinct_groupings(groupings: list[np.ndarray]) -> list[int]:
    """Indices of the groupings that split the rows differently (a relabelling is the same)."""
    seen: list[np.ndarray] = []
    keep = []
    for i, g in enumerate(groupings):
        _, canon = np.unique(g, return_index=False, return_inverse=True)
        # canonical labels: in order of first appearance
        first = {}
        for v in canon.tolist():
            first.setdefault(v, len(first))
        canon = np.array([first[v] for v in canon.tolist()])
        if not any(np.array_equal(canon, s) for s in seen):
            seen.append(canon)
            keep.append(i)
    return keep


def checked_periodicity(
    per: Periodicity,
    steps: np.ndarray,
    loss: np.ndarray,
    cliff_mask: np.ndarray,
    ctx: RunContext,
    rng: np.random.Generator,
    alpha: float = ALPHA,
) -> Periodicity:
    """``per`` with an unexplained periodogram period re-tested, else a predicted cycle tested.

    ``steps``/``loss``/``cliff_mask`` are the stable region's rows.
    """
    n = int((~cliff_mask).sum())
    if n < MIN_POINTS:
        return per
    window = detrend_window(n)
    rw = detrended(loss, window, valid=~cliff_mask)
    rw = np.where(cliff_mask, 0.0, rw - rw[~cliff_mask].mean())
    if per.period is not None:
        if match_period(per.period, ctx).mechanism is not None or not per.test.startswith(
            "periodogram"
        ):
            return per
        t = phase_test(rw, cycle_groups(steps, per.period, []), window=window, rng=rng)
        if t.p_value < alpha:
            return replace(per, note=_join(per.note, f"the period passes the AR(1) surrogate "
                                                    f"test too (p={t.p_value:.3g})"))
        per = replace(per, period=None, period_points=None, power_share=None,
                      acf_at_period=None,
                      note=_join(per.note, f"the periodogram peak at {per.period:g} steps "
                                           f"(p={per.p_value:.3g}) fails the AR(1) surrogate "
                                           f"test at its length (p={t.p_value:.3g}): "
                                           "drift or persistent noise, not a cycle"))
    return _predicted(per, steps, rw, ctx, window, rng, alpha)


def _predicted(
    per: Periodicity, steps: np.ndarray, rw: np.ndarray, ctx: RunContext, window: int,
    rng: np.random.Generator, alpha: float,
) -> Periodicity:
    tries = []
    for name, length, how in candidates(ctx):
        seen = apparent_period(length, ctx.interval)
        if name == "megabatch" and seen is not None and seen <= rw.size * ctx.interval / 4:
            tries.append((length, seen, how))
    if not tries:
        return per
    groupings = [cycle_groups(steps, length, ctx.epoch_starts) for length, _, _ in tries]
    keep = distinct_groupings(groupings)
    tests = [(phase_test(rw, groupings[i], window=window, rng=rng,
                         surrogates=PREDICTED_SURROGATES), i) for i in keep]
    best, i = min(tests, key=lambda ti: (ti[0].p_value, -ti[0].eta2))  # ties: the best fit
    p = min(1.0, best.p_value * len(keep))
    if p >= alpha:
        return replace(per, note=_join(per.note, f"predicted cycle ({tries[i][0]:g} steps) "
                                                 f"not found (p={p:.3g})"))
    length, seen, how = tries[i]
    points = seen / ctx.interval
    lag = int(round(points))
    reset = "reset at each epoch start" if ctx.epoch_starts else "one phase through the log"
    return replace(
        per, period=seen, p_value=p, period_points=points, power_share=best.share,
        acf_at_period=float(per.acf[lag]) if 0 < lag < per.acf.size else None,
        best_period=seen,
        test=(f"predicted cycle of {length:g} steps ({best.groups} phases, {reset}) vs AR(1) "
              f"surrogates, x{len(keep)} groupings, alpha={alpha}"),
        note=_join(per.note, f"tested because {how}"),
    )


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
