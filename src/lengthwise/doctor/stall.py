"""A run that does not learn: the step from which the loss has not moved.

The loss is smoothed by a centred rolling mean (a tenth of the log, at
least 5 points) and read from the end backwards: the stall starts at the
earliest row from which the smoothed loss stays within ``FLAT_RELATIVE`` of its
level (the smoothed range over that stretch, relative to its mean). It counts
only when it covers at least ``MIN_SHARE`` of the logged steps and
``MIN_ROWS`` rows: a run that learned and then levelled off for a short while
is not stalled, one whose loss has not moved over most of the log is. Every
other finding (periods, bands, spikes) describes noise around a level; this
one says the level itself is not going down, which a user needs to hear first.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> s = np.arange(10.0, 1090.0, 10.0)
    >>> st = find_stall(s, 4.77 + 0.005 * rng.standard_normal(s.size))
    >>> st.since, round(st.level, 2)
    (10.0, 4.77)
    >>> find_stall(s, 4.0 * np.exp(-s / 500)).since is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.doctor.numbers import num
from lengthwise.doctor.smoothing import odd, rolling_mean

#: the smoothed loss moves by less than this share of its level over a stall
FLAT_RELATIVE = 0.005
#: a stall covers at least this share of the logged steps ...
MIN_SHARE = 0.5
#: ... and this many logged rows
MIN_ROWS = 30


@dataclass(frozen=True)
class Stall:
    """The stretch at the end of the log where the loss has not moved (``since`` None: none)."""

    since: float | None
    level: float | None = None
    spread: float | None = None
    moved: float | None = None
    rows: int = 0
    share: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``stall`` key of the report)."""
        return {
            "since": num(self.since),
            "level": num(self.level, 6),
            "spread": num(self.spread, 4),
            "moved": num(self.moved, 4),
            "rows": self.rows,
            "share_of_steps": round(self.share, 4),
            "test": f"smoothed loss within {FLAT_RELATIVE:.1%} of its level over at least "
                    f"{MIN_SHARE:.0%} of the logged steps ({MIN_ROWS}+ rows)",
        }


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
