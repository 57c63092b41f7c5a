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

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lengthwise.errors import DataError, MissingDependencyError

__all__ = ["FIELDS", "count_rows", "read_conversations"]

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
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: no split {split!r} (splits: {', '.join(ds)}); "
                            "name one with --split")
        ds = ds[split]
    return ds


def count_rows(path: str | Path, *, split: str = "train") -> int:
    """Number of rows (conversations) in a JSONL/Parquet file or a ``datasets`` folder."""
    path = Path(path)
    if _is_datasets_folder(path):
        return len(_load_datasets_folder(path, split))
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


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
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if _is_datasets_folder(path):
        ds = _load_datasets_folder(path, split)
        name = _pick_field(list(ds.column_names), str(path), field)
        end = len(ds) if stop is None else min(stop, len(ds))
        for i in range(start, end):
            yield i, f"{path} row {i} field {name!r}", ds[i][name]
        return
    if path.is_dir():
        raise DataError(f"{path}: a folder that is not a Hugging Face datasets folder "
                        "(save_to_disk); give a .jsonl or .parquet file")
    if path.suffix == ".parquet":
        yield from _read_parquet(path, field, start, stop)
        return
    yield from _read_jsonl(path, field, start, stop)


def _read_parquet(path: Path, field: str | None, start: int, stop: int | None,
                  ) -> Iterator[tuple[int, str, Any]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    name = _pick_field(list(pf.schema_arrow.names), str(path), field)
    row = 0
    for batch in pf.iter_batches(columns=[name], batch_size=1024):
        n = batch.num_rows
        if row + n <= start:
            row += n
            continue
        for value in batch.column(0).to_pylist():
            if stop is not None and row >= stop:
                return
            if row >= start:
                yield row, f"{path} row {row} field {name!r}", value
            row += 1


def _read_jsonl(path: Path, field: str | None, start: int, stop: int | None,
                ) -> Iterator[tuple[int, str, Any]]:
    row = 0
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if stop is not None and row >= stop:
                return
            if row >= start:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path} line {lineno}: not JSON ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path} line {lineno}: a row must be a JSON object")
                name = _pick_field(list(obj), f"{path} line {lineno}", field)
                yield row, f"{path} row {row} (line {lineno}) field {name!r}", obj[name]
            row += 1
