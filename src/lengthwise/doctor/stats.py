"""Statistics of the stable region, ``loss_roughness`` among them, non-finite losses, and
steps the trainer skipped.

``loss_roughness`` (docs/metrics.md) is the standard deviation of
``loss_t - rolling_mean_51(loss)_t`` over the stable region, the rolling mean
being centred over 51 logged points with cliff points left out of it (and the
cliff points themselves left out of every statistic here).

Example::

    >>> import numpy as np
    >>> loss = 2 + 0.1 * np.tile([1.0, -1.0], 100)
    >>> s = stable_stats(loss, np.ones(200, bool), np.zeros(200, bool))
    >>> round(s.mean, 3), round(s.loss_roughness, 3)
    (2.0, 0.102)

Steps the trainer skipped hold nothing to learn from (not divergence).
lengthwise's training loop applies no update in a step whose micro-batches hold
no supervised token, and logs it ``"skipped": true`` with a NaN (or null) loss; the
DFlash recipe also logs ``"slots": 0`` (no draft slot supervised). Such a loss is
the trainer's word that the step was empty, not a loss that went non-finite, so
these rows are counted apart (:func:`empty_steps`) and left out of the non-finite
losses. A skipped row with a NaN loss is read as empty only when it says so
(``slots`` or ``real_tokens`` 0): a step the spike guard skipped keeps its NaN in
the non-finite count.

    >>> e, _ = empty_steps(np.arange(1.0, 5.0), np.array([2.0, np.nan, 1.9, np.nan]),
    ...                    {"skipped": np.array([0.0, 1.0, 0.0, 1.0]),
    ...                     "slots": np.array([9.0, 0.0, 9.0, 5.0])})
    >>> e.count, e.first_steps, e.field
    (1, [2.0], 'slots')
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numbers import num
from lengthwise.doctor.smoothing import ROUGHNESS_WINDOW, rolling_mean
from lengthwise.errors import DataError


@dataclass(frozen=True)
class NonFinite:
    """Losses logged as NaN or +-inf (or null)."""

    count: int = 0
    nan: int = 0
    inf: int = 0
    first_steps: list[float] = field(default_factory=list)
    diverged_at: float | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "count": self.count,
            "nan": self.nan,
            "inf": self.inf,
            "first_steps": [num(s) for s in self.first_steps],
            "diverged_at": num(self.diverged_at),
        }


@dataclass(frozen=True)
class StableStats:
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

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``stats`` key of the report)."""

        def r(v: float | None) -> float | None:
            return None if v is None or not np.isfinite(v) else round(float(v), 6)

        return {
            "points": self.points,
            "cliff_points_excluded": self.cliff_points,
            "mean": r(self.mean),
            "median": r(self.median),
            "std": r(self.std),
            "min": r(self.min),
            "max": r(self.max),
            "loss_roughness": r(self.loss_roughness),
            "roughness_relative": r(self.roughness_ratio_to_mean),
            "corrected_roughness": r(self.corrected_roughness),
            "noise_scale": r(self.noise_scale),
            "nonfinite": self.nonfinite.to_dict(),
        }



def roughness_residual(loss: np.ndarray, cliff_mask: np.ndarray) -> np.ndarray:
    """``loss - rolling_mean_51(loss)`` with cliff points left out of the mean."""
    return loss - rolling_mean(loss, ROUGHNESS_WINDOW, valid=~cliff_mask)


def stable_stats(
    loss: np.ndarray,
    region: np.ndarray,
    cliff_mask: np.ndarray,
    *,
    corrected: np.ndarray | None = None,
    noise_scale: float | None = None,
    nonfinite: NonFinite | None = None,
) -> StableStats:
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
    return StableStats(
        points=int(y.size),
        mean=mean,
        median=float(np.median(y)),
        std=float(np.std(y)),
        min=float(np.min(y)),
        max=float(np.max(y)),
        loss_roughness=rough,
        roughness_ratio_to_mean=rough / abs(mean) if mean else float("nan"),
        corrected_roughness=corr,
        noise_scale=noise_scale,
        nonfinite=NonFinite() if nonfinite is None else nonfinite,
        cliff_points=int((region & cliff_mask).sum()),
    )


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
    return NonFinite(
        count=int(bad.sum()),
        nan=int(np.isnan(loss).sum()),
        inf=int(np.isinf(loss).sum()),
        first_steps=[float(s) for s in step[idx[:5]]],
        diverged_at=diverged,
    )


#: the fields that say a step held nothing supervised (0), in the order they are trusted
EMPTY_FIELDS: tuple[str, ...] = ("slots", "real_tokens")


@dataclass(frozen=True)
class EmptySteps:
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

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``skipped_steps`` key of the report)."""
        return {"count": self.count, "share": round(self.share, 6),
                "first_steps": [num(s) for s in self.first_steps], "field": self.field}


def empty_mask(loss: np.ndarray, columns: dict[str, np.ndarray]) -> tuple[np.ndarray, str | None]:
    """Rows logged skipped, with a non-finite loss and 0 in an :data:`EMPTY_FIELDS` field."""
    out = np.zeros(loss.size, dtype=bool)
    skipped = columns.get("skipped")
    if skipped is None:
        return out, None
    flagged = (skipped == 1.0) & ~np.isfinite(loss)
    for name in EMPTY_FIELDS:
        col = columns.get(name)
        if col is not None and flagged.any():
            hit = flagged & (col == 0)
            if hit.any():
                return hit, name
    return out, None


def empty_steps(step: np.ndarray, loss: np.ndarray,
                columns: dict[str, np.ndarray]) -> tuple[EmptySteps, np.ndarray]:
    """The :class:`EmptySteps` of a log (its steps, losses and columns) and their row mask."""
    mask, name = empty_mask(loss, columns)
    idx = np.flatnonzero(mask)
    return EmptySteps(count=int(idx.size), rows=int(step.size),
                      first_steps=[float(s) for s in step[idx[:5]]], field=name), mask
