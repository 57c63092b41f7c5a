"""The error raised for lengths that cannot be planned, shared by every reader.

Example::

    >>> issubclass(LengthError, ValueError)
    True
"""

from __future__ import annotations

__all__ = ["LengthError"]


class LengthError(ValueError):
    """Raised for lengths that cannot be planned (negative, fractional, NaN, empty...)."""
