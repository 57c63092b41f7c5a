"""Per-file checksums of a checkpoint folder, written into its manifest and checked on load.

The writer thread hashes every file of a finished save (SHA-256, read in large chunks;
hashing releases the GIL, so the training loop runs on meanwhile) and the manifest
lists ``{"file": {"bytes": n, "sha256": hex}}``. Loading recomputes them: a file
missing, cut short or with a single flipped byte raises :class:`CorruptCheckpointError`
naming it.

Example::

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "state.pt").write_bytes(b"weights")
    >>> files = file_digests(folder)
    >>> files["state.pt"]["bytes"]
    7
    >>> verify_files(folder, {"files": files})
    >>> _ = (folder / "state.pt").write_bytes(b"weightz")
    >>> try:
    ...     verify_files(folder, {"files": files})
    ... except CorruptCheckpointError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    state.pt does not match its checksum (the file is corrupt)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from lengthwise.train.checkpoint.errors import CorruptCheckpointError

__all__ = ["file_digests", "verify_files"]

_CHUNK = 8 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def file_digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes", "sha256"}}`` of every file under ``folder`` but ``skip``.

    Example::

        >>> import tempfile
        >>> file_digests(Path(tempfile.mkdtemp()))
        {}
    """
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name in skip:
            continue
        found[name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    return found


def verify_files(folder: Path, manifest: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    """Raise :class:`CorruptCheckpointError` unless every file of ``folder`` is listed and intact.

    The manifest must list files (``{"files": {name: {"bytes", "sha256"}}}``): one
    without is refused, and so is a file in the folder it does not list (but ``skip``,
    the manifest itself), a listed name that is not a plain path inside the folder, and
    a listed file that is missing, of another size or another SHA-256.
    """
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise CorruptCheckpointError(
            f"{folder}: the manifest lists no files with checksums; a checkpoint whose files "
            "cannot be checked is not loaded")
    for name, expected in files.items():
        parts = Path(name).parts if isinstance(name, str) else ()
        if not parts or Path(name).is_absolute() or ".." in parts or "\\" in name:
            raise CorruptCheckpointError(
                f"{folder}: the manifest lists {name!r}, which is not a file inside the folder")
        path = folder / name
        if (path.is_symlink() or not path.is_file()
                or not path.resolve().is_relative_to(folder.resolve())):
            raise CorruptCheckpointError(f"{folder}: {name} is missing or not a plain file")
        size = path.stat().st_size
        try:
            want_size, want_hash = int(expected["bytes"]), str(expected["sha256"])
        except (KeyError, TypeError, ValueError):
            raise CorruptCheckpointError(
                f"{folder}: the manifest's entry for {name} is damaged") from None
        if size != want_size:
            raise CorruptCheckpointError(
                f"{folder}: {name} is {size} bytes, the manifest says {want_size} "
                "(the file is cut short or was changed)"
            )
        try:
            actual = _sha256(path)
        except OSError as exc:
            raise CorruptCheckpointError(f"{folder}: {name} cannot be read: {exc}") from exc
        if actual != want_hash:
            raise CorruptCheckpointError(
                f"{folder}: {name} does not match its checksum (the file is corrupt)"
            )
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if name not in files and name not in skip and (path.is_symlink() or not path.is_dir()):
            raise CorruptCheckpointError(
                f"{folder}: {name} is not listed in the manifest (a file added after the save)")
