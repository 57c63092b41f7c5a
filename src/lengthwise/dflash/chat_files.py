"""Chat data files: JSONL, Parquet or a Hugging Face ``datasets`` folder of conversations.

:func:`read_conversations` reads the rows of a file whose rows hold a
``messages`` or ``conversations`` list (or the field named), or of a
``datasets`` folder written by ``save_to_disk``, and names each row and field
so that :func:`~lengthwise.dflash.chat.normalise` can say where a problem is.
:func:`count_rows` counts the rows.

Example::

    >>> import json, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "c.jsonl")
    >>> _ = open(p, "w").write(json.dumps({"messages": [{"role": "user", "content": "x"}]}))
    >>> count_rows(p), [where for _, where, _ in read_conversations(p)]
    (1, [".../c.jsonl row 0 (line 1) field 'messages'"])
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import DataError, MissingDependencyError
from lengthwise.planning.jsonl import check_text, json_record

__all__ = ["FIELDS", "ChatSource", "count_rows", "read_conversations"]

#: row fields that may hold the conversation, in the order they are looked for
FIELDS = ("messages", "conversations")

def _pick_field(names: list[str], source: str, field: str | None) -> str:
    if field is not None:
        if field not in names:
            raise DataError(f"{source}: no field {field!r} (fields: {', '.join(names)})")
        return field
    for name in FIELDS:
        if name in names:
            return name
    raise DataError(f"{source}: no 'messages' or 'conversations' field "
                    f"(fields: {', '.join(names) or 'none'}); name one with --field")


def _is_datasets_folder(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in
                                 ("dataset_info.json", "state.json", "dataset_dict.json"))


def _load_datasets_folder(path: Path, split: str) -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError(f"{path} is a Hugging Face datasets folder: reading it "
                                     "needs the datasets package (pip install "
                                     "'lengthwise[hf]')") from exc
    try:
        ds = datasets.load_from_disk(str(path))
    except _READ_ERRORS as exc:
        raise _damaged(exc, f"{path}: the datasets folder cannot be read, a file of it is "
                            "damaged or cut short") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: no split {split!r} (splits: {', '.join(ds)}); "
                            "name one with --split")
        ds = ds[split]
    return ds


class ChatSource:
    """A chat data set opened once: ``len()`` rows, and ``rows(start, stop)`` read directly.

    JSONL rows are found by a byte-offset index built in one pass (plain or ``.gz``);
    Parquet reads only the row groups that hold the rows; a ``datasets`` folder is
    memory-mapped.
    """

    def __init__(self, path: str | Path, *, field: str | None = None,
                 split: str = "train") -> None:
        self.path, self.field = Path(path), field
        path = self.path
        if not path.exists():
            raise DataError(f"{path}: no such file or folder")
        self._ds = self._pf = None
        if _is_datasets_folder(path):
            self._ds = _load_datasets_folder(path, split)
            self._name = _pick_field(list(self._ds.column_names), str(path), field)
            self._len = len(self._ds)
        elif path.is_dir():
            raise DataError(f"{path}: a folder that is not a Hugging Face datasets folder "
                            "(save_to_disk); give a .jsonl or .parquet file")
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                self._pf = pq.ParquetFile(path)
            except _READ_ERRORS as exc:
                raise _damaged(exc, f"{path}: not a readable Parquet file, damaged or cut "
                                    "short") from None
            self._name = _pick_field(list(self._pf.schema_arrow.names), str(path), field)
            sizes = [self._pf.metadata.row_group(g).num_rows
                     for g in range(self._pf.num_row_groups)]
            self._groups = np.cumsum([0, *sizes])
            self._len = int(self._groups[-1])
        else:
            try:
                self._offsets, self._lines = _line_index(path)
            except _READ_ERRORS as exc:
                raise _damaged(exc, f"{path}: cannot be read to its end, damaged or cut "
                                    "short") from None
            self._len = int(self._offsets.size)

    def __len__(self) -> int:
        return self._len

    def rows(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, str, Any]]:
        """Rows ``start..stop`` as ``(row, where, raw_messages)``; ``where`` names row and field."""
        stop = self._len if stop is None else min(stop, self._len)
        if start >= stop:
            return
        if self._ds is not None:
            values = self._ds.select(range(start, stop))[self._name]
            for i, value in enumerate(values, start=start):
                yield i, f"{self.path} row {i} field {self._name!r}", value
        elif self._pf is not None:
            first = int(np.searchsorted(self._groups, start, side="right")) - 1
            last = int(np.searchsorted(self._groups, stop, side="left"))
            try:
                table = self._pf.read_row_groups(list(range(first, last)),
                                                 columns=[self._name])
            except _READ_ERRORS as exc:
                raise _damaged(exc, f"{self.path} rows {start}-{stop - 1}: the Parquet data "
                                    "cannot be decoded, the file is damaged") from None
            lo = start - int(self._groups[first])
            values = table.column(0).slice(lo, stop - start).to_pylist()
            for i, value in enumerate(values, start=start):
                yield i, f"{self.path} row {i} field {self._name!r}", value
        else:
            yield from self._jsonl_rows(start, stop)

    def _jsonl_rows(self, start: int, stop: int) -> Iterator[tuple[int, str, Any]]:
        with _open(self.path) as f:
            f.seek(int(self._offsets[start]))
            for i in range(start, stop):
                lineno = int(self._lines[i])
                line = f.readline()
                while not line.strip():  # blank lines are not rows
                    line = f.readline()
                try:
                    text = line.decode("utf-8-sig")  # a BOM before row 0 is no error
                except UnicodeDecodeError as exc:
                    raise DataError(f"{self.path} row {i} (line {lineno}): not UTF-8 text "
                                    f"(byte 0x{line[exc.start]:02x} at byte {exc.start} of the "
                                    "line)") from None
                obj = json_record(text, self.path, lineno, error=DataError)
                check_text(text, obj, f"{self.path} row {i} (line {lineno})", error=DataError)
                name = _pick_field(list(obj), f"{self.path} line {lineno}", self.field)
                yield i, f"{self.path} row {i} (line {lineno}) field {name!r}", obj[name]


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged file raises: gzip/zlib, Arrow (Parquet, datasets) errors."""

    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
    try:
        import pyarrow as pa

        errors += (pa.ArrowException,)
    except ImportError:  # pragma: no cover - JSONL needs no pyarrow
        pass
    return errors


_READ_ERRORS = _read_errors()


def _damaged(exc: BaseException, what: str) -> DataError:
    """The error for a file that could not be read; one the user named wrong is raised as is."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                        NotADirectoryError)):
        raise exc
    return DataError(f"{what} ({' '.join(str(exc).split())[:200] or type(exc).__name__})")


def _open(path: Path) -> Any:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _line_index(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Byte offset and line number (from 1) of every non-blank line."""
    offsets, lines = [], []
    pos = 0
    with _open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                offsets.append(pos)
                lines.append(lineno)
            pos += len(line)
    return np.asarray(offsets, dtype=np.int64), np.asarray(lines, dtype=np.int64)


def count_rows(path: str | Path, *, field: str | None = None, split: str = "train") -> int:
    """Number of rows (conversations) in a JSONL/Parquet file or a ``datasets`` folder."""
    return len(ChatSource(path, field=field, split=split))


def read_conversations(path: str | Path, *, field: str | None = None, start: int = 0,
                       stop: int | None = None, split: str = "train",
                       ) -> Iterator[tuple[int, str, Any]]:
    """Rows ``start..stop`` as ``(row, where, raw_messages)``; ``where`` names row and field.

    Rows are counted from 0; blank JSONL lines are not rows.

    Example::

        >>> import json, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "c.jsonl")
        >>> _ = open(p, "w").write(json.dumps({"messages": [{"role": "user", "content": "x"}]}))
        >>> [(row, raw[0]["content"]) for row, _, raw in read_conversations(p)]
        [(0, 'x')]
    """
    yield from ChatSource(path, field=field, split=split).rows(start, stop)
