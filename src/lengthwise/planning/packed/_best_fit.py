"""Best fit decreasing, optionally in a jittered order: the packer that repacks the leftovers.

Example::

    >>> row, rank, rows = best_fit_decreasing(np.array([5, 3, 2, 4]), 7)
    >>> row.tolist(), rows
    ([0, 1, 0, 1], 2)
"""

from __future__ import annotations

import bisect

import numpy as np

#: relative jitter of the lengths that order the repacked items
JITTER = 0.03


def best_fit_decreasing(lengths: np.ndarray, capacity: int,
                        rng: np.random.Generator | None = None,
                        ) -> tuple[np.ndarray, np.ndarray, int]:
    """Best fit decreasing: (row of each item, position in its row, number of rows).

    With ``rng``, items go in a nearly decreasing order (lengths jittered by up to
    ``JITTER``), so rows differ from draw to draw at no cost in fill.

    Example::

        >>> best_fit_decreasing(np.array([2, 2]), 4)[2]
        1
    """
    key = lengths.astype(np.float64)
    if rng is not None:
        key *= 1 + JITTER * rng.uniform(-1, 1, key.size)
    order = np.argsort(-key, kind="stable")
    row = np.empty(lengths.size, dtype=np.int64)
    rank = np.empty(lengths.size, dtype=np.int64)
    gaps: list[tuple[int, int]] = []  # open rows as (room, row), sorted
    used: list[int] = []
    for i, x in zip(order.tolist(), lengths[order].tolist(), strict=True):
        p = bisect.bisect_left(gaps, (x, -1))
        if p == len(gaps):
            room, r = capacity, len(used)
            used.append(0)
        else:
            room, r = gaps.pop(p)
        row[i], rank[i] = r, used[r]
        used[r] += 1
        if room > x:
            bisect.insort(gaps, (room - x, r))
    return row, rank, len(used)
