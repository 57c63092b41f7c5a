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
(:func:`lengthwise.doctor.periodicity.ar1_surrogates`; 499 of them, fewer but at
least 199 on logs of 10,000+ rows); when several groupings are tried (one per
world size), the largest standardised ``eta^2`` is ranked among the
surrogates' own largest (max-T). Predicted cycles are tested in logs of up to
2,047 rows: a longer log holds enough cycles for the periodogram to resolve
them, and the surrogates would cost more than every other analysis together.

A period the blind search found but no mechanism explains must pass the same
surrogate test at its length (one phase through the log, on the last
``PHASE_TEST_ROWS`` rows of the stable region at most, so its cost does not grow
with the log), so slow drift or long-memory noise that the periodogram reads as
a peak is not reported as a periodic component of unknown cause.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(10.0, 1210.0, 10.0)
    >>> x = 0.1 * np.cos(2 * np.pi * steps / 12.5) + 0.05 * rng.standard_normal(120)
    >>> t, best = phase_test(x, [cycle_groups(steps, 12.5, [])], window=59, rng=rng)
    >>> t.p_value < 0.01, t.groups
    (True, 5)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from lengthwise.doctor.context import RunContext
from lengthwise.doctor.mechanisms import apparent_period, candidates, match_period
from lengthwise.doctor.periodicity import (
    ALPHA,
    MIN_POINTS,
    SURROGATES,
    Periodicity,
    acf_at,
    acf_holds,
    ar1_surrogates,
    autocorrelation,
    fine_period,
)
from lengthwise.doctor.smoothing import detrend_window, detrended, local_linear

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


def _grouping(groups: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The row order, group starts and group sizes of a grouping (labels ``0..count-1``)."""
    order = np.argsort(groups, kind="stable")
    starts = np.searchsorted(groups[order], np.arange(count))
    sizes = np.bincount(groups, minlength=count).astype(np.float64)
    return order, starts, sizes


def _eta2(x: np.ndarray, order: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """eta^2 of a grouping (from :func:`_grouping`) for each row of ``x`` (2-D)."""
    xc = x - x.mean(axis=1, keepdims=True)
    sums = np.add.reduceat(xc[:, order], starts, axis=1)
    ssb = (sums * sums / sizes).sum(axis=1)
    return ssb / np.maximum((xc * xc).sum(axis=1), 1e-300)


def phase_test(
    x: np.ndarray,
    groupings: list[np.ndarray],
    *,
    window: int,
    rng: np.random.Generator,
    surrogates: int = SURROGATES,
) -> tuple[PhaseTest, int]:
    """Surrogate test of how much of the detrended residual ``x`` the best phase grouping explains.

    All ``groupings`` are scored on the same AR(1) surrogates; each one's
    ``eta^2`` is standardised by the surrogates' mean and spread for it, and
    the largest standardised value is ranked among the surrogates' own largest
    (max-T), so trying several groupings does not inflate the false-positive
    rate. Returns the test of the best grouping and its index (p-value 1 and
    index 0 when no grouping has 2+ phases of ``MIN_PER_GROUP`` rows).
    """
    x = np.asarray(x, dtype=np.float64)
    labelled = []
    for g in groupings:
        _, inv = np.unique(np.asarray(g, dtype=np.int64), return_inverse=True)
        count = int(inv.max()) + 1 if inv.size else 0
        labelled.append((inv, count))
    usable = [i for i, (_, c) in enumerate(labelled) if c >= 2 and x.size >= MIN_PER_GROUP * c]
    if not usable:
        return PhaseTest(p_value=1.0, eta2=0.0, share=0.0,
                         groups=labelled[0][1] if labelled else 0), 0
    prepared = {i: _grouping(*labelled[i]) for i in usable}
    obs = np.array([_eta2(x[None, :], *prepared[i])[0] for i in usable])
    chunk = max(1, min(surrogates, SURROGATE_CELLS // x.size))
    null = np.empty((surrogates, len(usable)))
    for done in range(0, surrogates, chunk):
        size = min(chunk, surrogates - done)
        sur = ar1_surrogates(x, size, rng)
        sur = sur - local_linear(sur, window)
        for j, i in enumerate(usable):
            null[done : done + size, j] = _eta2(sur, *prepared[i])
    mu, sd = null.mean(axis=0), np.maximum(null.std(axis=0), 1e-300)
    z_obs = (obs - mu) / sd
    top = int(np.argmax(z_obs))
    z_null = ((null - mu) / sd).max(axis=1)
    p = float((1 + np.sum(z_null >= z_obs[top])) / (surrogates + 1))
    count = labelled[usable[top]][1]
    chance = (count - 1) / max(x.size - 1, 1)
    return PhaseTest(p_value=p, eta2=float(obs[top]), share=max(0.0, float(obs[top]) - chance),
                     groups=count), usable[top]


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
        return _retest(per, steps, rw, window, rng, alpha)
    return _predicted(per, steps, rw, ctx, window, rng, alpha)


def _retest(
    per: Periodicity, steps: np.ndarray, rw: np.ndarray, window: int,
    rng: np.random.Generator, alpha: float,
) -> Periodicity:
    """An unexplained periodogram period re-tested at its own, fractional frequency.

    The period as found (a whole lag) is tried together with the peak it came
    from and the other significant peaks of ``FRACTIONAL_MIN_ROWS`` rows or more
    (less those that are harmonics of another: a cycle's shape puts power there
    too), each read at their own frequency
    (:func:`~lengthwise.doctor.periodicity.fine_period`: a cycle of 46.6 rows is
    not folded at 46 or 47, which smears it over a long log); all are scored on
    the same AR(1) surrogates (max-T, on the last ``PHASE_TEST_ROWS`` rows at
    most). The best, when it passes and its
    autocorrelation at its (fractional) lag clears ``2/sqrt(n)``, is the period;
    one read at its own frequency comes with its standard error (the Cramer-Rao
    bound, or half the difference of the periods read in each half of the rows
    when larger: a cycle whose length
    wanders is less precise than a sinusoid), and within 3 standard errors of a
    whole number of rows it is that whole number.
    """
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
    if t.p_value < alpha and acf_holds(acf, x.size):
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


def _predicted(
    per: Periodicity, steps: np.ndarray, rw: np.ndarray, ctx: RunContext, window: int,
    rng: np.random.Generator, alpha: float,
) -> Periodicity:
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
              f"surrogates, max-T over {len(keep)} grouping(s), alpha={alpha}"),
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
