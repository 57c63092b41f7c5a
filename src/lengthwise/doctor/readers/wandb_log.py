"""W&B run files (``run-*.wandb``, offline or synced): the logged history rows, no network.

A ``.wandb`` file is W&B's transaction log: a 7-byte header (``:W&B``, a
magic number and a version byte) and then LevelDB log framing, 32 KiB blocks
of fragments each with a 7-byte header (CRC, little-endian length, type:
1 whole, 2 first, 3 middle, 4 last; a block's last bytes are padding when
fewer than 7 remain). Each record is a ``wandb.proto`` ``Record`` message,
decoded here with the ``wandb`` package's own protobuf classes
(``pip install "lengthwise[wandb]"``). Every history record is one row: its
items by key (nested keys joined with ``/``), and ``step`` the trainer's
``train/global_step`` when logged (the Hugging Face integration logs it),
else W&B's own step.

Accepted paths: the ``.wandb`` file, its run folder (``wandb/run-*`` or
``wandb/offline-run-*``), or a ``wandb`` folder holding ``latest-run`` or a
single run.

Example::

    >>> from pathlib import Path
    >>> is_wandb_path(Path("wandb/run-20240101_000000-abc/run-abc.wandb"))
    True
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lengthwise.doctor.errors import UnreadableLogError
from lengthwise.doctor.readers.columns import ColumnBuilder

BLOCK = 32 * 1024
HEADER = 7
MAGIC = b":W&B"
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
INSTALL = 'reading W&B run files needs the wandb package: pip install "lengthwise[wandb]"'
#: trainer step fields preferred over W&B's own step counter
TRAINER_STEP_KEYS = ("train/global_step", "global_step", "trainer/global_step")
#: a W&B run folder's name (``run-20240101_000000-abc``, ``offline-run-...``)
RUN_FOLDER_NAME = re.compile(r"(offline-)?run-\d{8}_\d{6}-\w+")
#: files W&B writes into a run folder beside the ``.wandb`` file
RUN_FOLDER_FILES = ("files/wandb-metadata.json", "files/wandb-summary.json",
                    "logs/debug-internal.log", "logs/debug.log")


def is_wandb_path(path: Path) -> bool:
    """True for a ``.wandb`` file or a folder that holds one (or W&B run folders)."""
    if path.name.endswith(".wandb"):
        return True
    if not path.is_dir():
        return False
    return any(path.glob("*.wandb")) or any(path.glob("*run-*/*.wandb"))


def run_folders(path: Path) -> list[Path]:
    """``path`` when it is a W&B run folder, else the run folders it holds (by their name,
    ``run-*`` / ``offline-run-*``, or the files W&B writes beside the ``.wandb`` file).

    >>> run_folders(Path("no-such-folder"))
    []
    """
    if not path.is_dir():
        return []
    if _is_run_folder(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and _is_run_folder(p))


def _is_run_folder(path: Path) -> bool:
    return bool(RUN_FOLDER_NAME.fullmatch(path.name)) or any(
        (path / mark).is_file() for mark in RUN_FOLDER_FILES)


def missing_run_file(path: Path) -> str | None:
    """The error for a W&B run folder (or a folder of them) without its ``.wandb`` file;
    None when ``path`` holds no W&B run folder."""
    runs = run_folders(path)
    if not runs:
        return None
    if runs == [path]:
        return (f"{path}: a W&B run folder without its .wandb file (run-<id>.wandb, the run's "
                "history, which the doctor reads): copy the whole run folder, .wandb file included")
    names = ", ".join(p.name for p in runs[:3]) + (", ..." if len(runs) > 3 else "")
    return (f"{path}: holds {len(runs)} W&B run folder(s) ({names}) but no .wandb file "
            "(run-<id>.wandb, the run's history, which the doctor reads): copy the whole run "
            "folder, .wandb file included")


def wandb_file(path: Path) -> Path:
    """The ``.wandb`` file a path names (the file, its run folder or the ``wandb`` folder)."""
    if path.is_file():
        return path
    own = sorted(path.glob("*.wandb"))
    if len(own) == 1:
        return own[0]
    latest = path / "latest-run"
    if latest.is_dir() and len(list(latest.glob("*.wandb"))) == 1:
        return next(latest.glob("*.wandb"))
    runs = sorted(path.glob("*run-*/*.wandb"))
    if len(runs) == 1 and not own:
        return runs[0]
    found = own or runs
    raise UnreadableLogError(
        f"{path}: holds {len(found)} W&B run files ({', '.join(p.parent.name for p in found[:3])}"
        f"{', ...' if len(found) > 3 else ''}); name one run folder"
    )


def records(data: bytes, source: str) -> tuple[list[bytes], bool]:
    """The whole records of a ``.wandb`` file's bytes (fragments joined), and whether it ends
    cut short (a run still writing): the cut record is left out."""
    if data[:4] != MAGIC:
        raise UnreadableLogError(f"{source}: not a W&B run file (no :W&B header)")
    out: list[bytes] = []
    pos, parts = HEADER, []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if kind == 0 and length == 0:
            pos += left  # zero padding to the end of the block
            continue
        if pos + HEADER + length > len(data):
            return out, True
        body = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            parts = [body]
        elif kind == MIDDLE:
            parts.append(body)
        elif kind == LAST:
            parts.append(body)
            out.append(b"".join(parts))
            parts = []
        else:
            raise UnreadableLogError(f"{source}: damaged W&B record framing at byte {pos}")
    return out, bool(parts) or any(data[pos:])  # a fragment or header left unfinished


def _record_class() -> Any:
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as exc:
        raise UnreadableLogError(INSTALL) from exc
    return wandb_internal_pb2.Record


def history_rows(path: Path, cut: list[bool] | None = None) -> Iterator[dict[str, Any]]:
    """One dict per history record of the ``.wandb`` file at ``path``.

    ``cut``, when given, gets ``True`` appended if the file ends in a partial
    record (a run still writing).
    """
    record_class = _record_class()
    source = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableLogError(f"{source}: cannot be read ({exc})") from exc
    raws, truncated = records(data, source)
    if cut is not None and truncated:
        cut.append(True)
    for raw in raws:
        rec = record_class()
        try:
            rec.ParseFromString(raw)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, one line
            raise UnreadableLogError(f"{source}: a record does not decode ({exc})") from exc
        if rec.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in rec.history.item:
            key = "/".join(item.nested_key) if item.nested_key else item.key
            try:
                row[key] = json.loads(item.value_json)
            except ValueError:
                continue
        if "epoch" not in row and "train/epoch" in row:
            row["epoch"] = row["train/epoch"]
        wandb_step = rec.history.step.num if rec.history.HasField("step") else row.get("_step")
        trainer = next((row[k] for k in TRAINER_STEP_KEYS if isinstance(row.get(k), int | float)),
                       None)
        row["step"] = trainer if trainer is not None else wandb_step
        yield row


def read_wandb(path: Path, builder: ColumnBuilder, *, step_key: str | None) -> None:
    """Feed the history rows of the W&B run at ``path`` to ``builder``."""
    file = wandb_file(path)
    if step_key is None:
        builder.use_keys(step_key="step", loss_key=None)
    builder.summary.format = "wandb"
    chunk: list[dict[str, Any]] = []
    line = 0
    cut: list[bool] = []
    for row in history_rows(file, cut):
        line += 1
        chunk.append(row)
        if len(chunk) == 50_000:
            builder.add(chunk, range(line - len(chunk) + 1, line + 1))
            chunk = []
    if chunk:
        builder.add(chunk, range(line - len(chunk) + 1, line + 1))
    builder.summary.lines = line
    builder.summary.truncated = bool(cut)
