"""The loss curve's phases, stable-region statistics, non-finite and skipped steps, stall.

``loss_roughness`` (docs/metrics.md) is the standard deviation of the loss minus its centred
51-point rolling mean over the stable region, cliff points left out. The methods are in
docs/doctor.md (Phases, Statistics, Stall).

Example::

    >>> import numpy as np
    >>> steps = np.arange(1000.0)
    >>> lr = np.minimum(steps / 100, 1.0)
    >>> loss = 2 + 3 * np.exp(-steps / 50)
    >>> p = find_phases(steps, loss, lr=lr)
    >>> p.warmup_end, p.warmup_source
    (98.0, 'lr')
    >>> loss = 2 + 0.1 * np.tile([1.0, -1.0], 100)
    >>> s = stable_stats(loss, np.ones(200, bool), np.zeros(200, bool))
    >>> round(s.mean, 3), round(s.loss_roughness, 3)
    (2.0, 0.102)
    >>> e, _ = empty_steps(np.arange(1.0, 5.0), np.array([2.0, np.nan, 1.9, np.nan]),
    ...                    {"skipped": np.array([0.0, 1.0, 0.0, 1.0]),
    ...                     "slots": np.array([9.0, 0.0, 9.0, 5.0])})
    >>> e.count, e.first_steps, e.field
    (1, [2.0], 'slots')
    >>> rng = np.random.default_rng(0)
    >>> s = np.arange(10.0, 1090.0, 10.0)
    >>> st = find_stall(s, 4.77 + 0.005 * rng.standard_normal(s.size))
    >>> st.since, round(st.level, 2)
    (10.0, 4.77)
    >>> find_stall(s, 4.0 * np.exp(-s / 500)).since is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numeric import (
    ROUGHNESS_WINDOW,
    JsonForm,
    digits,
    each,
    fixed,
    num,
    odd,
    rolling_mean,
    rolling_median,
    step_noise,
)
from lengthwise.errors import ConfigError, DataError

#: the learning rate counts as warmed up at this fraction of its peak
LR_PEAK_FRACTION = 0.98
#: a warm-up ending later than this fraction of the run is not believed
MAX_WARMUP_FRACTION = 0.7
#: the knee must lie this many noise standard deviations below the start to count
KNEE_MIN_DROP_SIGMAS = 5.0
#: longer series are reduced to block medians before the knee is found
MAX_KNEE_POINTS = 2000


@dataclass(frozen=True)
class Phases(JsonForm):
    """Where warm-up ends and which steps form the stable region (inclusive)."""

    warmup_end: float | None
    warmup_source: str
    settle_step: float | None
    start: float
    end: float
    chosen_by: str = "auto"
    points: int = 0
    note: str = ""

    JSON = {"start": num, "end": num, "points": None, "chosen_by": None, "warmup_end": num,
            "warmup_source": None, "settle_step": num, "note": None}


def warmup_from_lr(steps: np.ndarray, lr: np.ndarray) -> tuple[float | None, str]:
    """Warm-up end from the learning-rate column; ``(None, why)`` when it cannot tell."""
    ok = np.isfinite(lr)
    if ok.sum() < 3:
        return None, "lr not logged"
    s, r = steps[ok], lr[ok]
    peak = float(r.max())
    if peak <= 0:
        return None, "lr is never positive"
    if r[0] >= LR_PEAK_FRACTION * peak:
        return float(s[0]), "no lr warm-up"
    i = int(np.argmax(r >= LR_PEAK_FRACTION * peak))
    if s[i] - s[0] > MAX_WARMUP_FRACTION * (s[-1] - s[0]):
        return None, "lr rises through most of the run"
    return float(s[i]), "lr warm-up"


def settle_point(steps: np.ndarray, loss: np.ndarray) -> float | None:
    """Step where the initial fast descent of a finite loss series is over (None: none seen)."""
    n = loss.size
    if n < 20:
        return None
    tail = loss[n // 2 :]
    noise = step_noise(tail)
    if n > MAX_KNEE_POINTS:
        size = n // MAX_KNEE_POINTS
        m = (n // size) * size
        loss = np.median(loss[:m].reshape(-1, size), axis=1)
        steps = steps[:m].reshape(-1, size)[:, size // 2]
        n = loss.size
    smooth = rolling_median(loss, odd(max(5, n // 50)))
    smooth = np.minimum.accumulate(smooth)
    x = (steps - steps[0]) / max(steps[-1] - steps[0], 1e-12)
    top, bottom = smooth[0], smooth[-1]
    chord = top + (bottom - top) * x
    gap = chord - smooth
    half = np.flatnonzero(x <= 0.5)
    k = int(half[np.argmax(gap[half])])
    if gap[k] <= 0 or top - smooth[k] < KNEE_MIN_DROP_SIGMAS * max(noise, 1e-12):
        return None
    return float(steps[k])


def find_phases(steps: np.ndarray, loss: np.ndarray, *, lr: np.ndarray | None = None,
                start: float | None = None, end: float | None = None) -> Phases:
    """Warm-up end and stable region of finite ``loss`` at increasing ``steps``."""
    if steps.size == 0:
        raise DataError("no finite loss values to analyse")
    warm, why = (None, "lr not logged") if lr is None else warmup_from_lr(steps, lr)
    settle = settle_point(steps, loss)
    source = "lr" if warm is not None else "loss" if settle is not None else "none"
    warm = warm if warm is not None else settle
    auto_start = max(v for v in (warm, settle, float(steps[0])) if v is not None)
    note = why if source == "lr" else ""
    chosen = "auto"
    s0, s1 = auto_start, float(steps[-1])
    if start is not None or end is not None:
        chosen = "user"
        s0 = float(start) if start is not None else float(steps[0])
        s1 = float(end) if end is not None else float(steps[-1])
        if start is not None and end is not None and s1 < s0:
            raise ConfigError(f"--from {num(s0)} is after --to {num(s1)}")
        inside = (steps >= s0) & (steps <= s1)
        if not inside.any():
            raise ConfigError(
                f"no logged step in the stable region {num(s0)}..{num(s1)} (--from/--to) "
                f"(the log covers {num(float(steps[0]))}..{num(float(steps[-1]))})"
            )
    return Phases(warmup_end=warm, warmup_source=source, settle_step=settle, start=s0, end=s1,
                  chosen_by=chosen, points=int(((steps >= s0) & (steps <= s1)).sum()), note=note)


@dataclass(frozen=True)
class NonFinite(JsonForm):
    """Losses logged as NaN or +-inf (or null)."""

    count: int = 0
    nan: int = 0
    inf: int = 0
    first_steps: list[float] = field(default_factory=list)
    diverged_at: float | None = None

    JSON = {"count": None, "nan": None, "inf": None, "first_steps": each(num),
            "diverged_at": num}


@dataclass(frozen=True)
class StableStats(JsonForm):
    """Mean, spread and roughness of the loss over the stable region."""

    points: int
    mean: float
    median: float
    std: float
    min: float
    max: float
    loss_roughness: float
    roughness_ratio_to_mean: float
    corrected_roughness: float | None = None
    noise_scale: float | None = None
    nonfinite: NonFinite = field(default_factory=NonFinite)
    cliff_points: int = 0

    JSON = {"points": None, "cliff_points_excluded": "cliff_points",
            **{k: fixed(6) for k in ("mean", "median", "std", "min", "max", "loss_roughness")},
            "roughness_relative": ("roughness_ratio_to_mean", fixed(6)),
            "corrected_roughness": fixed(6), "noise_scale": fixed(6), "nonfinite": None}


def roughness_residual(loss: np.ndarray, cliff_mask: np.ndarray) -> np.ndarray:
    """``loss - rolling_mean_51(loss)`` with cliff points left out of the mean."""
    return loss - rolling_mean(loss, ROUGHNESS_WINDOW, valid=~cliff_mask)


def stable_stats(loss: np.ndarray, region: np.ndarray, cliff_mask: np.ndarray, *,
                 corrected: np.ndarray | None = None, noise_scale: float | None = None,
                 nonfinite: NonFinite | None = None) -> StableStats:
    """Statistics over ``region & ~cliff_mask`` of a finite loss series."""
    use = region & ~cliff_mask
    y = loss[use]
    if y.size == 0:
        raise DataError("the stable region holds no finite, non-cliff loss values")
    rough = float(np.std(roughness_residual(loss, cliff_mask)[use]))
    corr = None
    if corrected is not None:
        ok = np.isfinite(corrected)
        if (ok & use).sum() >= 10:
            res = corrected - rolling_mean(corrected, ROUGHNESS_WINDOW, valid=~cliff_mask & ok)
            corr = float(np.std(res[use & ok]))
    mean = float(np.mean(y))
    return StableStats(points=int(y.size), mean=mean, median=float(np.median(y)),
                       std=float(np.std(y)), min=float(np.min(y)), max=float(np.max(y)),
                       loss_roughness=rough,
                       roughness_ratio_to_mean=rough / abs(mean) if mean else float("nan"),
                       corrected_roughness=corr, noise_scale=noise_scale,
                       nonfinite=NonFinite() if nonfinite is None else nonfinite,
                       cliff_points=int((region & cliff_mask).sum()))


def nonfinite_losses(step: np.ndarray, loss: np.ndarray) -> NonFinite:
    """Count NaN/inf losses; ``diverged_at`` is the first of a non-finite run to the end."""
    bad = ~np.isfinite(loss)
    if not bad.any():
        return NonFinite()
    idx = np.flatnonzero(bad)
    diverged = None
    if bad[-1]:
        good = np.flatnonzero(~bad)
        first_tail = int(good[-1]) + 1 if good.size else 0
        if loss.size - first_tail >= 2 or first_tail == 0:
            diverged = float(step[first_tail])
    return NonFinite(count=int(bad.sum()), nan=int(np.isnan(loss).sum()),
                     inf=int(np.isinf(loss).sum()), first_steps=[float(s) for s in step[idx[:5]]],
                     diverged_at=diverged)


#: the fields that say a step held nothing supervised (0), in the order they are trusted
EMPTY_FIELDS: tuple[str, ...] = ("slots", "real_tokens")


@dataclass(frozen=True)
class EmptySteps(JsonForm):
    """Steps skipped by the trainer because they held no supervised token."""

    count: int = 0
    rows: int = 0
    first_steps: list[float] = field(default_factory=list)
    #: the field that showed each step empty (``slots`` or ``real_tokens``)
    field: str | None = None

    @property
    def share(self) -> float:
        """Skipped empty steps over logged steps."""
        return self.count / self.rows if self.rows else 0.0

    JSON = {"count": None, "share": fixed(6), "first_steps": each(num), "field": None}


def empty_steps(step: np.ndarray, loss: np.ndarray,
                columns: dict[str, np.ndarray]) -> tuple[EmptySteps, np.ndarray]:
    """The :class:`EmptySteps` of a log (its steps, losses and columns) and their row mask:
    rows logged skipped, with a non-finite loss and 0 in an :data:`EMPTY_FIELDS` field."""
    mask, name = np.zeros(loss.size, dtype=bool), None
    skipped = columns.get("skipped")
    flagged = mask if skipped is None else (skipped == 1.0) & ~np.isfinite(loss)
    for key in EMPTY_FIELDS:
        col = columns.get(key)
        if col is not None and (flagged & (col == 0)).any():
            mask, name = flagged & (col == 0), key
            break
    idx = np.flatnonzero(mask)
    return EmptySteps(count=int(idx.size), rows=int(step.size),
                      first_steps=[float(s) for s in step[idx[:5]]], field=name), mask


#: the smoothed loss moves by less than this share of its level over a stall
FLAT_RELATIVE = 0.005
#: a stall covers at least this share of the logged steps ...
MIN_SHARE = 0.5
#: ... and this many logged rows
MIN_ROWS = 30


@dataclass(frozen=True)
class Stall(JsonForm):
    """The stretch at the end of the log where the loss has not moved (``since`` None: none)."""

    since: float | None
    level: float | None = None
    spread: float | None = None
    moved: float | None = None
    rows: int = 0
    share: float = 0.0

    TEST = (f"smoothed loss within {FLAT_RELATIVE:.1%} of its level over at least "
            f"{MIN_SHARE:.0%} of the logged steps ({MIN_ROWS}+ rows)")
    JSON = {"since": num, "level": digits(6), "spread": digits(4), "moved": digits(4),
            "rows": None, "share_of_steps": ("share", fixed(4)), "test": "TEST"}


def find_stall(steps: np.ndarray, loss: np.ndarray) -> Stall:
    """The stall at the end of a log of finite ``loss`` in step order (``since`` None: none)."""
    steps = np.asarray(steps, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    n = y.size
    if n < MIN_ROWS:
        return Stall(since=None)
    smooth = rolling_mean(y, odd(max(5, n // 10)))
    top = np.maximum.accumulate(smooth[::-1])[::-1]
    low = np.minimum.accumulate(smooth[::-1])[::-1]
    suffix_sum = np.cumsum(smooth[::-1])[::-1]
    mean = suffix_sum / np.arange(n, 0, -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        moved = (top - low) / np.abs(mean)
    flat = np.flatnonzero(moved <= FLAT_RELATIVE)
    if flat.size == 0:
        return Stall(since=None)
    i = int(flat[0])
    span = steps[-1] - steps[0]
    share = float((steps[-1] - steps[i]) / span) if span > 0 else 0.0
    if n - i < MIN_ROWS or share < MIN_SHARE:
        return Stall(since=None)
    return Stall(since=float(steps[i]), level=float(np.mean(y[i:])),
                 spread=float(np.std(y[i:])), moved=float(moved[i]), rows=n - i, share=share)
