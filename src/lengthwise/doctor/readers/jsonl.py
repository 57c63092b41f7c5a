"""Streaming reader for JSON-lines logs (plain or gzip), and whole-file JSON logs.

Lines are read in blocks of a few MB and each block is parsed with a single
``loads`` call on ``[line,line,...]``; a block that fails (a malformed or
truncated line, a NaN literal the fast parser refuses) is parsed line by line
so that exactly the bad lines are skipped and counted. ``orjson`` is used when
installed (about three times faster), the standard library otherwise.

A file holding one JSON document is read too: a Hugging Face
``trainer_state.json`` (its ``log_history``) or a JSON array of row objects.

Example::

    >>> import gzip, pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl.gz"
    >>> _ = p.write_bytes(gzip.compress(b'{"step": 1, "loss": 2.5}\\nnot json\\n'))
    >>> b = ColumnBuilder(str(p), fmt="jsonl")
    >>> read_jsonl(p, b)
    >>> b.summary.malformed, b.summary.malformed_lines
    (1, [2])
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from lengthwise.doctor.errors import UnreadableLogError
from lengthwise.doctor.readers.columns import ColumnBuilder
from lengthwise.doctor.runlog import InputSummary

#: bytes of text parsed per block
BLOCK_BYTES = 1 << 22
#: whole-document JSON files larger than this are not loaded into memory
MAX_DOCUMENT_BYTES = 1 << 29
GZIP_MAGIC = b"\x1f\x8b"
#: decompressed bytes read at a time from gzip logs
GZIP_CHUNK = 1 << 16


def _fast_loads() -> Callable[[bytes], Any]:
    try:
        import orjson  # optional accelerator
    except ImportError:
        return json.loads
    return orjson.loads


def open_log(path: Path) -> IO[bytes]:
    """Open a log for binary reading, transparently gunzipping it."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except IsADirectoryError as exc:
        raise UnreadableLogError(f"{path}: is a directory with no TensorBoard event file") from exc
    except PermissionError as exc:
        raise UnreadableLogError(f"{path}: permission denied") from exc
    except OSError as exc:
        raise UnreadableLogError(f"{path}: cannot be opened ({exc.strerror or exc})") from exc
    if handle.read(2) == GZIP_MAGIC:
        handle.close()
        return gzip.open(path, "rb")
    handle.seek(0)
    return handle


def _line_blocks(handle: IO[bytes], summary: InputSummary) -> Iterator[list[bytes]]:
    """Blocks of complete lines; a stream that breaks off (truncated gzip) ends early."""
    if not isinstance(handle, gzip.GzipFile):
        while True:
            lines = handle.readlines(BLOCK_BYTES)
            if not lines:
                return
            yield lines
    rest = b""
    while True:
        try:  # read1: one block, so the rows before a break are kept
            chunk = handle.read1(GZIP_CHUNK)
        except (EOFError, zlib.error, OSError):
            summary.truncated = True
            chunk = b""
        if not chunk:
            if rest:
                yield [rest]
            return
        lines = (rest + chunk).splitlines(keepends=True)
        rest = lines.pop() if not lines[-1].endswith(b"\n") else b""
        if lines:
            yield lines


def read_jsonl(path: Path, builder: ColumnBuilder) -> None:
    """Read a JSON-lines log into ``builder``, block by block."""
    fast = _fast_loads()
    line_no = 0
    with open_log(path) as handle:
        try:
            for lines in _line_blocks(handle, builder.summary):
                if line_no == 0 and lines[0].startswith(b"\xef\xbb\xbf"):
                    lines[0] = lines[0][3:]
                first = line_no + 1
                line_no += len(lines)
                builder.summary.lines = line_no
                objs = None
                try:
                    objs = fast(b"[" + b",".join(lines) + b"]")
                    if not isinstance(objs, list) or len(objs) != len(lines):
                        objs = None
                except ValueError:
                    objs = None
                if objs is not None:
                    builder.add(objs, range(first, first + len(lines)))
                else:
                    _add_line_by_line(lines, first, builder, fast)
        except (EOFError, zlib.error, OSError) as exc:
            raise UnreadableLogError(f"{path}: corrupt or unreadable ({exc})") from exc
    if builder.summary.truncated and line_no == 0:
        raise UnreadableLogError(f"{path}: corrupt or unreadable (the gzip stream breaks off)")


def _add_line_by_line(
    lines: list[bytes], first: int, builder: ColumnBuilder, fast: Callable[[bytes], Any]
) -> None:
    objs: list[Any] = []
    numbers: list[int] = []
    for offset, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            value = fast(raw)
        except ValueError:
            try:
                value = json.loads(raw)
            except ValueError:
                builder.summary.add_malformed(first + offset)
                continue
        objs.append(value)
        numbers.append(first + offset)
    builder.add(objs, numbers)


def looks_like_document(path: Path) -> bool:
    """True when the file is one JSON document spread over lines (first line not a full row)."""
    try:
        with open_log(path) as handle:
            head = handle.readline(1 << 16).strip()
    except (EOFError, zlib.error, OSError):
        return False
    if not head.startswith((b"{", b"[")):
        return False
    try:
        first = json.loads(head.decode("utf-8", "replace"))
    except ValueError:
        return True
    # a whole document on one line: a JSON array, or a trainer_state.json written compactly
    return head.startswith(b"[") or (isinstance(first, dict)
                                     and isinstance(first.get("log_history"), list))


def read_document(path: Path, builder: ColumnBuilder) -> bool:
    """Read ``trainer_state.json`` or a JSON array of rows; False if it is neither."""
    if path.stat().st_size > MAX_DOCUMENT_BYTES:
        return False
    with open_log(path) as handle:
        text = handle.read()
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if isinstance(doc, dict) and isinstance(doc.get("log_history"), list):
        rows = doc["log_history"]
        builder.summary.format = "trainer_state"
    elif isinstance(doc, list):
        rows = doc
        builder.summary.format = "json"
    elif isinstance(doc, dict):
        keys = ", ".join(map(str, list(doc)[:8])) + (", ..." if len(doc) > 8 else "")
        raise UnreadableLogError(
            f"{path}: one JSON object (keys: {keys or 'none'}) that is not a trainer_state.json "
            "(no 'log_history' list of rows); the doctor reads JSON lines (one row a line), a "
            "trainer_state.json or a JSON array of rows")
    else:
        return False
    builder.summary.lines = len(rows)
    builder.add(rows, range(1, len(rows) + 1))
    return True
