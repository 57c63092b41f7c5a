"""Items packed into rows of at most ``capacity`` tokens: lanes of best fit, then a repack.

Example::

    >>> order, offsets = pack_rows(np.array([5, 3, 4, 2]), 7, np.random.default_rng(0))
    >>> offsets.size - 1
    2
"""

from __future__ import annotations

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning.packed._best_fit import best_fit_decreasing
from lengthwise.planning.packed._lanes import deal, lockstep

__all__ = ["pack_rows"]

#: open rows per lane
POOL = 8
#: rows under this fill are repacked at the end, lowest fill first, ...
REPACK_TRY = 0.995
#: ... while their items stay within this budget (or 2% of the items, if more), so the
#: best-fit pass stays a small share of the work on any distribution
REPACK_BUDGET = 20_000
#: rows' worth of tokens per chunk of a lane
ROWS_PER_CHUNK = 4


def _rows_to_keep(fill: np.ndarray, size: np.ndarray, budget: int) -> np.ndarray:
    """Rows to keep as packed: all but, lowest fill first, those under ``REPACK_TRY``
    whose items fit in ``budget``."""
    keep = np.ones(fill.size, dtype=bool)
    maybe = np.flatnonzero(fill < REPACK_TRY)
    if maybe.size:
        maybe = maybe[np.argsort(fill[maybe], kind="stable")]
        keep[maybe[np.cumsum(size[maybe]) <= budget]] = False
    return keep


def pack_rows(lengths: np.ndarray, capacity: int, rng: np.random.Generator, *,
              lanes: int | None = None, pool: int = POOL,
              ) -> tuple[np.ndarray, np.ndarray]:
    """Pack items of ``lengths`` (each ``<= capacity``) into rows; return (order, offsets).

    Row ``r`` holds items ``order[offsets[r]:offsets[r+1]]``. Rows mix lengths at
    random (a new mix for every ``rng``) and fill within a row or two of the least
    possible number, ``ceil(sum / capacity)``. Linear in the number of items.

    Example::

        >>> lens = np.random.default_rng(0).integers(1, 500, 1000)
        >>> order, off = pack_rows(lens, 2048, np.random.default_rng(1))
        >>> bool(np.add.reduceat(lens[order], off[:-1]).max() <= 2048)
        True
        >>> off.size - 1 - int(-(-lens.sum() // 2048)) <= 2
        True
    """
    lengths = np.asarray(lengths)
    if lengths.dtype.kind not in "iu":
        lengths = lengths.astype(np.int64)
    n = lengths.size
    if n == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    if lengths.min() < 1 or lengths.max() > capacity:
        raise ValueError(f"item lengths must lie in [1, {capacity}]")
    if pool < 1:
        raise ConfigError(f"pool must be >= 1, got {pool}")
    if capacity << max(1, (pool - 1).bit_length()) >= 2**31:
        raise ValueError(f"capacity {capacity} is too large for a pool of {pool} rows")
    if lanes is None:
        lanes = int(np.clip(n // 4096, 1, 1024))
    chunk = int(np.clip(round(ROWS_PER_CHUNK * capacity / lengths.mean()), 8, 512))
    items, table_len = deal(lengths, capacity, chunk, lanes, rng)
    row, rank, num_rows = lockstep(table_len, capacity, lanes, pool, capacity // 512)
    items, row, rank = items.reshape(-1), row.reshape(-1), rank.reshape(-1)
    tokens = np.bincount(row, weights=table_len.reshape(-1), minlength=num_rows)
    del table_len
    real = items >= 0
    keep = _rows_to_keep(tokens / capacity, np.bincount(row, minlength=num_rows)
                         - np.bincount(row[~real], minlength=num_rows), max(REPACK_BUDGET, n // 50))
    new_id = (np.cumsum(keep) - 1).astype(np.int32)
    kept_rows = int(new_id[-1]) + 1 if num_rows else 0
    stay = keep[row] & real
    items_stay, row, rank = items[stay], new_id[row[stay]], rank[stay]
    sizes = np.bincount(row, minlength=kept_rows)
    # the rest by best fit decreasing
    left = items[~stay & real]
    left_row, left_rank, left_rows = best_fit_decreasing(lengths[left], capacity, rng)
    sizes = np.concatenate((sizes, np.bincount(left_row, minlength=left_rows)))
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    order = np.empty(n, dtype=items.dtype)
    order[offsets[row] + rank] = items_stay
    order[offsets[kept_rows + left_row] + left_rank] = left
    return order, offsets
