"""Cliffs, losses far above the running level, and whether they line up with checkpoints.

The alignment test is exact: under the null the cliffs sit at random analysed points, so the
number near a checkpoint is hypergeometric. The methods are in docs/doctor.md (Cliffs,
Checkpoint association).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> loss = 2 + 0.01 * rng.standard_normal(500)
    >>> loss[300:305] += [0.5, 0.3, 0.15, 0.05, 0.01]
    >>> found, mask, _ = find_cliffs(np.arange(500.0), loss, np.ones(500, bool))
    >>> [(c.step, c.recovery_steps) for c in found]
    [(300.0, 5.0)]
    >>> steps = np.arange(1, 1001.0)
    >>> a = associate(steps, [101.0, 301.0, 501.0], np.arange(100.0, 1001, 100), interval=1)
    >>> a.associated, a.aligned, a.p_value < 1e-3
    (True, 3, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.doctor.numeric import (
    ROUGHNESS_WINDOW,
    JsonForm,
    fixed,
    num,
    odd,
    robust_std,
    rolling_median,
    significant,
    unless_none,
)

#: a cliff rises this many noise scales above the running level
CLIFF_Z = 8.0
#: a stretch of fewer points than this has its threshold floored at SHORT_FLOOR_Z scales
SHORT, SHORT_FLOOR_Z = 200, 6.0
#: exceedances this many points apart or closer belong to one cliff
MERGE_GAP = 2
#: the upper fence: q95 + FENCE x (q95 - q75)
FENCE = 4.0
#: recovered below the level plus the smaller of the upper decile and this many noise scales
RECOVERY_Z = 2.0
#: fewest points per block of local thresholds
MIN_BLOCK = 500
#: a cliff needs this many logged points before it (the first losses of a run are no cliffs)
MIN_BEFORE = 10
#: at most this many points after a cliff start are left out of the stable region
MAX_EXCLUDED = 500


@dataclass(frozen=True)
class CliffContext:
    """What a cliff is labelled with: nearby saves, its bucket, the phase of the run
    (``phase_bounds``: the warm-up end and the stable-region start)."""

    checkpoints: np.ndarray = field(default_factory=lambda: np.zeros(0))
    window: tuple[float, float] = (0.0, 0.0)
    buckets: list[Any] | None = None
    phase_bounds: tuple[float | None, float | None] = (None, None)

    def phase(self, step: float) -> str:
        """``"warm-up"``, ``"early"`` or ``"stable"`` for a cliff starting at ``step``."""
        warm, stable = self.phase_bounds
        if warm is not None and step < warm:
            return "warm-up"
        if stable is not None and step < stable:
            return "early"
        return "stable"


@dataclass(frozen=True)
class Cliff(JsonForm):
    """One spike: where it started, how high it rose, how many steps it took to recover."""

    step: float
    peak_step: float
    height: float
    recovery_steps: float | None
    level: float
    recovery_points: int | None
    z: float
    bucket: object = None
    at_checkpoint: bool | None = None
    phase: str = "stable"

    JSON = {"step": num, "height": fixed(6), "recovery_steps": num, "peak_step": num,
            "recovery_points": None, "level": fixed(6), "z": fixed(2), "phase": None,
            "at_checkpoint": unless_none, "bucket": unless_none}


def cliff_threshold(
    resid: np.ndarray, noise: float, floor: float = 0.0
) -> float:
    """Height above the running level that makes a cliff: the upper fence
    ``q95 + FENCE x (q95 - q75)`` of the residuals, capped at ``CLIFF_Z`` and floored at
    ``floor`` noise scales (docs/doctor.md, Cliffs)."""
    q75, q95 = np.quantile(resid, [0.75, 0.95])
    fence = float(q95 + FENCE * (q95 - q75))
    return float(max(min(CLIFF_Z * noise, fence), floor * noise))


def local_thresholds(
    resid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-point cliff thresholds and recovery levels (each block's upper decile), from
    blocks of a twentieth of the points (at least ``MIN_BLOCK``), interpolated."""
    n = resid.size
    block = max(MIN_BLOCK, n // 20)
    bounds = list(range(0, n, block)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < block // 2:
        bounds.pop(-2)
    centres, values, upper = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        r = resid[a:b]
        if np.count_nonzero(r) >= 10:
            r = r[r != 0]
        sigma = _noise_scale(r)
        centres.append(0.5 * (a + b - 1))
        values.append(cliff_threshold(r, sigma, floor=SHORT_FLOOR_Z if r.size < SHORT else 0))
        upper.append(min(float(np.quantile(r, 0.9)), RECOVERY_Z * sigma))
    x = np.arange(n)
    return np.interp(x, centres, values), np.interp(x, centres, upper)


def find_cliffs(steps: np.ndarray, loss: np.ndarray, region: np.ndarray, *,
                search: np.ndarray | None = None,
                context: CliffContext | None = None) -> tuple[list[Cliff], np.ndarray, float]:
    """The cliffs starting in ``search`` (default: ``region``), the mask of the points they
    cover (start to recovery) and the noise scale of ``region``; ``context`` labels them."""
    ctx = CliffContext() if context is None else context
    search = region if search is None else search
    n = loss.size
    mask = np.zeros(n, dtype=bool)
    if n < 10 or region.sum() < 10:
        return [], mask, float("nan")
    window = min(ROUGHNESS_WINDOW, odd(max(11, n // 6)))
    level = _baseline(loss, window)
    resid = loss - level
    threshold, recover = local_thresholds(resid)
    noise = _noise_scale(resid[region])
    hits = np.flatnonzero(search & (resid > threshold))
    cliffs: list[Cliff] = []
    if hits.size == 0:
        return cliffs, mask, noise
    groups = np.split(hits, np.flatnonzero(np.diff(hits) > MERGE_GAP + 1) + 1)
    for group in groups:
        a, b = int(group[0]), int(group[-1])
        if mask[a] or a < MIN_BEFORE:
            continue
        base = _level_before(loss, level, mask, a, window)
        peak = a + int(np.argmax(loss[a : b + 1]))
        height = float(loss[peak] - base)
        if height <= threshold[a]:
            continue
        j, recovery = _recovery(steps, loss, peak, base, recover[a])
        mask[a : min(j, a + MAX_EXCLUDED)] = True
        cliffs.append(
            Cliff(at_checkpoint=_near(float(steps[a]), ctx), bucket=_bucket(ctx.buckets, a),
                  phase=ctx.phase(float(steps[a])), step=float(steps[a]),
                  peak_step=float(steps[peak]), height=height, recovery_steps=recovery, level=base,
                  recovery_points=None if recovery is None else int(j - peak), z=height / noise)
        )
    return cliffs, mask, noise


def _baseline(loss: np.ndarray, window: int) -> np.ndarray:
    """The loss level a spike rises from: the lower of the centred and trailing medians."""
    n = loss.size
    centred = rolling_median(loss, window)
    shift = window // 2 + 1
    trailing = np.concatenate([centred[:shift], centred[:-shift]]) if n > shift else centred
    return np.minimum(centred, trailing)


def _noise_scale(resid: np.ndarray) -> float:
    """The robust standard deviation of the residuals (their plain one if that is zero)."""
    noise = robust_std(resid)
    if not np.isfinite(noise) or noise <= 0:
        noise = float(np.std(resid)) or 1e-12
    return noise


def _level_before(
    loss: np.ndarray, level: np.ndarray, mask: np.ndarray, a: int, window: int
) -> float:
    """The median loss of the window before point ``a``, outside earlier cliffs."""
    before = np.arange(max(0, a - window), a)
    before = before[~mask[before]]
    return float(np.median(loss[before])) if before.size >= 5 else float(level[a])


def _recovery(
    steps: np.ndarray, loss: np.ndarray, peak: int, base: float, recover: float
) -> tuple[int, float | None]:
    """The first point after ``peak`` back within ``recover`` of ``base`` and the steps taken
    (without recovery: the end of the series and None)."""
    after = np.flatnonzero(loss[peak + 1 :] - base < recover)
    if after.size:
        j = peak + 1 + int(after[0])
        return j, float(steps[j] - steps[peak])
    return loss.size, None


def _near(step: float, ctx: CliffContext) -> bool | None:
    """True when ``step`` lies within the checkpoint window of a save (None: no saves known)."""
    if ctx.checkpoints.size == 0:
        return None
    return bool(near_checkpoint(np.array([step]), ctx.checkpoints, *ctx.window)[0])


def _bucket(buckets: list[Any] | None, i: int) -> object:
    if buckets is None:
        return None
    label = buckets[i]
    return list(label) if isinstance(label, tuple) else label


#: significance level for ``associated``
ALPHA = 0.05


@dataclass(frozen=True)
class CheckpointAssociation(JsonForm):
    """Result of testing whether cliffs start at checkpoint steps."""

    associated: bool | None
    p_value: float | None
    checkpoints: int
    cliffs: int
    aligned: int
    expected_aligned: float | None
    window: tuple[float, float]
    source: str | None
    save_seconds_mean: float | None = None
    throughput_ratio: float | None = None
    note: str = ""

    TEST = "exact permutation test of cliff placements (hypergeometric tail)"
    JSON = {"associated": None, "p_value": significant, "checkpoints": None, "cliffs": None,
            "aligned": None, "expected_aligned": fixed(3), "window_steps": ("window", list),
            "source": None, "test": "TEST", "save_seconds_mean": None,
            "throughput_ratio_after_save": "throughput_ratio", "note": None}


def hypergeom_sf(k: int, total: int, good: int, draws: int) -> float:
    """``P(X >= k)`` for ``X`` ~ hypergeometric(total, good, draws).

    >>> round(hypergeom_sf(1, 10, 1, 1), 3)
    0.1
    """
    if k <= max(0, draws - (total - good)):
        return 1.0
    if k > min(good, draws):
        return 0.0
    denom = _lcomb(total, draws)
    return _summed([_lcomb(good, i) + _lcomb(total - good, draws - i) - denom
                    for i in range(k, min(good, draws) + 1)])


def binomial_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X`` ~ binomial(n, p), in logs (exact).

    >>> round(binomial_sf(2, 2, 0.5), 3)
    0.25
    """
    if k <= 0:
        return 1.0
    return _summed([_lcomb(n, i) + i * math.log(p) + (n - i) * math.log(1 - p)
                    for i in range(k, n + 1)])


def _lcomb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _summed(log_terms: list[float]) -> float:
    """The sum of the probabilities whose logs are ``log_terms``, at most 1."""
    top = max(log_terms)
    return float(min(1.0, math.exp(top) * sum(math.exp(t - top) for t in log_terms)))


def checkpoint_window(interval: float) -> tuple[float, float]:
    """``(before, after)``: a cliff within this many steps of a save is aligned with it.

    >>> checkpoint_window(1.0), checkpoint_window(10.0)
    ((1.0, 3.0), (10.0, 30.0))
    """
    return float(interval), float(max(3.0, 3.0 * interval))


def near_checkpoint(
    steps: np.ndarray, checkpoints: np.ndarray, before: float, after: float
) -> np.ndarray:
    """Mask of ``steps`` lying within ``[c - before, c + after]`` of some checkpoint ``c``."""
    if checkpoints.size == 0:
        return np.zeros(steps.size, dtype=bool)
    ck = np.sort(checkpoints)
    i = np.searchsorted(ck, steps - after, side="left")
    i = np.minimum(i, ck.size - 1)
    return (ck[i] >= steps - after) & (ck[i] <= steps + before)


def associate(region_steps: np.ndarray, cliff_steps: Sequence[float], checkpoints: np.ndarray, *,
              interval: float, source: str | None = "events",
              save_seconds_mean: float | None = None, throughput_ratio: float | None = None,
              every: float | None = None) -> CheckpointAssociation:
    """Test cliff starts against checkpoint steps over the analysed ``region_steps``
    (``every``, a ``--checkpoint-every``, only shapes the note when no save is inside)."""
    before, after = checkpoint_window(interval)
    ck = np.asarray(checkpoints, dtype=np.float64)
    lo, hi = (float(region_steps[0]), float(region_steps[-1])) if region_steps.size else (0, 0)
    ck_in = ck[(ck >= lo - after) & (ck <= hi + before)]
    cliffs = np.asarray(cliff_steps, dtype=np.float64)
    base = {"checkpoints": int(ck_in.size), "cliffs": int(cliffs.size), "window": (-before, after),
            "source": source if ck.size or every else None, "save_seconds_mean": save_seconds_mean,
            "throughput_ratio": throughput_ratio}
    if ck.size == 0:
        if every is not None:
            span = hi - lo
            note = (f"--checkpoint-every {every:g} exceeds the {span:g} steps of the log: "
                    "no save falls inside it, so spikes cannot be tested against saves")
        else:
            note = "no checkpoint steps known (log checkpoint events or pass --checkpoint-every N)"
        return CheckpointAssociation(None, None, aligned=0, expected_aligned=None, note=note,
                                     **base)
    if cliffs.size == 0:
        return CheckpointAssociation(None, None, aligned=0, expected_aligned=None,
                                     note="no cliffs to test", **base)
    near = near_checkpoint(region_steps, ck_in, before, after)
    total, good, draws = int(region_steps.size), int(near.sum()), int(cliffs.size)
    aligned = int(near_checkpoint(cliffs, ck_in, before, after).sum())
    if good == 0:
        return CheckpointAssociation(None, None, aligned=aligned, expected_aligned=0.0,
                                     note="no checkpoint inside the analysed steps", **base)
    p = hypergeom_sf(aligned, total, good, min(draws, total))
    return CheckpointAssociation(associated=bool(p < ALPHA), p_value=p, aligned=aligned,
                                 expected_aligned=draws * good / total, **base)


def throughput_ratio(
    steps: np.ndarray, tokens_per_second: np.ndarray, checkpoints: np.ndarray, interval: float
) -> float | None:
    """Median throughput in the steps right after saves / median elsewhere (None: unknown)."""
    ok = np.isfinite(tokens_per_second)
    if ok.sum() < 20 or checkpoints.size == 0:
        return None
    near = near_checkpoint(steps, checkpoints, 0.0, max(1.0, interval)) & ok
    far = ~near & ok
    if near.sum() == 0 or far.sum() == 0:
        return None
    rest = float(np.median(tokens_per_second[far]))
    return float(np.median(tokens_per_second[near]) / rest) if rest > 0 else None
