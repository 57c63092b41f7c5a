"""Checkpoint folders published and removed so that a crash never leaves a half one "complete".

Example::

    >>> import tempfile
    >>> from lengthwise.train.checkpoint.layout import list_checkpoints, new_manifest, step_dirs
    >>> root = Path(tempfile.mkdtemp())
    >>> tmp, final = step_dirs(root, 1)
    >>> tmp.mkdir()
    >>> publish(tmp, final, new_manifest(1, "torch", 1, False, ["model"]))
    >>> [p.name for p in list_checkpoints(root)]
    ['step_1']
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from lengthwise.atomic import fsync_dir
from lengthwise.train.checkpoint.integrity import file_digests
from lengthwise.train.checkpoint.layout import MANIFEST, TMP_DIR, list_checkpoints

__all__ = ["prune", "publish", "remove_tree"]


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    path = directory / MANIFEST
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


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
    manifest = {**manifest, "files": file_digests(tmp, skip=(MANIFEST,))}
    _write_manifest(tmp, manifest)
    fsync_dir(tmp)
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        remove_tree(old)


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
