"""A step log rolled back to the checkpoint a run resumes from, so each step is in it once.

A run stopped after its last checkpoint has logged steps that the resumed run
trains again. :func:`roll_back` rewrites the log (atomically: a temporary file
renamed over it) without the lines past the checkpoint's step, and appends those
lines to the side file :func:`rolled_back_path` (``NAME.rolled_back.jsonl``)
after a ``rolled_back`` line naming the step, so that readers of the log (pandas,
a W&B import, ``lengthwise doctor``) see every step once and nothing is lost. A
line is past the step when its ``key`` (``step``; ``optimizer_step`` in the
micro-batch log) is a larger number (``5.0``, as another tool may write it, is
step 5); a line that is not JSON (the half-written last line of a run that was
killed) goes to the side file too. Only the end of the log is read: from its last
step record at or before the step on. A log that is a symbolic link keeps it: the
file it points to is rewritten, and the side file is written beside the link.

Example::

    >>> import tempfile
    >>> log = Path(tempfile.mkdtemp()) / "train_log.jsonl"
    >>> _ = log.write_text('{"step": 1}\\n{"step": 2}\\n{"step": 3}\\n{"step": 4, "lo')
    >>> roll_back(log, 2).lines, log.read_text()
    (2, '{"step": 1}\\n{"step": 2}\\n')
    >>> rolled_back_path(log).read_text().splitlines()[1:]
    ['{"step": 3}', '{"step": 4, "lo']
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lengthwise.atomic import atomic_open

__all__ = ["ROLLED_BACK_EVENT", "RolledBack", "log_files", "roll_back", "rolled_back_path"]

#: the event that opens each batch of lines in the side file
ROLLED_BACK_EVENT = "rolled_back"
#: bytes read at a time, from the end of the log backwards
BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class RolledBack:
    """What :func:`roll_back` moved: ``lines`` lines into ``side_file`` (``None``: none)."""

    lines: int
    side_file: Path | None


def rolled_back_path(path: str | os.PathLike[str]) -> Path:
    """The side file that keeps the lines rolled back out of the log ``path``.

    Example::

        >>> rolled_back_path("run/train_log.jsonl").name
        'train_log.rolled_back.jsonl'
    """
    path = Path(path)
    return path.with_name(path.name.removesuffix(".jsonl") + ".rolled_back.jsonl")


def log_files(path: str | os.PathLike[str]) -> list[Path]:
    """The log ``path`` and its side file, those of them that exist and hold something.

    Example::

        >>> import tempfile
        >>> log = Path(tempfile.mkdtemp()) / "train_log.jsonl"
        >>> _ = log.write_text('{"step": 1}\\n')
        >>> [p.name for p in log_files(log)]
        ['train_log.jsonl']
    """
    return [p for p in (Path(path), rolled_back_path(path))
            if p.exists() and (not p.is_file() or p.stat().st_size > 0)]


def roll_back(path: str | os.PathLike[str], step: int, *, key: str = "step") -> RolledBack:
    """Move the lines of the log ``path`` past ``step`` (by their ``key``) to the side file.

    A log without such lines is left as it is (a last line without its newline gets
    one); a missing log moves nothing.
    """
    path = Path(path)
    if not path.is_file():
        return RolledBack(0, None)
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        cut = _tail_start(handle, size, step, key)
        handle.seek(cut)
        tail = handle.read().split(b"\n")
        if tail and not tail[-1]:
            tail.pop()  # the empty text after the last newline
        past = [_past(line, step, key) for line in tail]
        moved = [line for line, p in zip(tail, past, strict=True) if p]
        if not moved and (size == 0 or _ends_with_newline(handle, size)):
            return RolledBack(0, None)
        side = rolled_back_path(path)
        if moved:
            _append_side(side, moved, step, path)
        handle.seek(0)
        with atomic_open(os.path.realpath(path), "wb") as out:  # a link stays a link
            for block in _blocks(handle, cut):
                out.write(block)
            out.writelines(line + b"\n" for line, p in zip(tail, past, strict=True) if not p)
    return RolledBack(len(moved), side if moved else None)


def _tail_start(handle: IO[bytes], size: int, step: int, key: str) -> int:
    """The offset just after the log's last step record at or before ``step`` (0 if none)."""
    for offset, line in _reversed_lines(handle, size):
        row = _row(line)
        value = None if row is None or "event" in row else _step(row, key)
        if value is not None and value <= step:
            return min(size, offset + len(line) + 1)
    return 0


def _reversed_lines(handle: IO[bytes], size: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of every line of the file, the last first (without newlines)."""
    pos, rest = size, b""
    while pos > 0:
        n = min(BLOCK_BYTES, pos)
        pos -= n
        handle.seek(pos)
        chunk = handle.read(n) + rest
        parts = chunk.split(b"\n")
        rest = parts[0]  # it may go on in the block before
        end = pos + len(chunk)
        for part in reversed(parts[1:]):
            end -= len(part)
            yield end, part
            end -= 1  # the newline before it
    yield 0, rest


def _row(line: bytes) -> dict[str, Any] | None:
    """The JSON object on ``line``, else ``None``."""
    try:
        row = json.loads(line)
    except ValueError:  # also text that is not UTF-8
        return None
    return row if isinstance(row, dict) else None


def _past(line: bytes, step: int, key: str) -> bool:
    """Whether ``line`` goes to the side file: not JSON, or its ``key`` is past ``step``."""
    if not line.strip():
        return False
    row = _row(line)
    if row is None:
        return True
    value = _step(row, key)
    return value is not None and value > step


def _step(row: dict[str, Any], key: str) -> float | None:
    """The row's ``key`` as a number (an integer, or a float such as ``5.0``), else ``None``."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _ends_with_newline(handle: IO[bytes], size: int) -> bool:
    handle.seek(size - 1)
    return handle.read(1) == b"\n"


def _append_side(side: Path, moved: list[bytes], step: int, log: Path) -> None:
    """Append ``moved`` to the side file after a line saying what they were rolled back from."""
    head = {"event": ROLLED_BACK_EVENT, "step": step, "lines": len(moved), "log": log.name,
            "time": time.time()}
    with open(side, "ab") as fh:
        fh.write(json.dumps(head, allow_nan=False).encode() + b"\n")
        fh.writelines(line + b"\n" for line in moved)
        fh.flush()
        os.fsync(fh.fileno())


def _blocks(handle: IO[bytes], count: int) -> Iterator[bytes]:
    """The next ``count`` bytes of ``handle``, in blocks."""
    while count > 0:
        block = handle.read(min(BLOCK_BYTES, count))
        if not block:
            return
        count -= len(block)
        yield block
