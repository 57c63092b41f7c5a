"""The errors of a checkpoint that could not be written or read.

Example::

    >>> isinstance(CheckpointError("step 3"), RuntimeError)
    True
    >>> issubclass(CorruptCheckpointError, CheckpointError)
    True
    >>> issubclass(CheckpointLockedError, CheckpointError)
    True
    >>> issubclass(LegacyCheckpointError, CheckpointError)
    True
"""

from __future__ import annotations

from lengthwise.errors import LengthwiseError

__all__ = ["CheckpointError", "CheckpointLockedError", "CorruptCheckpointError",
           "LegacyCheckpointError"]


class CheckpointError(LengthwiseError, RuntimeError):
    """A checkpoint could not be written or read."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files are missing, cut short, fail their checksum or cannot be parsed."""


class CheckpointLockedError(CheckpointError):
    """Another checkpointer is writing into the same checkpoint folder."""


class LegacyCheckpointError(CheckpointError):
    """A checkpoint of an older format (versions 1 and 2, whose state is a pickle), which this
    version does not read: refused, nothing in it loaded."""
