"""The noise budget: how much of the step-to-step loss variance is plain sampling noise.

A step's loss is the token-weighted mean of its samples' losses, so even with
nothing wrong it varies from step to step by about ``loss_sample_std /
sqrt(n)``: the **sampling floor** (``loss_sample_std`` and ``n``, the
effective number of samples ``loss_sample_neff``, are logged by
``StepLogger.record_micro(sample_losses=...)``; without ``loss_sample_neff``
the logged ``samples`` stand in). The budget splits the variance
of the detrended stable-region loss (the residual of ``loss_roughness``) into
shares that sum to 1:

* ``sampling``: the mean squared floor over the variance;
* ``composition``: what the step's length bucket explains (the attribution's
  R^2), else what its mean length explains (R^2 of a cubic in the log of the
  length), less what chance gives (adjusted R^2);
* ``schedule``: what follows the learning rate (its own deviation from its
  running mean, e.g. in warm-up or at a restart), adjusted R^2 likewise;
* ``unexplained``: the rest (shares are scaled down together when the parts
  add up to more than the whole).

``excess`` is ``loss_roughness / sampling_floor``: 1 means the curve is as
smooth as its sample count allows. Without ``loss_sample_std`` the sampling
part cannot be separated and ``shares`` is null.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> resid = rng.standard_normal(2000) * 0.1
    >>> nb = noise_budget(resid, loss_sample_std=np.full(2000, 0.8), samples=np.full(2000, 64.0))
    >>> round(nb.excess, 1), round(nb.shares["sampling"], 1)
    (1.0, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.doctor.numbers import num
from lengthwise.doctor.smoothing import ROUGHNESS_WINDOW, rolling_mean

#: fewest stable-region points with a logged sample std for a budget
MIN_POINTS = 20


@dataclass(frozen=True)
class Noise:
    """The sampling floor of the per-step loss and the shares of its variance."""

    sampling_floor: float | None
    excess: float | None
    shares: dict[str, float] | None
    summary: str
    samples_per_step: float | None = None
    composition_source: str | None = None
    points: int = 0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``noise`` key of the report)."""
        return {
            "sampling_floor": num(self.sampling_floor, 6),
            "excess": num(self.excess, 4),
            "shares": None if self.shares is None else
            {k: num(v, 4) for k, v in self.shares.items()},
            "samples_per_step": num(self.samples_per_step, 2),
            "composition_source": self.composition_source,
            "points": self.points,
            "summary": self.summary,
        }


def _adjusted(r2: float | None, groups: int, n: int) -> float | None:
    """R^2 less its expectation under no effect, ``(groups - 1) / (n - 1)``, at least 0."""
    if r2 is None:
        return None
    return max(0.0, (r2 - (groups - 1) / max(n - 1, 1)) / (1 - (groups - 1) / max(n - 1, 1)))


def length_r2(resid: np.ndarray, length: np.ndarray | None) -> float | None:
    """Adjusted R^2 of ``resid`` on a cubic in ``log(length)`` (a smooth length effect).

    >>> x = np.linspace(1, 3, 200)
    >>> round(length_r2(-0.3 * x, np.exp(x)), 3)
    1.0
    """
    if length is None:
        return None
    ok = np.isfinite(length) & (length > 0) & np.isfinite(resid)
    if ok.sum() < MIN_POINTS or np.unique(length[ok]).size < 4:
        return None
    x = np.log(length[ok])
    x = (x - x.mean()) / (x.std() or 1.0)
    a = np.column_stack([np.ones(x.size), x, x * x, x * x * x])
    y = resid[ok]
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    sst = float(((y - y.mean()) ** 2).sum())
    if sst <= 0:
        return 0.0
    r2 = max(0.0, 1.0 - float(((y - a @ coef) ** 2).sum()) / sst)
    return _adjusted(r2, 4, int(ok.sum()))


def schedule_r2(resid: np.ndarray, lr: np.ndarray | None) -> float | None:
    """Adjusted R^2 of ``resid`` on the learning rate's deviation from its running mean."""
    if lr is None:
        return None
    ok = np.isfinite(lr) & np.isfinite(resid)
    if ok.sum() < MIN_POINTS:
        return None
    x = lr[ok] - rolling_mean(lr[ok], ROUGHNESS_WINDOW)
    y = resid[ok] - resid[ok].mean()
    sxx = float((x - x.mean()) @ (x - x.mean()))
    syy = float(y @ y)
    if sxx <= 0 or syy <= 0:
        return 0.0
    r2 = float(((x - x.mean()) @ y) ** 2 / (sxx * syy))
    return _adjusted(r2, 2, int(ok.sum()))


def noise_budget(
    resid: np.ndarray,
    *,
    loss_sample_std: np.ndarray | None = None,
    samples: np.ndarray | None = None,
    composition_r2: float | None = None,
    composition_groups: int = 1,
    composition_source: str | None = None,
    length: np.ndarray | None = None,
    length_source: str | None = None,
    lr: np.ndarray | None = None,
) -> Noise | None:
    """Noise budget of the detrended stable-region loss ``resid`` (None: too few points)."""
    resid = np.asarray(resid, dtype=np.float64)
    n = int(np.isfinite(resid).sum())
    if n < MIN_POINTS:
        return None
    var = float(np.nanvar(resid))
    floor2, spp = _sampling_floor2(loss_sample_std, samples)
    comp = _adjusted(composition_r2, composition_groups, n)
    if comp is None:
        comp = length_r2(resid, length)
        if comp is not None:
            composition_source = length_source
    sched = schedule_r2(resid, lr)
    rough = float(np.sqrt(var))
    if floor2 is None:
        what = ("loss_sample_std not logged: the sampling noise cannot be separated from the "
                "rest (pass sample_losses= to StepLogger.record_micro)")
        return Noise(sampling_floor=None, excess=None, shares=None, summary=what,
                     composition_source=composition_source, points=n)
    floor = float(np.sqrt(floor2))
    shares = _shares(floor2, var, comp, sched)
    summary = _sentence(shares, spp, comp is not None, sched is not None, composition_source)
    return Noise(
        sampling_floor=floor,
        excess=rough / floor if floor > 0 else None,
        shares=shares,
        summary=summary,
        samples_per_step=spp,
        composition_source=composition_source,
        points=n,
    )


def _sampling_floor2(
    loss_sample_std: np.ndarray | None, samples: np.ndarray | None
) -> tuple[float | None, float | None]:
    """The sampling variance of the detrended loss and the median samples per step."""
    if loss_sample_std is None or samples is None:
        return None, None
    ok = np.isfinite(loss_sample_std) & np.isfinite(samples) & (samples > 0)
    if ok.sum() < MIN_POINTS:
        return None, None
    f2 = loss_sample_std[ok] ** 2 / samples[ok]
    return float(np.mean(f2)) * (1.0 - 1.0 / ROUGHNESS_WINDOW), float(np.median(samples[ok]))


def _shares(
    floor2: float, var: float, comp: float | None, sched: float | None
) -> dict[str, float]:
    """Variance shares of sampling, composition and schedule (scaled to fit), and the rest."""
    parts = {
        "sampling": min(1.0, floor2 / var) if var > 0 else 1.0,
        "composition": comp or 0.0,
        "schedule": sched or 0.0,
    }
    total = sum(parts.values())
    if total > 1.0:
        parts = {k: v / total for k, v in parts.items()}
        total = 1.0
    return {**parts, "unexplained": 1.0 - total}


def _sentence(
    shares: dict[str, float], spp: float | None, comp_known: bool, sched_known: bool,
    comp_source: str | None,
) -> str:
    size = f"{spp:.0f}" if spp >= 10 else f"{spp:.2g}"  # a median over steps: no false digits
    parts = [f"{shares['sampling']:.0%} of the step-to-step variance is the sampling noise of "
             f"{size} samples per step"]
    if comp_known:
        parts.append(f"{shares['composition']:.0%} follows the {comp_source or 'length bucket'}")
    if sched_known and shares["schedule"] >= 0.005:
        parts.append(f"{shares['schedule']:.0%} follows the learning rate")
    parts.append(f"{shares['unexplained']:.0%} unexplained")
    text = ", ".join(parts)
    missing = [w for w, known in (("the batch composition (log `bucket`)", comp_known),
                                  ("the schedule (log `lr`)", sched_known)) if not known]
    if missing:
        text += f" (not separable: {' and '.join(missing)})"
    return text
