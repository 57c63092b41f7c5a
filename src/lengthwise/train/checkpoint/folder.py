"""A checkpoint folder on disk: ``step_N/`` marked complete by a manifest of checksums.

A save writes ``step_N.tmp/``; once every file is written :func:`publish` hashes them
(SHA-256, read in large chunks; hashing releases the GIL, so the training loop runs on
meanwhile), adds the ``COMPLETE`` manifest listing ``{"file": {"bytes": n, "sha256":
hex}}`` and renames the folder to ``step_N/``, so a crash never leaves a half folder
"complete"; only folders with a valid manifest count. Loading recomputes the
checksums: a file missing, cut short or with a single flipped byte raises
:class:`CorruptCheckpointError` naming it. :func:`prune` removes what crashed saves
left and all but the newest ``keep`` checkpoints. The errors of a checkpoint that
could not be written or read live here too.

Example::

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> tmp, final = step_dirs(root, 1)
    >>> tmp.mkdir(); _ = (tmp / "state.pt").write_bytes(b"weights")
    >>> publish(tmp, final, new_manifest(1, "torch", 1, False, ["model"]))
    >>> [p.name for p in list_checkpoints(root)], latest_checkpoint(root).name
    (['step_1'], 'step_1')
    >>> files = read_manifest(final)["files"]
    >>> files["state.pt"]["bytes"]
    7
    >>> _ = (final / "state.pt").write_bytes(b"weightz")
    >>> try:
    ...     verify_files(final, {"files": files})
    ... except CorruptCheckpointError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    state.pt does not match its checksum (the file is corrupt)
    >>> issubclass(CorruptCheckpointError, CheckpointError)
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from lengthwise.atomic import atomic_open, replace_folder
from lengthwise.errors import LengthwiseError

__all__ = ["CheckpointError", "CheckpointLockedError", "CorruptCheckpointError",
           "LegacyCheckpointError", "file_digests", "latest_checkpoint", "list_checkpoints",
           "prune", "publish", "remove_tree", "verify_files"]


class CheckpointError(LengthwiseError, RuntimeError):
    """A checkpoint could not be written or read."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files are missing, cut short, fail their checksum or cannot be parsed."""


class CheckpointLockedError(CheckpointError):
    """Another checkpointer is writing into the same checkpoint folder."""


class LegacyCheckpointError(CheckpointError):
    """A checkpoint of an older format (versions 1 and 2, whose state is a pickle), which this
    version does not read: refused, nothing in it loaded."""


_CHUNK = 8 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def file_digests(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes", "sha256"}}`` of every file under ``folder`` but the manifest."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in files if p.relative_to(folder).as_posix() != MANIFEST}


def verify_files(folder: Path, manifest: dict[str, Any]) -> None:
    """Raise :class:`CorruptCheckpointError` unless every file of ``folder`` is listed and intact.

    The manifest must list files (``{"files": {name: {"bytes", "sha256"}}}``): one
    without is refused, and so is a file in the folder it does not list (but the
    manifest itself), a listed name that is not a plain path inside the folder, and
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
        if name not in files and name != MANIFEST and (path.is_symlink() or not path.is_dir()):
            raise CorruptCheckpointError(
                f"{folder}: {name} is not listed in the manifest (a file added after the save)")


MANIFEST = "COMPLETE"
FORMAT = "lengthwise-checkpoint"
#: the format version written: 3 keeps the training state as JSON (versions 1 and 2 pickled it)
VERSION = 3
STEP_DIR = re.compile(r"^step_(\d+)$")
TMP_DIR = re.compile(r"^step_(\d+)\.tmp$")


def step_dirs(directory: Path, step: int) -> tuple[Path, Path]:
    """The folder a save of ``step`` writes into, and the one it is renamed to when complete."""
    return directory / f"step_{step}.tmp", directory / f"step_{step}"


def new_manifest(step: int, backend: str, world_size: int, has_optimizer_state: bool,
                 contents: list[str]) -> dict[str, Any]:
    """The manifest that marks a checkpoint complete and says how to read it."""
    return {
        "format": FORMAT, "version": VERSION, "step": step, "backend": backend,
        "world_size": world_size, "time": time.time(),
        "has_optimizer_state": has_optimizer_state, "contents": contents,
    }


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the checkpoint folder ``path``, or ``None`` if it is not complete."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    return manifest


def is_older_format(manifest: dict[str, Any]) -> bool:
    """Whether a manifest is of an older format (versions 1 and 2), which this version does
    not read.
    """
    version = manifest.get("version", 1)
    return isinstance(version, int) and not isinstance(version, bool) and version < VERSION


def check_format(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse a checkpoint of another format version, naming it, before any of it is read."""
    version = manifest.get("version", 1)
    if is_older_format(manifest):
        raise LegacyCheckpointError(
            f"{path} is a checkpoint of an older lengthwise (format version {version}), which "
            f"this version does not read (it reads version {VERSION}); nothing in it was loaded")
    if version != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version!r} is not one this "
                              f"lengthwise reads ({VERSION}); use the version that wrote it")


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``directory``, oldest step first.

    Example::

        >>> import tempfile
        >>> list_checkpoints(tempfile.mkdtemp())
        []
    """
    return [path for _, path in _step_folders(Path(directory))
            if path.is_dir() and read_manifest(path) is not None]


def _step_folders(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_N`` entry under ``root``, oldest step first."""
    if not root.is_dir():
        return []
    return sorted((int(match.group(1)), child) for child in root.iterdir()
                  if (match := STEP_DIR.match(child.name)))


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``directory`` whose files verify, or ``None``.

    A checkpoint whose files fail their checksums is skipped with a ``UserWarning``
    naming the file, and the next older one is tried.

    Example::

        >>> import tempfile
        >>> latest_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    # step folders with a manifest file, valid or not
    marked = [path for _, path in _step_folders(Path(directory)) if (path / MANIFEST).is_file()]
    for path in reversed(marked):
        manifest = read_manifest(path)
        if manifest is not None and is_older_format(manifest):
            return path  # complete; loading it says that this version does not read it
        try:
            if manifest is None:
                raise CorruptCheckpointError(f"{path / MANIFEST} is damaged")
            verify_files(path, manifest)
        except CorruptCheckpointError as exc:
            warnings.warn(f"skipping a corrupt checkpoint: {exc}", UserWarning, stacklevel=2)
            continue
        return path
    return None


def previous_good(path: Path) -> str:
    """Where to resume instead of the broken checkpoint ``path``: a sentence for an error."""
    match = STEP_DIR.match(path.name)
    step = int(match.group(1)) if match else None
    # every step folder: one without a readable manifest fails verify_files
    for older_step, older in reversed(_step_folders(path.parent)):
        if older == path or (step is not None and older_step >= step):
            continue
        try:
            verify_files(older, read_manifest(older) or {})
        except CorruptCheckpointError:
            continue
        return f"the previous good checkpoint is step {older_step} ({older})"
    return "no earlier checkpoint in the same folder verifies"


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """A verified checkpoint folder and its manifest: ``path``, or the latest good one under it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint path {path} does not exist")
    manifest = read_manifest(path)
    if manifest is None:
        if (path / MANIFEST).is_file():
            raise CorruptCheckpointError(
                f"{path / MANIFEST} is not a valid checkpoint manifest (the file is damaged); "
                f"{previous_good(path)}"
            )
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(
                f"{path} is neither a complete checkpoint nor a folder holding one "
                "whose files verify"
            )
        path, manifest = latest, read_manifest(latest)
        assert manifest is not None
        check_format(path, manifest)
        return path, manifest
    check_format(path, manifest)
    try:
        verify_files(path, manifest)
    except CorruptCheckpointError as exc:  # the error names the file and the previous good
        raise CorruptCheckpointError(f"{exc}; {previous_good(path)}") from None
    return path, manifest


def remove_tree(path: Path) -> None:
    """Remove a checkpoint folder, its manifest first so it stops counting as complete.

    A link is removed itself: the folder it points to, maybe outside the run, is kept.
    """
    if path.is_symlink():
        path.unlink()
        return
    (path / MANIFEST).unlink(missing_ok=True)  # first stop it counting as complete
    shutil.rmtree(path, ignore_errors=True)


def publish(tmp: Path, final: Path, manifest: dict[str, Any]) -> None:
    """Mark ``tmp`` complete and rename it to ``final`` (replacing an older ``final``).

    The manifest gets the size and SHA-256 of every file in ``tmp``. Call it from the
    writer thread: hashing reads every file back.
    """
    manifest = {**manifest, "files": file_digests(tmp)}  # before the manifest's own file
    with atomic_open(tmp / MANIFEST, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
    replace_folder(tmp, final)


def prune(directory: Path, step: int, keep: int | None) -> None:
    """Remove folders left by crashed saves before ``step`` and all but the ``keep`` newest."""
    if not directory.is_dir():
        return
    for child in directory.iterdir():
        match = TMP_DIR.match(child.name)
        if match and int(match.group(1)) < step:  # left by a crashed save
            remove_tree(child)
    if keep is not None:
        for old in list_checkpoints(directory)[:-keep]:
            remove_tree(old)
