"""Streaming readers for text logs: JSON lines (plain or gzip), whole JSON documents, CSV exports.

JSON lines are parsed a block at a time (``orjson`` when installed), a block that fails line
by line. A JSON document is a ``trainer_state.json`` or an array of rows. CSV column names are
matched case-insensitively, without a W&B run prefix, ``__MIN``/``__MAX`` or ``section/``.

Example::

    >>> import gzip, pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl.gz"
    >>> _ = p.write_bytes(gzip.compress(b'{"step": 1, "loss": 2.5}\\nnot json\\n'))
    >>> b = ColumnBuilder(str(p), fmt="jsonl")
    >>> read_jsonl(p, b)
    >>> b.summary.malformed, b.summary.malformed_lines
    (1, [2])
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "export.csv"
    >>> _ = p.write_text("Step,run - train/loss,run - train/loss__MIN\\n1,2.5,2.4\\n2,2.4,2.3\\n")
    >>> b = ColumnBuilder(str(p), fmt="csv")
    >>> read_csv(p, b)
    >>> b.build().loss.tolist()
    [2.5, 2.4]
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from lengthwise.doctor.errors import EmptyLogError, UnreadableLogError
from lengthwise.doctor.readers.columns import (
    LOSS_ALIASES,
    NUMERIC_ALIASES,
    STEP_ALIASES,
    ColumnBuilder,
    find_field,
)
from lengthwise.doctor.runlog import NUMERIC_FIELDS, InputSummary

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


def read_jsonl(path: Path, builder: ColumnBuilder, *, step_key: str | None = None,
               loss_key: str | None = None) -> None:
    """Read a JSON-lines log into ``builder``, block by block."""
    builder.summary.format = "jsonl"
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


def read_document(path: Path, builder: ColumnBuilder, *, step_key: str | None = None,
                  loss_key: str | None = None) -> None:
    """Read ``trainer_state.json`` or a JSON array of rows (else: as JSON lines)."""
    if path.stat().st_size > MAX_DOCUMENT_BYTES:
        return read_jsonl(path, builder)
    with open_log(path) as handle:
        text = handle.read()
    try:
        doc = json.loads(text)
    except ValueError:
        return read_jsonl(path, builder)
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
        return read_jsonl(path, builder)
    builder.summary.lines = len(rows)
    builder.add(rows, range(1, len(rows) + 1))


ROWS_PER_CHUNK = 20_000


def _clean(header: str) -> str:
    name = header.strip()
    if " - " in name:
        name = name.split(" - ", 1)[1]
    return name.lower()


class WholeLines(io.RawIOBase):
    """A byte stream of whole lines that ends cleanly where its source breaks off (a cut or
    corrupt gzip): the partial line at the break is dropped (``dropped_tail``), and ``broken``
    says why the stream ended early.

        >>> import gzip
        >>> data = gzip.compress(b"step,loss\\n1,2.5\\n2,2.4\\n3,2.3")
        >>> stream = WholeLines(gzip.GzipFile(fileobj=io.BytesIO(data[:-4])))
        >>> stream.read(), stream.broken is not None, stream.dropped_tail
        (b'step,loss\\n1,2.5\\n2,2.4\\n', True, True)
    """

    def __init__(self, source: Any) -> None:
        super().__init__()
        self.source = source
        self.broken: str | None = None
        self.dropped_tail = False
        self._held = b""  # bytes after the last newline, passed on once the line is whole

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            held = self._held
            cut = held.rfind(b"\n") + 1
            if cut:
                n = min(len(buffer), cut)
                buffer[:n] = held[:n]
                self._held = held[n:]
                return n
            if self.broken is not None:
                return 0
            try:
                # read1: one decompressed block, so what came before a break is kept
                chunk = self.source.read1(1 << 16)
            except (EOFError, zlib.error, OSError) as exc:
                self.broken = str(exc) or type(exc).__name__
                self.dropped_tail = bool(self._held.strip())
                self._held = b""
                return 0
            if not chunk:  # a clean end: the last line needs no newline
                n = min(len(buffer), len(held))
                buffer[:n] = held[:n]
                self._held = held[n:]
                return n
            self._held = held + chunk


def read_csv(path: Path, builder: ColumnBuilder, *, step_key: str | None = None,
             loss_key: str | None = None) -> None:
    """Read a CSV log into ``builder`` (its rows become dicts with canonical field names)."""
    builder.use_keys(step_key="step" if step_key else None, loss_key="loss")
    with open_log(path) as raw:
        stream = WholeLines(raw)
        reader, header = _csv_reader(path, stream)
        names = [_clean(h) if not h.strip().endswith(("__MIN", "__MAX")) else "" for h in header]
        cols = _columns(names, step_key, loss_key)
        if "loss" not in cols:
            raise _no_loss_column(path, header, loss_key)
        builder.loss_label = header[cols["loss"]].strip()
        _read_rows(reader, cols, len(header), builder)
        if stream.broken is not None:
            builder.summary.truncated = True
            if stream.dropped_tail:  # the cut line at the break: read, and malformed
                builder.summary.lines += 1
                builder.summary.add_malformed(builder.summary.lines)


def _csv_reader(path: Path, stream: WholeLines) -> tuple[Iterator[list[str]], list[str]]:
    """A CSV reader of the decoded file in its sniffed dialect, past the header, and the header."""
    text = io.TextIOWrapper(io.BufferedReader(stream), encoding="utf-8-sig", errors="replace",
                            newline="")
    sample = text.read(1 << 16)
    sample += text.readline()  # up to a line end: the reader goes on from there
    if not sample.strip():
        if stream.broken is not None:
            raise UnreadableLogError(f"{path}: corrupt or unreadable: the gzip stream breaks "
                                     f"off before the first whole line ({stream.broken})")
        raise EmptyLogError(f"{path}: is empty")
    first = sample.splitlines()[0]
    dialect = _dialect(first)
    reader = csv.reader(itertools.chain(io.StringIO(sample), text), dialect)
    try:
        header = next(reader)
    except (csv.Error, StopIteration) as exc:
        raise UnreadableLogError(f"{path}: no CSV header ({exc})") from exc
    return reader, header


class _Whitespace(csv.Dialect):
    """Columns apart by runs of spaces (``step loss``, as ``column -t`` or Fortran write them)."""

    delimiter = " "
    skipinitialspace = True
    quotechar = '"'
    doublequote = True
    lineterminator = "\n"
    quoting = csv.QUOTE_MINIMAL


def _dialect(header: str) -> type[csv.Dialect] | csv.Dialect:
    """The dialect of a header line: comma, tab, semicolon or pipe, else runs of spaces.

    >>> [_dialect(h).delimiter for h in ("step,loss", "step|loss", "step   loss")]
    [',', '|', ' ']
    """
    try:
        return csv.Sniffer().sniff(header, delimiters=",\t;|")
    except csv.Error:
        pass
    if len(header.split()) > 1 and " - " not in header:  # not a W&B "run - loss" name
        return _Whitespace
    return csv.excel


def _no_loss_column(path: Path, header: list[str], loss_key: str | None) -> EmptyLogError:
    """The error for a CSV without the loss column, listing its first columns."""
    shown = ", ".join(h for h in header[:12])
    if loss_key:
        return EmptyLogError(f"{path}: no column {loss_key!r} among the CSV columns: "
                             f"{shown}")
    return EmptyLogError(
        f"{path}: no loss column found among the CSV columns: {shown}; name the one "
        "that holds the loss with --loss-key COLUMN (loss_key= in Python)")


def _read_rows(
    reader: Iterator[list[str]], cols: dict[str, int], width: int, builder: ColumnBuilder
) -> None:
    """Feed the data rows to ``builder`` in chunks, counting short, long and loss-less rows."""
    li = cols["loss"]
    rows: list[dict[str, str]] = []
    numbers: list[int] = []
    line = 1
    try:
        for row in reader:
            line += 1
            if not row:
                continue
            if len(row) != width:
                builder.summary.add_malformed(line)
                continue
            if not row[li].strip():
                builder.summary.other_rows += 1
                continue
            rows.append({k: row[i] for k, i in cols.items() if row[i] != ""})
            numbers.append(line)
            if len(rows) >= ROWS_PER_CHUNK:
                builder.summary.lines = line
                builder.add(rows, numbers)
                rows, numbers = [], []
    except csv.Error:
        builder.summary.add_malformed(line)
        builder.summary.truncated = True
    except (EOFError, zlib.error, OSError):
        builder.summary.truncated = True
    builder.summary.lines = line
    builder.add(rows, numbers)


def _columns(names: list[str], step_key: str | None, loss_key: str | None) -> dict[str, int]:
    """The column of each field (``names``: the cleaned, lower-case header)."""
    cols: dict[str, int] = {}
    others = ((f, NUMERIC_ALIASES.get(f, (f,))) for f in (*NUMERIC_FIELDS, "bucket"))
    for field, wanted in (("loss", (loss_key,) if loss_key else LOSS_ALIASES),
                          ("step", (step_key,) if step_key else STEP_ALIASES), *others):
        idx = find_field(names, [w.lower() for w in wanted])
        if idx is not None and (field in ("loss", "step") or idx not in cols.values()):
            cols[field] = idx
    return cols
