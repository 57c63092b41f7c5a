"""The running loss of every bucket, and the composition-corrected loss they add up to.

Example::

    >>> losses = BucketLosses(window=50)
    >>> losses.add(np.array([[2.0, 1.0, 1.0, 1.0], [12.0, 3.0, 1.0, 3.0]]), False, 0)
    [0, 1]
    >>> means = losses.means(); means, losses.corrected(means, None)
    ({0: 2.0, 1: 4.0}, 3.5)
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lengthwise.train.step_logger._vector import B_LOSS_SUM, B_MICRO, B_OBSERVED, B_WEIGHT

#: a bucket's running loss keeps at least this many of its steps
MIN_ENTRIES = 3


def window_mean(window: deque[tuple[int, float, float]]) -> float:
    """Weighted mean loss of a window of ``(step index, loss * weight, weight)`` entries.

    Example::

        >>> window_mean(deque([(0, 2.0, 1.0), (1, 6.0, 1.0)]))
        4.0
    """
    return sum(s for _, s, _ in window) / sum(w for _, _, w in window)


class BucketLosses:
    """Per bucket, the token-weighted mean loss of its last ``window`` optimizer steps.

    A bucket keeps at least its last ``MIN_ENTRIES`` entries, however long ago.
    ``observed`` sums every bucket's weight (real tokens) so far, the shares that
    stand in when the data set's are not given.

    Example::

        >>> BucketLosses(window=10).means()
        {}
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.windows: dict[int, deque[tuple[int, float, float]]] = {}
        self.observed: dict[int, float] = {}

    def add(self, columns: np.ndarray, skipped: bool, index: int) -> list[int]:
        """Add step ``index``'s per-bucket sums (``(buckets, 4)``); return the buckets present.

        A skipped step counts towards ``observed`` but not towards the running losses.
        """
        present = [int(b) for b in np.flatnonzero(columns[:, B_MICRO] > 0)]
        for b in present:
            self.observed[b] = self.observed.get(b, 0.0) + float(columns[b, B_OBSERVED])
            if not skipped and columns[b, B_WEIGHT] > 0:
                self.windows.setdefault(b, deque()).append(
                    (index, float(columns[b, B_LOSS_SUM]), float(columns[b, B_WEIGHT]))
                )
        oldest = index - self.window  # entries at or before this index expire
        for entries in self.windows.values():
            while len(entries) > MIN_ENTRIES and entries[0][0] <= oldest:
                entries.popleft()
        return present

    def means(self) -> dict[int, float]:
        """The running loss of every bucket seen so far, by bucket id."""
        return {b: window_mean(w) for b, w in sorted(self.windows.items())}

    def corrected(self, bucket_loss: dict[int, float],
                  shares: dict[int, float] | None) -> float | None:
        """``bucket_loss`` weighted by ``shares`` (default: the observed ones); ``None`` if none."""
        shares = shares if shares is not None else self.observed
        weights = {b: shares.get(b, 0.0) for b in bucket_loss}
        total = sum(weights.values())
        if total <= 0:
            return None
        return sum(weights[b] * loss for b, loss in bucket_loss.items()) / total
