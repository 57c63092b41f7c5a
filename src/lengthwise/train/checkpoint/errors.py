"""The error of a checkpoint that could not be written or read.

Example::

    >>> isinstance(CheckpointError("step 3"), RuntimeError)
    True
"""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""
