"""One writer per output folder of ``dflash prepare`` and ``dflash train``, from the start.

:func:`sole_writer` takes the folder's lock (``writer.lock``, the advisory lock of
:class:`~lengthwise.train.checkpoint.lock.WriterLock`) before the command deletes or
writes anything there, and gives it up at the end. A second process into the same
``--out`` gets a :class:`~lengthwise.errors.ConfigError` naming the holder (pid, host,
since when) before it touches the folder. Under ``torchrun`` rank 0 holds the lock
for the job and every rank gets the same outcome.

Example::

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with sole_writer(folder, "dflash train"):
    ...     try:
    ...         with sole_writer(folder, "dflash prepare"):
    ...             pass
    ...     except ConfigError as exc:
    ...         print(str(exc).split(" (")[0].endswith("written by another lengthwise process"))
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lengthwise.errors import ConfigError

__all__ = ["sole_writer"]


@contextmanager
def sole_writer(folder: str | Path, command: str, info: Any = None) -> Iterator[None]:
    """Hold ``folder``'s writer lock for ``command`` (e.g. ``"dflash train"``) while inside."""
    from lengthwise.train.checkpoint.folder import CheckpointError
    from lengthwise.train.checkpoint.lock import WriterLock
    from lengthwise.train.device import rank_world

    rank, world = rank_world(info)
    lock = WriterLock(folder, kind=f"{command} --out", writer="lengthwise process")
    error = None
    if rank == 0:
        try:
            lock.acquire()
        except CheckpointError as exc:
            error = str(exc)
        except OSError as exc:  # a parent that is a file, no permission
            error = f"{command} --out {folder}: {exc.strerror or exc}"
    if world > 1:
        message = [error]
        info.dist.broadcast_object_list(message, src=0)
        error = message[0]
    if error is not None:
        raise ConfigError(error)
    try:
        yield
    finally:
        lock.release()
