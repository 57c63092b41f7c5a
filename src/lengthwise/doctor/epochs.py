"""Epoch boundaries: does the loss step down when a new epoch starts?

The jump between straight lines fitted on each side of each epoch start is judged against
the same jump at every other point of the run (a placebo test), so decay, autocorrelated
noise and schedule changes do not make boundaries significant. The method is in
docs/doctor.md (Epoch boundaries).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> s = np.arange(1.0, 1201.0)
    >>> loss = 2.0 - 0.3 * np.floor((s - 1) / 400) + 0.02 * rng.standard_normal(1200)
    >>> e = epoch_boundaries(s, loss, [401.0, 801.0], source="epoch field")
    >>> e.found, [round(d, 1) for d in e.drops]
    (True, [-0.3, -0.3])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numeric import JsonForm, digits, each, line_fits, num, significant

ALPHA = 0.01
#: a staircase read from the loss alone is epochs only when at most this many epochs fit the log
MAX_INFERRED_EPOCHS = 100
#: ... and the level steps down (a negative jump) at this share of its boundaries at least
STEP_DOWN_SHARE = 0.75
#: a staircase falls over at most this share of its period's phases ...
STEP_WIDTH = 0.05
#: ... and falls there by at least this share of the cycle's range (a sine falls over half)
STEP_SHARE = 0.5
#: points fitted on each side of a boundary
MIN_SIDE, MAX_SIDE = 3, 50
DRAWS = 2000


@dataclass(frozen=True)
class EpochBoundaries(JsonForm):
    """Level changes of the loss at epoch starts (``found``: a significant step-down)."""

    found: bool | None
    p_value: float | None = None
    source: str | None = None
    starts: list[float] = field(default_factory=list)
    drops: list[float] = field(default_factory=list)
    relative_drops: list[float] = field(default_factory=list)
    side_points: int = 0
    note: str = ""

    TEST = "jump of local lines at epoch starts vs at every other point (placebo test)"
    JSON = {"found": None, "p_value": significant, "source": None, "starts": each(num),
            "drops": each(digits(6)), "relative_drops": each(digits(4)), "side_points": None,
            "test": "TEST", "note": None}


def _side_fits(z: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """For each index i: the lines through z[i-m:i] and z[i:i+m], read at i (NaN where a side
    has fewer than ``m`` points)."""
    n = z.size
    i = np.arange(n)
    before = np.full(n, np.nan)
    after = np.full(n, np.nan)
    ok = (i >= m) & (i + m <= n)
    idx = i[ok]
    before[ok] = line_fits(z, idx - m, idx, idx - 0.5)
    after[ok] = line_fits(z, idx, idx + m, idx - 0.5)
    return before, after


def epoch_boundaries(steps: np.ndarray, loss: np.ndarray, starts: Sequence[float], *,
                     source: str | None, rng: np.random.Generator | None = None) -> EpochBoundaries:
    """Test the loss for a step at each epoch start in ``starts`` (finite ``loss`` only)."""
    rng = np.random.default_rng(0) if rng is None else rng
    if not len(starts):
        why = ("no epoch boundary inside the log" if source else
               "epochs unknown: log an `epoch` field or pass --steps-per-epoch N")
        return EpochBoundaries(found=None, source=source, note=why)
    idx = np.searchsorted(steps, np.asarray(starts, dtype=np.float64), side="left")
    inside = (idx > 0) & (idx < steps.size)
    idx = idx[inside]
    if idx.size == 0:
        return EpochBoundaries(found=None, source=source, note="no epoch boundary inside the log")
    inner = int(np.diff(idx).min()) if idx.size > 1 else steps.size // 2
    m = int(np.clip(inner // 3, MIN_SIDE, MAX_SIDE))
    logscale = bool(np.all(loss > 0))
    z = np.log(loss) if logscale else loss
    before, after = _side_fits(z, m)
    jump = after - before
    valid = np.isfinite(jump)
    at = idx[valid[idx]]
    if at.size == 0:
        return EpochBoundaries(found=None, source=source, side_points=m,
                               note=f"the epoch starts lie within {m} points of the log's ends")
    resid_sd = float(np.std(np.diff(z))) / np.sqrt(2.0) or 1e-12
    far = valid.copy()
    for i in at:
        far[max(0, i - m) : i + m] = False
    placebo = jump[far] / resid_sd
    observed = float(np.mean(jump[at] / resid_sd))
    if placebo.size < 20:
        return EpochBoundaries(found=None, source=source, side_points=m,
                               note=f"too few points away from the epoch starts ({placebo.size})")
    draws = rng.choice(placebo, size=(DRAWS, at.size), replace=True).mean(axis=1)
    p = float((1 + np.sum(draws <= observed)) / (1 + DRAWS))
    level_b = np.exp(before[at]) if logscale else before[at]
    level_a = np.exp(after[at]) if logscale else after[at]
    drops = level_a - level_b
    return EpochBoundaries(found=bool(p < ALPHA and observed < 0), p_value=p, source=source,
                           starts=[float(steps[i]) for i in at], drops=drops.tolist(),
                           relative_drops=(drops / np.abs(level_b)).tolist(), side_points=m)


def staircase_starts(steps: np.ndarray, loss: np.ndarray, period_points: float) -> list[float]:
    """Step starts of a regular staircase of ``period_points`` points, or ``[]`` when none: the
    (log) loss's changes folded by phase fall suddenly at one phase (:data:`STEP_SHARE` of the
    cycle's range within :data:`STEP_WIDTH` of the phases) and do not climb back at the others.

    >>> s = np.arange(1.0, 401.0)
    >>> loss = 2.0 * 0.9 ** np.floor((s - 1) / 40)
    >>> staircase_starts(s, loss, 40)[:3]
    [41.0, 81.0, 121.0]
    >>> staircase_starts(s, 2.0 + np.exp(-s / 300) + 0.3 * np.sin(2 * np.pi * s / 40), 40)
    []
    """
    period = float(period_points)
    p = int(round(period))
    if p < 4 or loss.size < 3 * period:
        return []
    z = np.log(loss) if np.all(loss > 0) else loss
    d = np.diff(z)
    phase = _phase_bins(np.arange(1, z.size), period, p)
    means = np.bincount(phase, weights=d, minlength=p) / np.maximum(
        np.bincount(phase, minlength=p), 1)
    drop = int(np.argmin(means))
    rest = np.delete(means, drop)
    spread = float(np.std(d)) / np.sqrt(max(d.size / p, 1.0))
    if means[drop] >= -2.0 * spread or float(rest.mean()) > 0.0:
        return []
    if _step_share(means, drop) < STEP_SHARE:
        return []
    first = np.arange(0, z.size / period + 1) * period + drop * period / p
    at = np.unique(np.ceil(first - 1e-9).astype(np.int64))
    return [float(steps[i]) for i in at if 0 < i < steps.size]


def _phase_bins(index: np.ndarray, period: float, bins: int) -> np.ndarray:
    """The phase bin (``0 .. bins - 1``) of each point ``index`` in a cycle of ``period``."""
    frac = np.mod(index / period, 1.0)
    return np.minimum((frac * bins + 1e-9).astype(np.int64), bins - 1)


def _step_share(means: np.ndarray, drop: int) -> float:
    """The share of the cycle's range that the phases around ``drop`` fall (1: a sudden step)."""
    p = means.size
    c = means - float(np.median(means))
    w = max(1, int(round(STEP_WIDTH * p)))
    fall = max(-float(sum(c[(drop - o + k) % p] for k in range(w))) for o in range(w))
    cycle = np.concatenate([[0.0], np.cumsum(np.roll(c, -(drop + 1)))])
    span = float(cycle.max() - cycle.min())
    return fall / span if span > 0 else 0.0


def implausible_staircase(found: EpochBoundaries) -> str | None:
    """Why the step-downs of a staircase read from the loss alone are not epochs (None: they
    are): too many epochs, or a level that does not keep stepping down.

    >>> implausible_staircase(EpochBoundaries(found=True, drops=[-0.2, -0.1, -0.1]))
    >>> implausible_staircase(EpochBoundaries(found=True, drops=[-0.2, 0.1, -0.1, 0.2]))
    'the level steps down at only 2 of its 4 boundaries'
    """
    n = len(found.drops)
    down = sum(d < 0 for d in found.drops)
    if n > MAX_INFERRED_EPOCHS:
        return f"{n} epochs in one log (more than {MAX_INFERRED_EPOCHS})"
    if down < STEP_DOWN_SHARE * n:
        return f"the level steps down at only {down} of its {n} boundaries"
    return None
