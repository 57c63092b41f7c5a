"""The held-out loss against the training loss: the gap, and where it starts to widen.

At each evaluation step the gap is the held-out loss minus the training loss's
running mean there (the training loss of one step is too noisy to subtract). The
gap *widens* after its smallest value when, after it, at least
:data:`MIN_AFTER` evaluations follow and the last gap exceeds that smallest one by
more than :data:`WIDEN_SIGMAS` times the gap's own evaluation-to-evaluation noise
(1.4826 MAD of its successive differences about their median, over sqrt 2) and by
at least :data:`MIN_WIDENING` of the training loss level, and ends above the
training loss by as much (a held-out loss below it has not pulled away): training goes on
lowering the training loss while the held-out loss stays or rises (over-fitting,
memorisation of repeated data). The held-out loss *rises* when its last value
exceeds its minimum by the same margins. The widening is placed at the last
evaluation whose gap is still within 3 noise units of the smallest one.

Example::

    >>> import numpy as np
    >>> s = np.arange(1.0, 1001.0)
    >>> train = 3.0 - s / 1000
    >>> ev = np.column_stack([np.arange(100.0, 1001, 100), [2.95, 2.85, 2.74, 2.62, 2.6,
    ...                       2.6, 2.62, 2.66, 2.7, 2.75]])
    >>> g = eval_gap(s, train, ev)
    >>> g.widening, g.widens_from
    (True, 500.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.doctor.numbers import counted, num, significant
from lengthwise.doctor.smoothing import rolling_mean

__all__ = ["EvalGap", "eval_gap"]

#: evaluations needed to say anything
MIN_EVALS = 4
#: evaluations after the smallest gap for a widening
MIN_AFTER = 3
#: the last gap over the smallest, in units of the gap's noise
WIDEN_SIGMAS = 3.0
#: ... and as a share of the training loss level
MIN_WIDENING = 0.05
#: points of the running mean of the training loss the gap is taken against
TRAIN_WINDOW = 51


@dataclass(frozen=True)
class EvalGap:
    """Held-out minus training loss at each evaluation, and whether (and where) it widens."""

    evals: int = 0
    first_gap: float | None = None
    last_gap: float | None = None
    min_gap: float | None = None
    widens_from: float | None = None
    widening: bool = False
    eval_min_step: float | None = None
    eval_rising: bool = False
    noise: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``eval_gap`` key of the report)."""
        return {"evals": self.evals, "first_gap": significant(self.first_gap),
                "last_gap": significant(self.last_gap), "min_gap": significant(self.min_gap),
                "widening": self.widening, "widens_from": num(self.widens_from),
                "eval_rising": self.eval_rising, "eval_min_step": num(self.eval_min_step),
                "noise": significant(self.noise), "note": self.note}


def eval_gap(step: np.ndarray, loss: np.ndarray, evals: np.ndarray) -> EvalGap:
    """The :class:`EvalGap` of training losses ``loss`` at ``step`` and ``(step, eval_loss)``
    rows ``evals``."""
    if evals.shape[0] == 0:
        return EvalGap(note="not tested: no held-out loss logged (eval_loss)")
    inside = (evals[:, 0] >= step[0]) & (evals[:, 0] <= step[-1])
    ev = evals[inside]
    if ev.shape[0] < MIN_EVALS:
        return EvalGap(evals=int(ev.shape[0]),
                       note=f"not tested: {counted(int(ev.shape[0]), 'evaluation')} inside "
                            f"the training log (need {MIN_EVALS})")
    trend = rolling_mean(loss, TRAIN_WINDOW)
    at = np.clip(np.searchsorted(step, ev[:, 0]), 0, step.size - 1)
    gap = ev[:, 1] - trend[at]
    noise = _noise(gap)
    level = float(np.median(np.abs(trend)))
    margin = max(WIDEN_SIGMAS * noise, MIN_WIDENING * level)
    low = int(np.argmin(gap))
    # a held-out loss still below the training loss has not pulled away from it
    widening = (gap.size - 1 - low >= MIN_AFTER and gap[-1] - gap[low] > margin
                and gap[-1] > margin)
    emin = int(np.argmin(ev[:, 1]))
    rising = ev.shape[0] - 1 - emin >= MIN_AFTER and ev[-1, 1] - ev[emin, 1] > margin
    # the gap leaves its floor after the last evaluation still within the noise of its minimum
    above = np.flatnonzero(gap[low:] > gap[low] + WIDEN_SIGMAS * noise)
    start = low + int(above[0]) - 1 if above.size else low
    return EvalGap(evals=int(ev.shape[0]), first_gap=float(gap[0]), last_gap=float(gap[-1]),
                   min_gap=float(gap[low]), widens_from=float(ev[start, 0]) if widening else None,
                   widening=bool(widening), eval_min_step=float(ev[emin, 0]),
                   eval_rising=bool(rising), noise=noise)


def _noise(gap: np.ndarray) -> float:
    """The gap's evaluation-to-evaluation noise: robust spread of its successive differences."""
    d = np.diff(gap)
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2.0))
