"""A full disk, or a file over the size limit, recognised whichever library raised it.

Writers report a full disk in their own words: Python raises
``OSError(errno.ENOSPC)``, safetensors a ``SafetensorError`` saying "No space left on
device (os error 28)", ``torch.save`` a zip-writer ``RuntimeError`` ("unexpected pos")
whose context is the ``OSError``. :func:`full_disk_reason` finds the cause in an error
and its chain; :func:`full_disk_error` and :func:`reporting_full_disk` turn it into a
:class:`~lengthwise.errors.DiskFullError`, one line saying which folder ran out of
room and how much the write needed (when the caller knows), which the command line
prints with exit status 2. Any other error passes through unchanged.

Example::

    >>> import errno
    >>> try:
    ...     with reporting_full_disk("run/target", needed=3 * 2**20, what="saving the target"):
    ...         raise OSError(errno.ENOSPC, "No space left on device")
    ... except DiskFullError as exc:
    ...     print(str(exc).split(";")[0])
    saving the target into run/target failed: the disk is full (no space left on the device)
    >>> full_disk_reason(RuntimeError("Error while serializing: I/O error: File too large "
    ...                               "(os error 27)"))
    'a file grew past the largest file size allowed (ulimit -f or the file system)'
    >>> full_disk_reason(ValueError("bad value")) is None
    True
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lengthwise.errors import DiskFullError

__all__ = ["DiskFullError", "format_bytes", "full_disk_error", "full_disk_reason",
           "reporting_full_disk"]

_NO_SPACE = "the disk is full (no space left on the device)"
_TOO_LARGE = "a file grew past the largest file size allowed (ulimit -f or the file system)"
_QUOTA = "the disk quota is used up"
#: errno -> what it means for a writer
_ERRNOS = {errno.ENOSPC: _NO_SPACE, errno.EFBIG: _TOO_LARGE, errno.EDQUOT: _QUOTA}
#: how libraries that keep no errno spell the same causes (lower case)
_TEXTS = (("no space left", _NO_SPACE), ("os error 28", _NO_SPACE),
          ("file too large", _TOO_LARGE), ("os error 27", _TOO_LARGE),
          ("disk quota exceeded", _QUOTA), ("os error 122", _QUOTA))


def full_disk_reason(exc: BaseException) -> str | None:
    """Why ``exc`` (or an error in its cause/context chain) is a full disk, else ``None``.

    Example::

        >>> full_disk_reason(OSError(28, "No space left on device"))
        'the disk is full (no space left on the device)'
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFullError):
            return current.reason
        code = getattr(current, "errno", None)
        if isinstance(current, OSError) and code in _ERRNOS:
            return _ERRNOS[code]
        text = str(current).lower()
        for needle, reason in _TEXTS:
            if needle in text:
                return reason
        current = current.__cause__ or current.__context__
    return None


def format_bytes(n: int) -> str:
    """``n`` bytes as a short size in binary units.

    Example::

        >>> format_bytes(512), format_bytes(175_419), format_bytes(16 * 2**30)
        ('512 bytes', '171.3 KiB', '16.0 GiB')
    """
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def _free_bytes(folder: Path) -> int | None:
    """Bytes free to this user on the disk holding ``folder`` (its nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:  # pragma: no cover - a folder that vanished meanwhile
        return None


def full_disk_error(exc: BaseException, folder: str | os.PathLike[str], *,
                    needed: int | None = None, what: str = "writing") -> DiskFullError | None:
    """A :class:`DiskFullError` for ``exc`` if it is a full disk or too large a file, else ``None``.

    ``folder`` is where the write went; ``needed`` the bytes it needed, when known;
    ``what`` says what was being written ("saving checkpoint step 4").

    Example::

        >>> full_disk_error(KeyError("x"), "out") is None
        True
        >>> full_disk_error(OSError(28, "No space left"), "out", needed=2048).needed
        2048
    """
    reason = full_disk_reason(exc)
    if reason is None:
        return None
    folder = Path(folder)
    free = _free_bytes(folder)
    sizes = []
    if needed is not None:
        sizes.append(f"it needs about {format_bytes(int(needed))}")
    if free is not None and reason != _TOO_LARGE:
        sizes.append(f"{format_bytes(free)} free there now")
    advice = ("raise the limit (ulimit -f) or write elsewhere, then run again"
              if reason == _TOO_LARGE else
              "free space on that disk or write elsewhere, then run again")
    message = (f"{what} into {folder} failed: {reason}"
               + (f"; {', '.join(sizes)}" if sizes else "") + f"; {advice}")
    return DiskFullError(message, folder=folder, reason=reason, needed=needed)


@contextmanager
def reporting_full_disk(folder: str | os.PathLike[str], *, needed: int | None = None,
                        what: str = "writing") -> Iterator[None]:
    """Re-raise a full disk (or too large a file) inside the block as a :class:`DiskFullError`.

    Any other error passes through unchanged, its traceback included (a bug stays a bug).

    Example::

        >>> with reporting_full_disk("out"):
        ...     pass
    """
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        error = full_disk_error(exc, folder, needed=needed, what=what)
        if error is None:
            raise
        raise error from exc
