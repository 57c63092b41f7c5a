"""Samples grouped into the rows of a packed batch: given as lists, or cut by next fit.

Example::

    >>> rows = sample_rows([{"input_ids": [1, 2]}, {"input_ids": [3]}, {"input_ids": [4, 5]}],
    ...                    ("input_ids",), None, 3)
    >>> [[s["input_ids"].tolist() for s in row] for row in rows]
    [[[1, 2], [3]], [[4, 5]]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lengthwise.errors import DataError
from lengthwise.pytorch.collate._samples import sample_fields

Row = list[dict[str, np.ndarray]]


def sample_rows(samples: list[Any], fields: tuple[str, ...], max_length: int | None,
                capacity: int | None) -> list[Row]:
    """Samples grouped into rows, each sample's fields as arrays.

    A list of lists gives the rows explicitly; a flat list is one row, or, with a
    ``capacity``, split in order into rows of at most ``capacity`` tokens.

    Example::

        >>> len(sample_rows([[{"input_ids": [1]}], [{"input_ids": [2]}]], ("input_ids",),
        ...                 None, None))
        2
    """
    explicit = isinstance(samples[0], (list, tuple))
    if explicit and not all(isinstance(r, (list, tuple)) for r in samples):
        raise TypeError("PackCollator got a mix of rows (lists) and samples; "
                        "give one or the other")
    if explicit:
        rows, index = [], 0
        for r, row in enumerate(samples):
            if not row:
                raise DataError(f"PackCollator: row {r} is empty")
            rows.append([sample_fields(s, index + j, fields, max_length)
                         for j, s in enumerate(row)])
            index += len(row)
    else:
        flat = [sample_fields(s, i, fields, max_length) for i, s in enumerate(samples)]
        rows = [flat] if capacity is None else next_fit(flat, capacity)
    if capacity is not None:
        for r, row in enumerate(rows):
            used = sum(s["input_ids"].size for s in row)
            if used > capacity:
                raise DataError(f"PackCollator: row {r} holds {used} tokens, more than "
                                f"row_capacity={capacity}")
    return rows


def next_fit(flat: Row, capacity: int) -> list[Row]:
    """Samples in order into rows of at most ``capacity`` tokens, a new row when one is full.

    Example::

        >>> rows = next_fit([{"input_ids": np.ones(n)} for n in (2, 2, 1)], 3)
        >>> [len(row) for row in rows]
        [1, 2]
    """
    rows: list[Row] = [[]]
    used = 0
    for i, s in enumerate(flat):
        n = s["input_ids"].size
        if n > capacity:
            raise DataError(f"sample {i} has {n} tokens, more than row_capacity={capacity}; "
                            "split or truncate it first (max_length)")
        if used + n > capacity:
            rows.append([])
            used = 0
        rows[-1].append(s)
        used += n
    return rows
