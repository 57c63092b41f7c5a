"""Statistics of the stable region, ``loss_roughness`` among them, and non-finite losses.

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
