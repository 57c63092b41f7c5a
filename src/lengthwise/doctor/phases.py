"""Phases of a run: end of warm-up, the settling of the initial descent, the stable region.

* **warm-up end** comes from ``lr`` when logged: the first step where the learning rate
  reaches 98 % of its peak (no warm-up when it starts there). Without ``lr`` it is the
  settle point below.

* **settle point**: the knee of the best-so-far smoothed loss (the running minimum of a
  rolling median), the point farthest below the chord from its first to its last value,
  where the initial fast descent is over. It counts only when the descent before it is
  large against the step-to-step noise, and never past the middle of the run.

* **stable region**: from the later of the two to the last finite loss before a run of
  non-finite values at the end (a divergence). ``--from/--to`` override it.

Example::

    >>> import numpy as np
    >>> steps = np.arange(1000.0)
    >>> lr = np.minimum(steps / 100, 1.0)
    >>> loss = 2 + 3 * np.exp(-steps / 50)
    >>> p = find_phases(steps, loss, lr=lr)
    >>> p.warmup_end, p.warmup_source
    (98.0, 'lr')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.doctor.numbers import num
from lengthwise.doctor.smoothing import odd, robust_std, rolling_median
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
class Phases:
    """Where warm-up ends and which steps form the stable region (inclusive)."""

    warmup_end: float | None
    warmup_source: str
    settle_step: float | None
    start: float
    end: float
    chosen_by: str = "auto"
    points: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``stable_region`` key of the report)."""
        return {
            "start": num(self.start),
            "end": num(self.end),
            "points": self.points,
            "chosen_by": self.chosen_by,
            "warmup_end": num(self.warmup_end),
            "warmup_source": self.warmup_source,
            "settle_step": num(self.settle_step),
            "note": self.note,
        }



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
    noise = robust_std(np.diff(tail)) / np.sqrt(2.0)
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


def find_phases(
    steps: np.ndarray,
    loss: np.ndarray,
    *,
    lr: np.ndarray | None = None,
    start: float | None = None,
    end: float | None = None,
) -> Phases:
    """Warm-up end and stable region of finite ``loss`` at increasing ``steps``."""
    if steps.size == 0:
        raise DataError("no finite loss values to analyse")
    warm, why = (None, "lr not logged") if lr is None else warmup_from_lr(steps, lr)
    settle = settle_point(steps, loss)
    source = "lr" if warm is not None else "loss"
    if warm is None:
        warm = settle
        if warm is None:
            source = "none"
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
    return Phases(
        warmup_end=warm,
        warmup_source=source,
        settle_step=settle,
        start=s0,
        end=s1,
        chosen_by=chosen,
        points=int(((steps >= s0) & (steps <= s1)).sum()),
        note=note,
    )
