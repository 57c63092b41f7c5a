"""Samples longer than a row cut into consecutive pieces, and the spans that locate them.

Example::

    >>> ids, start, length, cut = split_pieces(np.array([5, 2]), np.arange(2), 4, True)
    >>> ids.tolist(), start.tolist(), length.tolist(), cut
    ([1, 0, 0], [0, 0, 4], [2, 4, 1], 1)
"""

from __future__ import annotations

import numpy as np


def split_pieces(lens: np.ndarray, ids: np.ndarray, capacity: int, every: bool,
                 ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int]:
    """Cut samples longer than ``capacity`` into consecutive pieces.

    ``every``: ``ids`` is ``0..n-1``. Returns (sample id, start, length) of every
    piece (start None when no sample is cut) and the number of samples cut.

    Example::

        >>> split_pieces(np.array([3, 2]), np.arange(2), 4, True)[1] is None
        True
    """
    planned = lens if every else lens[ids]
    over = planned > capacity
    n_over = int(np.count_nonzero(over))
    if n_over == 0:
        return ids, None, planned, 0
    long_ids, long_len = ids[over], planned[over]
    count = -(-long_len // capacity)
    piece_id = np.repeat(long_ids, count)
    first = np.repeat(np.cumsum(count) - count, count)
    start = (np.arange(piece_id.size) - first) * capacity
    piece_len = np.minimum(capacity, np.repeat(long_len, count) - start)
    return (np.concatenate((ids[~over], piece_id)),
            np.concatenate((np.zeros(ids.size - n_over, dtype=np.int64), start)),
            np.concatenate((planned[~over], piece_len)), n_over)


def token_spans(order: np.ndarray, lens: np.ndarray, sample_ids: np.ndarray,
                piece_start: np.ndarray | None, piece_len: np.ndarray) -> np.ndarray:
    """``(start, length)`` of every scheduled piece ``order[i]`` (sample ``sample_ids[i]``).

    Example::

        >>> token_spans(np.array([1, 0]), np.array([3, 5]), np.array([1, 0]), None,
        ...             np.array([3, 5])).tolist()
        [[0, 5], [0, 3]]
    """
    span_type = np.int32 if lens.max(initial=0) < 2**31 else np.int64
    spans = np.empty((order.size, 2), dtype=span_type)
    spans[:, 0] = 0 if piece_start is None else piece_start[order]
    spans[:, 1] = lens[sample_ids] if piece_start is None else piece_len[order]
    return spans
