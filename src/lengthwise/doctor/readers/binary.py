"""Readers for binary run files: TensorBoard event files and W&B run files, with no network.

Of an event file's ``Event`` protocol buffers just the scalars are decoded; a directory's
event files are one log. A ``.wandb`` file's ``Record`` messages are decoded with the
``wandb`` package's protobuf classes (``pip install "lengthwise[wandb]"``); each history
record is one row.

Example::

    >>> scalar_tags(b"")
    {}
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

from lengthwise.doctor.errors import LogNotFoundError, UnreadableLogError
from lengthwise.doctor.readers.columns import EVAL_KEYS, ColumnBuilder, find_field
from lengthwise.doctor.runlog import RECORDS_PER_FILE
from lengthwise.errors import DataError

# TensorFlow DataType enum values used for scalars
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19


def event_files(path: Path) -> list[Path]:
    """The event files of a file or directory (recursive), in name order."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*tfevents*") if p.is_file())
    if not files:
        raise LogNotFoundError(missing_run_file(path) or (
            f"{path}: directory holds no TensorBoard event file (*tfevents*)"))
    return files


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, object]]:
    """Decode one protobuf message into ``(field, wire_type, value)`` triples."""
    out: list[tuple[int, int, object]] = []
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise DataError(f"unsupported wire type {wire}")
        out.append((field, wire, value))
    return out


def _tensor_scalar(buf: bytes) -> float | None:
    dtype = _DT_FLOAT
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 0:
            dtype = int(value)  # type: ignore[arg-type]
    for field, wire, value in _fields(buf):
        if field == 4 and isinstance(value, bytes) and value:  # tensor_content
            fmt = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q"}.get(dtype)
            if fmt is not None and len(value) >= struct.calcsize(fmt):
                return float(struct.unpack_from(fmt, value)[0])
        if field == 5:  # float_val
            if wire == 5 or (wire == 2 and len(value) >= 4):  # type: ignore[arg-type]
                return float(struct.unpack_from("<f", value)[0])  # type: ignore[arg-type]
        if field == 6:  # double_val
            if wire == 1 or (wire == 2 and len(value) >= 8):  # type: ignore[arg-type]
                return float(struct.unpack_from("<d", value)[0])  # type: ignore[arg-type]
        if field in (7, 10) and wire == 0:  # int_val / int64_val
            return float(value)  # type: ignore[arg-type]
    return None


def scalar_tags(
    data: bytes, wall_times: list[float] | None = None,
) -> dict[str, list[tuple[int, float, int]]]:
    """All scalar series of one event file: tag -> [(step, value, record_number)], a record cut
    short under the key ``""``; ``wall_times`` receives the wall time of each scalar event."""
    series: dict[str, list[tuple[int, float, int]]] = {}
    pos, n, record = 0, len(data), 0
    while pos < n:
        record += 1
        if pos + 12 > n:
            series.setdefault("", []).append((0, 0.0, record))
            break
        (length,) = struct.unpack_from("<Q", data, pos)
        start = pos + 12
        if start + length + 4 > n:
            series.setdefault("", []).append((0, 0.0, record))
            break
        payload = data[start : start + length]
        pos = start + length + 4
        try:
            _scalars_of_event(payload, record, series, wall_times)
        except (ValueError, IndexError, struct.error):
            series.setdefault("", []).append((0, 0.0, record))
    return series


def _scalars_of_event(
    payload: bytes, record: int, series: dict, wall_times: list[float] | None = None,
) -> None:
    step = 0
    summary = None
    wall = 0.0
    for field, wire, value in _fields(payload):
        if field == 1 and wire == 1:
            wall = float(struct.unpack("<d", value)[0])  # type: ignore[arg-type]
        elif field == 2:
            step = int(value)  # type: ignore[arg-type]
            if step >= 1 << 63:
                step -= 1 << 64
        elif field == 5:
            summary = value
    if summary is None:
        return
    if wall_times is not None:
        wall_times.append(wall)
    for field, _wire, value in _fields(summary):  # type: ignore[arg-type]
        if field != 1:
            continue
        tag = ""
        number: float | None = None
        for vf, vw, vv in _fields(value):  # type: ignore[arg-type]
            if vf == 1:
                tag = bytes(vv).decode("utf-8", "replace")  # type: ignore[arg-type]
            elif vf == 2 and vw == 5:
                number = float(struct.unpack_from("<f", vv)[0])  # type: ignore[arg-type]
            elif vf == 8 and number is None:
                number = _tensor_scalar(vv)  # type: ignore[arg-type]
        if tag and number is not None:
            series.setdefault(tag, []).append((step, number, record))


def _pick_tag(tags: list[str], wanted: tuple[str, ...], explicit: bool = False) -> str | None:
    ordered = sorted(tags)
    i = find_field(ordered, wanted, suffix=not explicit)
    return None if i is None else ordered[i]


def read_tensorboard(path: Path, builder: ColumnBuilder, *, step_key: str | None = None,
                     loss_key: str | None = None) -> None:
    """Read every event file under ``path`` into ``builder`` (files in name order)."""
    builder.use_keys(step_key="step", loss_key="loss")
    files = event_files(path)
    merged: dict[str, list[tuple[int, float, int]]] = {}
    spans: list[tuple[float, float]] = []
    offset = 0
    for file in files:
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise UnreadableLogError(f"{file}: cannot be read ({exc})") from exc
        times: list[float] = []
        for tag, rows in scalar_tags(data, times).items():
            merged.setdefault(tag, []).extend((s, v, r + offset) for s, v, r in rows)
        spans.append((min(times), max(times)) if times else (0.0, 0.0))
        offset += RECORDS_PER_FILE
    broken = merged.pop("", [])
    for _, _, record in broken:
        builder.summary.add_malformed(record)
    builder.summary.truncated = bool(broken)
    tags = list(merged)
    loss_tag = _pick_tag(tags, (loss_key,) if loss_key else ("loss", "train_loss"), bool(loss_key))
    if not tags:
        raise UnreadableLogError(
            f"{path}: no scalar could be read from the event files: they are corrupt or not "
            f"TensorBoard event files ({len(broken)} broken record(s))")
    if loss_tag is None:
        shown = ", ".join(sorted(tags)[:12])
        what = repr(loss_key) if loss_key else "loss"
        raise UnreadableLogError(f"{path}: no {what} scalar tag in the event files (tags: {shown})")
    extra = {"lr": _pick_tag(tags, ("lr", "learning_rate")),
             "grad_norm": _pick_tag(tags, ("grad_norm",)), "epoch": _pick_tag(tags, ("epoch",))}
    lookups = {k: {s: v for s, v, _ in merged[t]} for k, t in extra.items() if t is not None}
    rows = []
    numbers = []
    for step, value, record in merged[loss_tag]:
        row: dict[str, float] = {"step": step, "loss": value}
        for name, table in lookups.items():
            if step in table:
                row[name] = table[step]
        rows.append(row)
        numbers.append(record)
    builder.summary.lines = sum(len(v) for v in merged.values()) + len(broken)
    builder.summary.other_rows = builder.summary.lines - len(rows) - len(broken)
    builder.loss_label = loss_tag
    builder.add(rows, numbers)
    eval_tag = next((t for t in EVAL_KEYS if t in merged), None)
    for step, value, _ in merged.get(eval_tag or "", []):
        builder.add_eval(step, value)
    for record in restart_records(merged[loss_tag], spans):
        builder.mark_restart(record)


def restart_records(
    loss_rows: list[tuple[int, float, int]], spans: list[tuple[float, float]],
) -> list[int]:
    """Record numbers of the first loss row of each file that restarts the run: its first loss
    step was logged by an earlier file, and it starts no earlier than the earlier files end
    (``spans``: each file's first and last event wall time)."""
    seen: set[int] = set()
    out = []
    end = -float("inf")
    by_file: dict[int, list[tuple[int, float, int]]] = {}
    for row in loss_rows:
        by_file.setdefault(row[2] // RECORDS_PER_FILE, []).append(row)
    for index in sorted(by_file):
        rows = by_file[index]
        first_wall, last_wall = spans[index]
        if seen and rows[0][0] in seen and first_wall >= end:
            out.append(rows[0][2])
        seen.update(s for s, _, _ in rows)
        end = max(end, last_wall)
    return out


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
    """One dict per history record of the ``.wandb`` file at ``path`` (``cut`` gets ``True``
    appended when the file ends in a partial record)."""
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


def read_wandb(path: Path, builder: ColumnBuilder, *, step_key: str | None = None,
               loss_key: str | None = None) -> None:
    """Feed the history rows of the W&B run at ``path`` to ``builder``."""
    file = wandb_file(path)
    if step_key is None:
        builder.use_keys(step_key="step", loss_key=None)
    builder.summary.format = "wandb"
    cut: list[bool] = []
    builder.summary.lines = builder.add_all(history_rows(file, cut))
    builder.summary.truncated = bool(cut)
