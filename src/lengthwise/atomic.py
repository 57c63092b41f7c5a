"""Files written whole or not at all: a hidden temporary file beside the target, renamed on success.

Every output file lengthwise writes (lengths, plans, reports, caches) goes through
:func:`atomic_path` or :func:`atomic_open`: the data is written to
``.NAME.PID-RANDOM.tmp.SUFFIX`` in the target's folder, pushed to the disk and renamed
over ``NAME`` only when the writer returned without an error. A failure (an exception,
a full disk) removes the temporary file and leaves an older ``NAME`` untouched; a crash
leaves at most a hidden ``.tmp`` file, never a complete-looking ``NAME``. The leading
dot also hides the temporary file from readers of folders (``pyarrow.dataset`` skips
names starting with ``.`` or ``_``).

Example::

    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "lengths.txt"
    >>> with atomic_open(target, "w") as fh:
    ...     _ = fh.write("3\\n5\\n")
    >>> target.read_text()
    '3\\n5\\n'
    >>> try:
    ...     with atomic_open(target, "w") as fh:
    ...         _ = fh.write("half")
    ...         raise OSError("disk full")
    ... except OSError:
    ...     pass
    >>> target.read_text(), sorted(p.name for p in target.parent.iterdir())
    ('3\\n5\\n', ['lengths.txt'])
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from lengthwise.errors import ConfigError

__all__ = ["atomic_open", "atomic_path", "fsync_dir", "replace_folder", "temporary_name"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Push a folder's entries (a rename, a new file) to the disk; a no-op where unsupported.

    Example::

        >>> import tempfile
        >>> fsync_dir(tempfile.mkdtemp())
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def temporary_name(path: str | os.PathLike[str]) -> Path:
    """A hidden, unique name beside ``path`` that keeps its suffix (writers that add one).

    Example::

        >>> name = temporary_name("out/plan.npz").name
        >>> name.startswith(".plan.npz.") and name.endswith(".tmp.npz")
        True
    """
    final = Path(path)
    return final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
                           f"{final.suffix}")


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to; it becomes ``path`` if the block succeeds.

    For writers that take a file name (``np.lib.format.open_memmap``, ``savefig``,
    ``pyarrow.parquet.write_table``). The block must create the file. A ``path`` that
    is a folder, or in a folder that does not exist, is a
    :class:`~lengthwise.errors.ConfigError` before anything is written.

    Example::

        >>> import tempfile, numpy as np
        >>> target = Path(tempfile.mkdtemp()) / "lengths.npy"
        >>> with atomic_path(target) as tmp:
        ...     np.save(tmp, np.array([3, 5]))
        >>> np.load(target).tolist()
        [3, 5]
    """
    final = Path(path)
    if final.is_dir():
        raise ConfigError(f"cannot write {final}: it is a folder; give a file name")
    if not final.parent.is_dir():
        raise ConfigError(f"cannot write {final}: there is no folder {final.parent}")
    tmp = temporary_name(final)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb", **kwargs: Any) -> Iterator[IO]:
    """``open(path, mode)`` for writing, through a temporary file renamed on success.

    Example::

        >>> import tempfile, json
        >>> target = Path(tempfile.mkdtemp()) / "state.json"
        >>> with atomic_open(target, "w", encoding="utf-8") as fh:
        ...     json.dump({"step": 3}, fh)
        >>> json.loads(target.read_text())
        {'step': 3}
    """
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes a whole file: mode must start with 'w', "
                         f"got {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as handle:
        yield handle
        handle.flush()


def replace_folder(tmp: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Rename the complete folder ``tmp`` to ``folder``; an older ``folder`` is moved aside
    first and removed after, so ``folder`` is always either the old one or the new one whole.

    Example::

        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "out").mkdir(); _ = (root / "out" / "old.txt").write_text("old")
        >>> (root / ".out.tmp").mkdir(); _ = (root / ".out.tmp" / "new.txt").write_text("new")
        >>> replace_folder(root / ".out.tmp", root / "out")
        >>> sorted(p.name for p in (root / "out").iterdir()), sorted(p.name for p in root.iterdir())
        (['new.txt'], ['out'])
    """

    tmp, folder = Path(tmp), Path(folder)
    old = None
    if folder.exists() or folder.is_symlink():
        old = temporary_name(folder.with_name(folder.name + ".old"))
        os.replace(folder, old)
    os.replace(tmp, folder)
    fsync_dir(folder.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
