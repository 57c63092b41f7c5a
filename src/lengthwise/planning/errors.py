"""The error raised for lengths that cannot be planned, and the check shared by every reader.

Example::

    >>> issubclass(LengthError, ValueError)
    True
"""

from __future__ import annotations

import numpy as np

from lengthwise.errors import DataError

__all__ = ["MAX_LENGTH", "MAX_PLANNED_TOKENS", "LengthError", "first_bad_length"]

#: lengths must stay below this to be held as int64 (2**63 would wrap to a negative number)
MAX_LENGTH = 2**63
#: a plan sums tokens as int64: its samples times its longest padded length must stay below
#: this, half of 2**63, which leaves room for the batches repeated to even out the ranks
MAX_PLANNED_TOKENS = 2**62


class LengthError(DataError):
    """Raised for lengths that cannot be planned (negative, fractional, NaN, empty...)."""


def first_bad_length(values: np.ndarray) -> int | None:
    """Row of the first value of a numeric array that is negative, fractional or not finite.

    Example::

        >>> first_bad_length(np.array([3.0, 2.5, -1.0])), first_bad_length(np.array([0, 7]))
        (1, None)
    """
    bad = values < 0
    if values.dtype.kind == "f":
        bad |= ~np.isfinite(values) | (values != np.floor(values))
    return int(np.flatnonzero(bad)[0]) if bad.any() else None
