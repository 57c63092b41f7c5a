"""Lengths from where they are kept: files of every format, bundled sets, large-run layouts.

* :func:`read_source` reads a path or a bundled name (see :func:`bundled_names`):
  ``.npy`` (memory-mapped), ``.txt``, ``FILE.jsonl:FIELD``, ``FILE.parquet:COLUMN``,
  ``FILE.arrow:COLUMN``, and the two formats below; the values are checked by
  :func:`lengthwise.planning.lengths.validate_lengths`.

* :func:`megatron_lengths` maps the sequence lengths of a Megatron-style indexed
  data set (``PREFIX.idx`` beside ``PREFIX.bin``) without reading any token: the
  index stores them as one int32 array after a 34-byte header.
* :func:`parquet_folder_lengths` reads one column of a folder of Parquet shards, the
  files ``pyarrow.dataset`` reads in its order (see :func:`parquet_shards`), a record
  batch at a time, into one array (or straight into a ``.npy`` file written
  atomically), so memory stays bounded by the output.

Example::

    >>> import os, struct, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "corpus.idx")
    >>> lens = np.array([3, 5, 1], dtype=np.int32)
    >>> with open(path, "wb") as fh:  # the index layout, as Megatron's builder writes it
    ...     _ = fh.write(b"MMIDIDX\\x00\\x00" + struct.pack("<QBQQ", 1, 4, 3, 2))
    ...     _ = fh.write(lens.tobytes() + np.array([0, 12, 32]).tobytes())
    ...     _ = fh.write(np.array([0, 3]).tobytes())
    >>> megatron_lengths(path).tolist()
    [3, 5, 1]
"""

from __future__ import annotations

import os
import struct
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lengthwise.atomic import atomic_path
from lengthwise.errors import MissingDependencyError
from lengthwise.planning.errors import MAX_LENGTH, LengthError, first_bad_length
from lengthwise.planning.jsonl import jsonl_field

_BUNDLED_SUFFIX = ".qwen3.npy"

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = [
    "bundled_names", "megatron_lengths", "parquet_folder_lengths", "parquet_shards", "read_source",
]

_IDX_MAGIC = b"MMIDIDX\x00\x00"
_IDX_HEAD = struct.Struct("<QBQQ")  # version, token dtype code, sequences, documents
# Megatron's DType codes -> bytes per token (uint8, int8, int16, int32, int64, float64,
# float32, uint16)
_TOKEN_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}


def megatron_lengths(path: str | os.PathLike[str]) -> np.ndarray:
    """Token count of every sequence of a Megatron indexed data set, memory-mapped (int32).

    ``path`` is the ``.idx`` file or the prefix shared with the ``.bin``. When the
    ``.bin`` file is there, its size must match the lengths (else the pair is not
    one data set).
    """
    text = os.fspath(path)
    idx = text if text.endswith(".idx") else text + ".idx"
    if not os.path.exists(idx):
        raise FileNotFoundError(f"no Megatron index file {idx!r}")
    size = os.path.getsize(idx)
    with open(idx, "rb") as fh:
        head = fh.read(len(_IDX_MAGIC) + _IDX_HEAD.size)
    if len(head) < len(_IDX_MAGIC) + _IDX_HEAD.size or not head.startswith(_IDX_MAGIC):
        raise LengthError(f"{idx} is not a Megatron index: it does not start with "
                          f"{_IDX_MAGIC!r}")
    version, code, sequences, documents = _IDX_HEAD.unpack(head[len(_IDX_MAGIC):])
    if version != 1:
        raise LengthError(f"{idx}: index version {version} is not supported (reads 1)")
    if code not in _TOKEN_BYTES:
        raise LengthError(f"{idx}: unknown token dtype code {code}")
    start = len(head)
    need = start + 4 * sequences + 8 * sequences + 8 * documents
    if size < need:
        raise LengthError(f"{idx} is truncated: {sequences} sequences and {documents} documents "
                          f"need {need} bytes, the file has {size}")
    if sequences == 0:
        raise LengthError(f"{idx} holds no sequences: there is nothing to plan")
    lengths = np.memmap(idx, dtype="<i4", mode="r", offset=start, shape=(sequences,))
    bin_path = idx[:-4] + ".bin"
    if os.path.exists(bin_path):
        pointers = np.memmap(idx, dtype="<i8", mode="r", offset=start + 4 * sequences,
                             shape=(sequences,))
        end = int(pointers[-1]) + int(lengths[-1]) * _TOKEN_BYTES[code]
        if end != os.path.getsize(bin_path):
            raise LengthError(f"{bin_path} has {os.path.getsize(bin_path)} bytes but its index "
                              f"{idx} describes {end}: they are not one data set")
    return lengths


def _batch_lengths(col: pa.Array, name: str, column: str, row0: int) -> np.ndarray:
    """The lengths of one Parquet record-batch column, checked (``row0``: its first row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        col = pc.list_value_length(col)
    if col.null_count:
        row = row0 + int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise LengthError(f"{name}, row {row}: {column!r} is missing (null)")
    values = col.to_numpy(zero_copy_only=False)
    if values.dtype.kind not in "iuf":
        raise LengthError(f"{name}: column {column!r} holds {col.type}, not lengths")
    row = first_bad_length(values)
    if row is not None:
        raise LengthError(f"{name}, row {row0 + row}: {values[row].item()!r} is not "
                          "a length")
    if values.dtype.kind in "uf" and values.size:  # int64 holds what is below 2**63 only
        over = np.flatnonzero(values >= 2**63)
        if over.size:
            row = int(over[0])
            raise LengthError(f"{name}, row {row0 + row}: {values[row].item()!r} is too large "
                              "for a length (must be below 2**63)")
    return values


def parquet_folder_lengths(folder: str | os.PathLike[str], column: str, *,
                           out: str | os.PathLike[str] | None = None,
                           batch_rows: int = 1 << 20) -> np.ndarray:
    """One length per row of a folder of Parquet shards, in the order ``pyarrow.dataset`` reads.

    The shards are those :func:`parquet_shards` lists (names starting with ``_`` or
    ``.`` are skipped, as ``pyarrow.dataset`` skips them), so the lengths line up with
    the rows of ``pyarrow.dataset.dataset(folder)``. ``column`` holds lengths, or
    token-id lists (their lengths are taken). Shards are read a record batch
    (``batch_rows`` rows) at a time; with ``out`` the lengths go straight into that
    ``.npy`` file (memory-mapped, written to a hidden temporary file renamed on success,
    so a failure never leaves a complete-looking file), and the result is that file
    mapped read-only: a billion rows never sit in memory. Errors name the shard and the row.

    Example::

        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> folder = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"n": [4, 2]}), f"{folder}/part-0.parquet")
        >>> pq.write_table(pa.table({"n": [7]}), f"{folder}/part-1.parquet")
        >>> parquet_folder_lengths(folder, "n").tolist()
        [4, 2, 7]
    """
    try:
        import pyarrow.dataset  # noqa: F401 - the readers below import it
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("reading Parquet folders needs pyarrow: pip install "
                                     "'lengthwise[io]'") from exc
    files = parquet_shards(folder)
    per_file = [_shard_rows(f, column, folder) for f in files]
    total = int(sum(per_file))
    if total == 0:
        raise LengthError(f"the Parquet files under {os.fspath(folder)!r} hold no rows")
    if out is None:
        return _fill_lengths(np.empty(total, dtype=np.int64), files, per_file, column,
                             batch_rows)
    with atomic_path(out) as tmp:  # a failure leaves no complete-looking .npy
        lengths = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(total,))
        _fill_lengths(lengths, files, per_file, column, batch_rows)
        lengths.flush()
        del lengths
    return np.load(os.fspath(out), mmap_mode="r")


def _shard_rows(name: str, column: str, folder: str | os.PathLike[str]) -> int:
    """The row count of one shard, once it is read as Parquet and holds ``column``."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    try:
        shard = ds.dataset(name, format="parquet")
        names = shard.schema.names
        rows = shard.count_rows()
    except (pa.ArrowException, OSError) as exc:
        reason = str(exc).split(". ")[-1].strip() or type(exc).__name__
        raise LengthError(f"{name} is not a readable Parquet file ({reason[:200]})") from None
    if column not in names:
        raise LengthError(f"{name} has no column {column!r} (columns: {names}); every shard "
                          f"under {os.fspath(folder)} needs it")
    return int(rows)


def _fill_lengths(lengths: np.ndarray, files: list[str], per_file: list[int], column: str,
                  batch_rows: int) -> np.ndarray:
    """Write the checked lengths of ``column`` of every shard, in order, into ``lengths``."""
    import pyarrow.dataset as ds

    pos = 0
    for name, rows in zip(files, per_file, strict=True):
        first = pos
        for batch in ds.dataset(name, format="parquet").to_batches(columns=[column],
                                                                    batch_size=batch_rows):
            values = _batch_lengths(batch.column(0), name, column, pos - first)
            lengths[pos : pos + values.size] = values
            pos += values.size
        if pos - first != rows:  # pragma: no cover - a shard changed while it was read
            raise LengthError(f"{name} had {rows} rows in its metadata, {pos - first} read")
    return lengths


def parquet_shards(folder: str | os.PathLike[str]) -> list[str]:
    """The Parquet files of ``folder`` as ``pyarrow.dataset.dataset(folder)`` lists them.

    With ``pyarrow.dataset``'s own discovery it skips every file or folder whose name
    starts with ``_`` or ``.`` (``_SUCCESS``, ``_temporary/``, ``.ipynb_checkpoints/``,
    ``.crc`` files) at any depth, and orders the files by path. Of the rest it takes
    the ``.parquet`` files and those that are Parquet under another name (they start
    with ``PAR1``): ``pyarrow.dataset`` reads both; other files (a ``README.md``) are
    not data and are passed over.

    Example::

        >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> folder = tempfile.mkdtemp()
        >>> for name in ("part-1.parquet", "_temporary/part-9.parquet", "part-0.parquet"):
        ...     os.makedirs(os.path.dirname(f"{folder}/{name}"), exist_ok=True)
        ...     pq.write_table(pa.table({"n": [1]}), f"{folder}/{name}")
        >>> [os.path.relpath(f, folder) for f in parquet_shards(folder)]
        ['part-0.parquet', 'part-1.parquet']
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    text = os.fspath(folder)
    if not os.path.isdir(text):
        raise FileNotFoundError(f"no .parquet files under {text!r}: there is no such folder")
    # discovery only: with a schema given, no file is opened to infer one
    listed = ds.dataset(text, format="parquet", schema=pa.schema([])).files
    files = [f for f in listed if f.lower().endswith(".parquet") or _is_parquet(f)]
    if not files:
        raise FileNotFoundError(f"no .parquet files under {text!r} (names starting with '_' "
                                "or '.' are skipped, as pyarrow.dataset skips them)")
    return files


def _is_parquet(path: str) -> bool:
    """Whether ``path`` starts with the Parquet magic bytes."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError:
        return False


def bundled_names() -> list[str]:
    """Names of the real length distributions shipped with the package.

    Example::

        >>> "sft_mix" in bundled_names()
        True
    """
    folder = resources.files("lengthwise") / "data"
    return sorted(p.name[: -len(_BUNDLED_SUFFIX)] for p in folder.iterdir()
                  if p.name.endswith(_BUNDLED_SUFFIX))


def _bundled_path(name: str) -> Path:
    return Path(str(resources.files("lengthwise") / "data" / f"{name}{_BUNDLED_SUFFIX}"))


def _split_column(source: str) -> tuple[str, str | None]:
    """Split ``FILE.parquet:COLUMN`` into path and column (Windows drive letters kept)."""
    head, sep, tail = source.rpartition(":")
    if sep and head and not os.path.exists(source) and "/" not in tail and "\\" not in tail:
        return head, tail
    return source, None


def _read_text(path: str) -> np.ndarray:
    values = []
    with open(path, encoding="utf-8") as fh:
        try:
            for lineno, line in enumerate(fh, start=1):
                text = line.strip()
                if not text:
                    continue
                try:
                    values.append(int(text))
                except ValueError:
                    try:
                        values.append(float(text))
                    except ValueError:
                        raise LengthError(
                            f"{path}, line {lineno}: {text!r} is not a number") from None
        except UnicodeDecodeError:
            raise LengthError(f"{path}: not UTF-8 text (a binary file?); a .txt of lengths "
                              "holds one integer a line") from None
    return _as_numbers(values)


def _as_numbers(values: list) -> np.ndarray:
    """Python numbers as an array; integers too large for int64 stay exact (as objects)."""
    try:
        return np.asarray(values)
    except OverflowError:  # an int beyond uint64: validate_lengths names it
        return np.asarray(values, dtype=object)


def _read_jsonl(path: str, field: str) -> np.ndarray:
    values = []
    for lineno, value in jsonl_field(path, field, error=LengthError):
        if isinstance(value, list):  # a token-id list: its length is the sample length
            value = len(value)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise LengthError(f"{path}, line {lineno}: field {field!r} is {shown}, "
                              "not a number of tokens (or a list of token ids)")
        if isinstance(value, int) and not -MAX_LENGTH < value < MAX_LENGTH:
            raise LengthError(f"{path}, line {lineno}: field {field!r} is {value}, too large "
                              f"for a length (must be below 2**63)")
        values.append(value)
    return _as_numbers(values)


def _read_arrow_like(path: str, column: str | None, kind: str) -> np.ndarray:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"reading {kind} files needs pyarrow: pip install 'lengthwise[io]'") from exc
    if kind == "parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        if column is not None and column not in names:
            raise LengthError(f"{path} has no column {column!r} (columns: {names})")
        table = pq.read_table(path, columns=[column] if column else None, memory_map=True)
    else:
        with pa.memory_map(path, "r") as source:
            try:
                table = pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_stream(source).read_all()
    if column is None:
        if table.num_columns != 1:
            raise LengthError(
                f"{path} has columns {table.column_names}; name one as {path}:COLUMN"
            )
        column = table.column_names[0]
    if column not in table.column_names:
        raise LengthError(f"{path} has no column {column!r} (columns: {table.column_names})")
    col = table.column(column)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        col = pc.list_value_length(col)
    if col.null_count:
        first = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise LengthError(f"{path}:{column}, row {first}: missing value (null)")
    return col.to_numpy(zero_copy_only=False)


def _read_npy(path: str) -> np.ndarray:
    """A ``.npy`` file memory-mapped; one that is not a whole ``.npy`` raises naming it."""
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, EOFError, OSError) as exc:
        with open(path, "rb") as fh:
            start = fh.read(6)
        if not start:
            why = "the file is empty (0 bytes)"
        elif start != b"\x93NUMPY":
            why = "not a .npy file (it does not start with the .npy magic bytes)"
        elif "pickle" in str(exc) or "Python objects" in str(exc):
            why = "the array holds Python objects, not numbers"
        elif "mmap length" in str(exc):
            why = "the file is cut short: its header promises more data than it holds"
        else:
            why = f"a cut or corrupt .npy header ({' '.join(str(exc).split())})"
        raise LengthError(f"cannot read lengths from {path}: {why}") from None


def read_source(source: str | os.PathLike[str]) -> np.ndarray:
    """The raw values of a path or bundled name, unchecked (see ``load_lengths``)."""
    text = os.fspath(source)
    # a bundled name, unless a file of that name exists here: the user's file wins
    if (os.sep not in text and "." not in text and not os.path.exists(text)
            and _bundled_path(text).exists()):
        return np.load(_bundled_path(text))
    path, column = _split_column(text)
    if os.path.isdir(path):  # a folder of Parquet shards
        if column is None:
            raise LengthError(f"{path!r} is a folder, not a file of lengths; for a folder of "
                              f"Parquet shards name the column: {path}:COLUMN")
        return parquet_folder_lengths(path, column)
    if not os.path.exists(path):
        known = ", ".join(bundled_names())
        raise FileNotFoundError(f"no file {path!r} and no bundled distribution of that name "
                                f"(bundled: {known})")
    lower = path.lower()
    if column is not None and lower.endswith((".npy", ".idx", ".txt", ".csv")):
        raise LengthError(f"{path} holds the lengths themselves, it has no column or field "
                          f"{column!r}: give {path} without ':{column}'")
    if lower.endswith(".npy"):
        return _read_npy(path)
    if lower.endswith(".idx"):  # a Megatron index
        return megatron_lengths(path)
    if lower.endswith((".txt", ".csv")) and column is None:
        return _read_text(path)
    if lower.endswith((".jsonl", ".jsonl.gz", ".json")):
        if column is None:
            raise LengthError(f"name the field that holds the length: {path}:FIELD")
        return _read_jsonl(path, column)
    if lower.endswith(".parquet"):
        return _read_arrow_like(path, column, "parquet")
    if lower.endswith((".arrow", ".feather", ".ipc")):
        return _read_arrow_like(path, column, "arrow")
    hint = ""
    if _bundled_path(text).exists():
        hint = (f"; {text!r} is also the name of a bundled distribution, but a file of that "
                "name here takes precedence: rename or move it to use the bundled one")
    raise LengthError(f"cannot read lengths from {path!r}: use .npy, .txt, .jsonl:FIELD, "
                      ".parquet:COLUMN, .arrow:COLUMN, a Megatron .idx, FOLDER:COLUMN (Parquet "
                      f"shards), or a bundled name{hint}")
