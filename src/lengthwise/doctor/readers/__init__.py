"""Readers: a log file, directory or list of row dicts -> :class:`~lengthwise.doctor.runlog.RunLog`.

Formats: JSON lines (``.jsonl``, ``.log``, any name; gzip detected by content),
a single JSON document (``trainer_state.json`` or an array of rows), CSV
(``.csv``/``.tsv``, W&B exports), TensorBoard event files or directories and
W&B run files or run folders (``wandb/run-*``; needs the ``wandb`` extra).

Example::

    >>> log = read_records([{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}])
    >>> log.loss.tolist()
    [3.0, 2.0]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lengthwise.doctor.errors import EmptyLogError, LogNotFoundError
from lengthwise.doctor.readers.binary import is_wandb_path, read_tensorboard, read_wandb
from lengthwise.doctor.readers.columns import ColumnBuilder
from lengthwise.doctor.readers.text import (
    looks_like_document,
    read_csv,
    read_document,
    read_jsonl,
)
from lengthwise.doctor.runlog import RunLog

__all__ = ["read_log", "read_records", "ColumnBuilder"]

_CSV_SUFFIXES = (".csv", ".tsv", ".csv.gz", ".tsv.gz")


#: the reader of each format
READERS = {"wandb": read_wandb, "tensorboard": read_tensorboard, "csv": read_csv,
           "document": read_document, "jsonl": read_jsonl}


def detect_format(path: Path) -> str:
    """``"wandb"``, ``"tensorboard"``, ``"csv"``, ``"document"`` or ``"jsonl"`` for a path."""
    name = path.name.lower()
    if is_wandb_path(path):
        return "wandb"
    if path.is_dir() or "tfevents" in name:
        return "tensorboard"
    if name.endswith(_CSV_SUFFIXES):
        return "csv"
    if looks_like_document(path):
        return "document"
    return "jsonl"


def read_log(source: str | os.PathLike[str], *, step_key: str | None = None,
             loss_key: str | None = None) -> RunLog:
    """Read one log file or directory; ``step_key``/``loss_key`` name the fields (None: found
    among ``step``, ``loss`` and common aliases)."""
    path = Path(source)
    if not path.exists():
        raise LogNotFoundError(f"{path}: no such file or directory")
    if path.is_file() and path.stat().st_size == 0:
        raise EmptyLogError(f"{path}: is empty")
    fmt = detect_format(path)
    builder = ColumnBuilder(str(path), step_key=step_key, loss_key=loss_key, fmt=fmt)
    READERS[fmt](path, builder, step_key=step_key, loss_key=loss_key)
    if builder.summary.lines == 0 and not builder.summary.malformed:
        raise EmptyLogError(f"{path}: is empty")
    return builder.build()


def read_records(records: Iterable[Mapping[str, Any]], *, step_key: str | None = None,
                 loss_key: str | None = None, source: str = "<records>") -> RunLog:
    """Build a :class:`RunLog` from in-memory row dicts (as a training loop would log them)."""
    builder = ColumnBuilder(source, step_key=step_key, loss_key=loss_key, fmt="records")
    rows = [r if isinstance(r, dict) else dict(r) if isinstance(r, Mapping) else r
            for r in records]
    if not rows:
        raise EmptyLogError(f"{source}: no records")
    builder.summary.lines = builder.add_all(rows)
    return builder.build()
