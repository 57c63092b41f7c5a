"""The family of errors lengthwise raises for bad input, which the command line prints in one line.

Every check of what a user gives (a parameter, a file, a log, a checkpoint, a
missing optional package) raises a :class:`LengthwiseError`. Each also subclasses
the built-in type a caller would expect (``ValueError`` for a bad value,
``FileNotFoundError`` for a missing file, ``ImportError`` for a missing extra), so
``except ValueError`` keeps working. Anything else that escapes is a bug: the
command line prints its traceback and says so.

Example::

    >>> try:
    ...     raise ConfigError("max_tokens must be a positive integer, got 0")
    ... except ValueError as exc:
    ...     print(isinstance(exc, LengthwiseError), exc)
    True max_tokens must be a positive integer, got 0
"""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "DiskFullError", "LengthwiseError",
           "MissingDependencyError"]


class LengthwiseError(Exception):
    """Base of every error raised for bad input (never for a bug of lengthwise itself)."""


class ConfigError(LengthwiseError, ValueError):
    """A parameter or option has a value that cannot work; the message names it and the fix."""


class DataError(LengthwiseError, ValueError):
    """Input data (a file's content, a sample, a row) cannot be used; the message names where."""


class MissingDependencyError(LengthwiseError, ImportError):
    """An optional package is needed and not installed; the message names the extra to install."""


class DiskFullError(LengthwiseError, OSError):
    """A write failed for want of room (a full disk, a quota, a file-size limit); see
    :mod:`lengthwise.disk`. The message names the folder and, when known, the size needed."""

    def __init__(self, message: str, *, folder: object = None, reason: str | None = None,
                 needed: int | None = None) -> None:
        super().__init__(message)
        self.folder, self.reason, self.needed = folder, reason, needed
