"""Many pooled best-fit packers (*lanes*) run in lock-step, one NumPy operation serving all.

:func:`deal` hands every cell of every lane one item of each length block;
:func:`lockstep` packs the dealt items into rows.

Example::

    >>> items, table = deal(np.array([3, 5, 2, 6]), 8, 2, 1, np.random.default_rng(0))
    >>> row, rank, rows = lockstep(table, 8, 1, 2, 0)
    >>> rows
    2
"""

from __future__ import annotations

import numpy as np


def deal(lengths: np.ndarray, capacity: int, chunk: int, lanes: int,
         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Deal items to cells: one item of every length block to every cell.

    Returns ``(items, lengths)`` tables of shape ``(chunk, cells)``: column ``c`` is
    cell ``c``'s items, longest first (``-1`` and length 0 where items ran out).
    Row ``j`` holds the ``j``-th length block in an order drawn from ``rng``.

    Example::

        >>> items, table = deal(np.array([1, 2, 3]), 4, 2, 1, np.random.default_rng(0))
        >>> items.shape, sorted(table.reshape(-1).tolist())
        ((2, 2), [0, 1, 2, 3])
    """
    n = lengths.size
    small = lengths.astype(np.uint16 if capacity < 2**16 else np.uint32)
    key = np.subtract(capacity, small, dtype=small.dtype)
    cells = -(-n // chunk)
    cells = -(-cells // lanes) * lanes  # the same number of cells for every lane
    items = np.empty(chunk * cells, dtype=np.int32 if n < 2**31 else np.int64)
    items[:n] = np.argsort(key, kind="stable")  # a radix sort: longest first
    del key
    items[n:] = -1
    items = rng.permuted(items.reshape(chunk, cells), axis=1, out=items.reshape(chunk, cells))
    table_len = np.append(small, 0)[items]  # -1 reads the appended 0
    return items, table_len.astype(np.int32)


def lockstep(table_len: np.ndarray, capacity: int, lanes: int, pool: int,
             close_at: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Run ``lanes`` pooled best-fit packers in lock-step over dealt lengths.

    Step ``(k, j)`` gives lane ``l`` the item at ``table_len[j, k*lanes + l]``
    (chunk ``k`` of the lane, its ``j``-th longest item). Returns, per table entry,
    its row and its position in that row, and the number of rows opened.

    Every slot of a lane's pool is encoded as ``room << shift | slot`` while open
    and ``slot - 2**shift`` (negative) while free, so one unsigned minimum over
    the slots of ``encoded - length << shift`` finds, for all lanes at once, the
    fullest open row that still has room, with the row's new encoding.

    Example::

        >>> row, rank, rows = lockstep(np.array([[3], [2]], dtype=np.int32), 5, 1, 2, 0)
        >>> row.reshape(-1).tolist(), rank.reshape(-1).tolist(), rows
        ([0, 0], [0, 1], 1)
    """
    chunk, cells = table_len.shape
    shift = max(1, (pool - 1).bit_length())
    mask = np.int32((1 << shift) - 1)
    encoded = (np.arange(pool, dtype=np.int32)[:, None] - np.int32(1 << shift)
               ).repeat(lanes, axis=1)  # (pool, lanes), all free
    flat_enc = encoded.reshape(-1)
    row_of = np.zeros(pool * lanes, dtype=np.int32)  # the row in each slot
    used = np.zeros(pool * lanes, dtype=np.int32)  # and the items placed in it
    out_row = np.empty((chunk, cells), dtype=np.int32)
    out_rank = np.empty((chunk, cells), dtype=np.int32)
    lane = np.arange(lanes, dtype=np.int32)
    none_fits = np.uint32(2**31)
    close_below = np.int32((close_at + 1) << shift)
    full_code = np.int32(capacity << shift)
    scaled = table_len << shift
    placed = (table_len > 0).astype(np.int32)
    row_ids = np.arange(table_len.size, dtype=np.int32)  # at most one new row per item
    next_row = 0
    for k in range(cells // lanes):
        cols = slice(k * lanes, (k + 1) * lanes)
        for j in range(chunk):
            x = scaled[j, cols]
            best = (encoded - x).view(np.uint32).min(axis=0)
            need = best >= none_fits
            if need.any():  # open a row: a free slot, else close the fullest row
                new = need.nonzero()[0]
                slot = encoded[:, new].min(axis=0) & mask
                flat = slot * lanes + new
                row_of[flat] = row_ids[next_row : next_row + new.size]
                used[flat] = 0
                next_row += new.size
                best[new] = (full_code + slot - x[new]).view(np.uint32)
            best = best.view(np.int32)
            flat = (best & mask) * lanes + lane
            out_row[j, cols] = row_of[flat]
            rank = used[flat]
            out_rank[j, cols] = rank
            used[flat] = rank + placed[j, cols]
            flat_enc[flat] = np.where(best < close_below, (best & mask) - (mask + 1), best)
    return out_row, out_rank, next_row
