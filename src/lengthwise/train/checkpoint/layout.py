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
from pathlib import Path
from typing import Any

__all__ = ["latest_checkpoint", "list_checkpoints"]

MANIFEST = "COMPLETE"
FORMAT = "lengthwise-checkpoint"
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
        "format": FORMAT, "version": 1, "step": step, "backend": backend,
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
    """The complete checkpoint with the highest step under ``directory``, or ``None``.

    Example::

        >>> import tempfile
        >>> latest_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    found = list_checkpoints(directory)
    return found[-1] if found else None


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """A checkpoint folder and its manifest: ``path`` itself, or the latest one under it.

    Example::

        >>> import tempfile
        >>> try:
        ...     resolve_checkpoint(tempfile.mkdtemp())
        ... except FileNotFoundError:
        ...     print("none")
        none
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest is None:
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(
                f"{path} is neither a complete checkpoint nor a folder holding one"
            )
        path, manifest = latest, read_manifest(latest)
    assert manifest is not None
    return path, manifest
