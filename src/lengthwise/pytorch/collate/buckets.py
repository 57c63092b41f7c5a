"""Which bucket of a list of upper edges holds a length.

Example::

    >>> bucket_of(9, [4, 8, 16])
    2
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from lengthwise.errors import ConfigError

__all__ = ["bucket_of"]


def bucket_of(length: int, edges: Sequence[int]) -> int:
    """Index of the bucket ``(edges[k-1], edges[k]]`` that holds ``length``.

    Example::

        >>> bucket_of(5, [4, 16]), bucket_of(4, [4, 16])
        (1, 0)
    """
    k = bisect.bisect_left(edges, length)
    if k == len(edges):
        raise ConfigError(
            f"a sample of {length} tokens is longer than the last bucket edge {edges[-1]}; "
            "the edges do not match the data (plan with the same max_len, or truncate with "
            "max_length)")
    return k
