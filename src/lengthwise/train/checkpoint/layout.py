"""Where checkpoints live on disk: ``step_N/`` folders marked complete by a manifest.

A save writes ``step_N.tmp/``, adds the ``COMPLETE`` manifest and renames the
folder to ``step_N/``; only folders with a valid manifest count.

Example::

    >>> import tempfile
    >>> tmp, final = step_dirs(Path("run"), 7)
    >>> tmp.name, final.name, list_checkpoints(tempfile.mkdtemp())
    ('step_7.tmp', 'step_7', [])
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

from lengthwise.train.checkpoint.errors import (
    CheckpointError,
    CorruptCheckpointError,
    LegacyCheckpointError,
)
from lengthwise.train.checkpoint.integrity import verify_files

__all__ = ["latest_checkpoint", "list_checkpoints"]

MANIFEST = "COMPLETE"
FORMAT = "lengthwise-checkpoint"
#: the format version written: 3 keeps the training state as JSON (versions 1 and 2 pickled it)
VERSION = 3
STEP_DIR = re.compile(r"^step_(\d+)$")
TMP_DIR = re.compile(r"^step_(\d+)\.tmp$")


def step_dirs(directory: Path, step: int) -> tuple[Path, Path]:
    """The folder a save of ``step`` writes into, and the one it is renamed to when complete.

    Example::

        >>> [p.as_posix() for p in step_dirs(Path("ckpt"), 2)]
        ['ckpt/step_2.tmp', 'ckpt/step_2']
    """
    return directory / f"step_{step}.tmp", directory / f"step_{step}"


def new_manifest(step: int, backend: str, world_size: int, has_optimizer_state: bool,
                 contents: list[str]) -> dict[str, Any]:
    """The manifest that marks a checkpoint complete and says how to read it.

    Example::

        >>> new_manifest(5, "torch", 1, False, ["model"])["format"]
        'lengthwise-checkpoint'
    """
    return {
        "format": FORMAT, "version": VERSION, "step": step, "backend": backend,
        "world_size": world_size, "time": time.time(),
        "has_optimizer_state": has_optimizer_state, "contents": contents,
    }


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the checkpoint folder ``path``, or ``None`` if it is not complete.

    Example::

        >>> read_manifest(Path("no-such-folder")) is None
        True
    """
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

    Example::

        >>> is_older_format({"version": 2}), is_older_format({"version": VERSION})
        (True, False)
    """
    version = manifest.get("version", 1)
    return isinstance(version, int) and not isinstance(version, bool) and version < VERSION


def check_format(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse a checkpoint of another format version, naming it, before any of it is read.

    Example::

        >>> try:
        ...     check_format(Path("step_3"), {"version": 2})
        ... except LegacyCheckpointError as exc:
        ...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
        step_3 is a checkpoint of an older lengthwise (format version 2), which this version
        does not read (it reads version 3); nothing in it was loaded
    """
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
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir() and read_manifest(child) is not None:
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``directory`` whose files verify, or ``None``.

    A checkpoint whose files fail their checksums is skipped with a ``UserWarning``
    naming the file, and the next older one is tried.

    Example::

        >>> import tempfile
        >>> latest_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    root = Path(directory)
    if not root.is_dir():
        return None
    marked = []  # step folders with a manifest file, valid or not
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / MANIFEST).is_file():
            marked.append((int(match.group(1)), child))
    for _, path in sorted(marked, reverse=True):
        manifest = read_manifest(path)
        if manifest is not None and is_older_format(manifest):
            return path  # complete; loading it says that this version does not read it
        try:
            if manifest is None:
                raise CorruptCheckpointError(f"{path / MANIFEST} is damaged")
            verify_files(path, manifest, skip=(MANIFEST,))
        except CorruptCheckpointError as exc:
            warnings.warn(f"skipping a corrupt checkpoint: {exc}", UserWarning, stacklevel=2)
            continue
        return path
    return None


def previous_good(path: Path) -> str:
    """Where to resume instead of the broken checkpoint ``path``: a sentence for an error.

    Example::

        >>> import tempfile
        >>> previous_good(Path(tempfile.mkdtemp()) / "step_4")
        'no earlier checkpoint in the same folder verifies'
    """
    match = STEP_DIR.match(path.name)
    step = int(match.group(1)) if match else None
    for older in reversed(list_checkpoints(path.parent)):
        older_step = int(STEP_DIR.match(older.name).group(1))  # type: ignore[union-attr]
        if older == path or (step is not None and older_step >= step):
            continue
        try:
            verify_files(older, read_manifest(older) or {}, skip=(MANIFEST,))
        except CorruptCheckpointError:
            continue
        return f"the previous good checkpoint is step {older_step} ({older})"
    return "no earlier checkpoint in the same folder verifies"


def check_files(path: Path, manifest: dict[str, Any]) -> None:
    """Verify the files of checkpoint ``path``; the error names the file and the previous good.

    Example::

        >>> import tempfile
        >>> from lengthwise.train.checkpoint.integrity import file_digests
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "state.pt").write_bytes(b"weights")
        >>> check_files(folder, {"files": file_digests(folder)})
    """
    try:
        verify_files(path, manifest, skip=(MANIFEST,))
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{exc}; {previous_good(path)}") from None


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """A verified checkpoint folder and its manifest: ``path``, or the latest good one under it.

    Example::

        >>> import tempfile
        >>> try:
        ...     resolve_checkpoint(tempfile.mkdtemp())
        ... except FileNotFoundError:
        ...     print("none")
        none
    """
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
    check_files(path, manifest)
    return path, manifest
