"""Errors raised by the doctor, each with a message that names the log and the problem.

They subclass :class:`~lengthwise.errors.LengthwiseError` and the built-in ``ValueError`` /
``FileNotFoundError`` / ``ImportError``; the command line prints them and exits with status 2.

    >>> try:
    ...     raise EmptyLogError("train_log.jsonl is empty")
    ... except ValueError as exc:
    ...     print(exc)
    train_log.jsonl is empty
"""

from __future__ import annotations

from lengthwise.errors import DataError, LengthwiseError, MissingDependencyError


class LogError(DataError):
    """A log could not be turned into a loss curve."""


class EmptyLogError(LogError):
    """The log holds no loss values (empty file, or no line with the loss field)."""


class UnreadableLogError(LogError):
    """The log exists but cannot be read or decoded (permissions, corrupt file)."""


class LogNotFoundError(LengthwiseError, FileNotFoundError):
    """The log path does not exist (or a directory holds no log the doctor reads)."""


class PlotUnavailableError(MissingDependencyError):
    """``--plot`` was asked for but matplotlib is not installed."""
