"""Reader for TensorBoard event files, with no TensorBoard or TensorFlow install needed.

An event file is a sequence of records ``uint64 length, uint32 crc, payload,
uint32 crc``; each payload is an ``Event`` protocol buffer whose ``summary``
holds tagged values, either ``simple_value`` (PyTorch's ``add_scalar``) or a
one-element ``tensor`` (TensorFlow 2 ``tf.summary.scalar``). This module decodes
just those fields of the protobuf wire format. A truncated last record (a run
killed mid-write) is counted as malformed.

The loss tag is ``loss`` or ends in ``/loss`` (``train/loss``, as Hugging Face's
TensorBoard callback names it), skipping eval and validation tags;
``lr``/``learning_rate``, ``grad_norm`` and ``epoch`` come along, and the held-out
loss of the evaluations from the first of the ``EVAL_KEYS`` of
:mod:`~lengthwise.doctor.readers.columns` the files hold
(Hugging Face writes ``eval/loss``).

A directory's event files (run folders of one run, read in name order) are one
log. A file whose first loss step was already logged by an earlier file, and
whose events start after the earlier files' last one (by the events' wall
time), is a restart: a run started again into a new run folder, even at the
same step as the last one logged. Files whose wall times overlap (written at
the same time) and files whose steps interleave (no step repeated) are read by
their steps alone.

Example::

    >>> scalar_tags(b"")
    {}
"""

from __future__ import annotations

import struct
from pathlib import Path

from lengthwise.doctor.errors import LogNotFoundError, UnreadableLogError
from lengthwise.doctor.readers.columns import EVAL_KEYS, ColumnBuilder
from lengthwise.doctor.readers.wandb_log import missing_run_file
from lengthwise.doctor.runlog import RECORDS_PER_FILE
from lengthwise.errors import DataError

# TensorFlow DataType enum values used for scalars
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19
_EVAL_PREFIXES = ("eval", "val", "test", "valid")


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
    """All scalar series of one event file: tag -> [(step, value, record_number)].

    A record cut short at the end of the file is reported under the key ``""``.
    ``wall_times``, when given, receives the wall time of each event that holds scalars.
    """
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


def _pick_tag(tags: list[str], wanted: tuple[str, ...], explicit: bool) -> str | None:
    if explicit:
        return wanted[0] if wanted[0] in tags else None
    for want in wanted:
        if want in tags:
            return want
    for want in wanted:
        for tag in sorted(tags):
            low = tag.lower()
            if low.endswith("/" + want) and not low.startswith(_EVAL_PREFIXES):
                return tag
    return None


def read_tensorboard(path: Path, builder: ColumnBuilder, *, loss_key: str | None = None) -> None:
    """Read every event file under ``path`` into ``builder`` (files in name order)."""
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
    extra = {
        "lr": _pick_tag(tags, ("lr", "learning_rate"), False),
        "grad_norm": _pick_tag(tags, ("grad_norm",), False),
        "epoch": _pick_tag(tags, ("epoch",), False),
    }
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
    """Record numbers of the first loss row of each file that restarts the run.

    ``loss_rows`` are ``(step, value, record)`` in file order (record numbers
    offset by ``RECORDS_PER_FILE`` per file); ``spans`` each file's first and last
    event wall time. A file restarts the run when its first loss step was logged
    by an earlier file and it starts no earlier than the earlier files end.
    """
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
