"""Reading per-sample token lengths from arrays, files and bundled distributions.

Every loader returns a one-dimensional ``int64`` array aligned with the rows of
its source: row ``i`` of the data set has length ``out[i]``. Bad values raise a
:class:`LengthError` that names the row and the value.

Example::

    >>> load_lengths([3, 1, 2]).tolist()
    [3, 1, 2]
    >>> load_lengths("sft_mix").shape
    (66464,)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import numpy as np

from lengthwise.planning.errors import LengthError
from lengthwise.planning.jsonl import jsonl_field
from lengthwise.planning.vocabulary import OVERFLOW_POLICIES, OverflowPolicy

_BUNDLED_SUFFIX = ".qwen3.npy"


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
                    raise LengthError(f"{path}, line {lineno}: {text!r} is not a number") from None
    return np.asarray(values)


def _read_jsonl(path: str, field: str) -> np.ndarray:
    values = []
    for lineno, value in jsonl_field(path, field, error=LengthError):
        if isinstance(value, list):  # a token-id list: its length is the sample length
            value = len(value)
        if value is None or isinstance(value, (bool, str)):
            raise LengthError(f"{path}, line {lineno}: field {field!r} is {value!r}")
        values.append(float(value))
    return np.asarray(values, dtype=np.float64)


def _read_arrow_like(path: str, column: str | None, kind: str) -> np.ndarray:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
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


def _read_source(source: str | os.PathLike[str]) -> np.ndarray:
    text = os.fspath(source)
    if os.sep not in text and "." not in text and _bundled_path(text).exists():
        return np.load(_bundled_path(text))
    path, column = _split_column(text)
    if not os.path.exists(path):
        known = ", ".join(bundled_names())
        raise FileNotFoundError(f"no file {path!r} and no bundled distribution of that name "
                                f"(bundled: {known})")
    lower = path.lower()
    if lower.endswith(".npy"):
        return np.load(path, mmap_mode="r")
    if lower.endswith(".idx") or os.path.isdir(path):  # Megatron index, Parquet folder
        from lengthwise.planning import readers

        if lower.endswith(".idx"):
            return readers.megatron_lengths(path)
        if column is None:
            raise LengthError(f"name the column that holds the length: {path}:COLUMN")
        return readers.parquet_folder_lengths(path, column)
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
    raise LengthError(f"cannot read lengths from {path!r}: use .npy, .txt, .jsonl:FIELD, "
                      ".parquet:COLUMN, .arrow:COLUMN, a Megatron .idx, FOLDER:COLUMN (Parquet "
                      "shards), or a bundled name")


def validate_lengths(values: np.ndarray | Iterable[float], *, what: str = "lengths") -> np.ndarray:
    """Check lengths and return them as ``int64``; errors name the first bad row.

    Example::

        >>> validate_lengths([1, 2.0]).dtype
        dtype('int64')
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise LengthError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise LengthError(f"{what} are empty: there is nothing to plan")
    if arr.dtype == object or arr.dtype.kind in "USb":
        raise LengthError(f"{what} must be numbers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise LengthError(f"{what}, row {row}: {arr[row].item()!r} is not a finite length")
        frac = arr != np.floor(arr)
        if frac.any():
            row = int(np.flatnonzero(frac)[0])
            raise LengthError(
                f"{what}, row {row}: {arr[row].item()!r} is not a whole number of tokens")
    if arr.dtype.kind in "fi":
        neg = arr < 0
        if neg.any():
            row = int(np.flatnonzero(neg)[0])
            raise LengthError(f"{what}, row {row}: {arr[row].item()!r} is negative")
    return np.asarray(arr, dtype=np.int64)


def apply_overflow(
    lengths: np.ndarray, max_len: int | None, on_overflow: OverflowPolicy = "truncate",
    *, limit_name: str | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Apply the over-length policy; return ``(lengths, keep_mask, counts)``.

    Nothing is removed from the array: dropped rows are ``False`` in the mask, so
    indices keep pointing at the source rows. Zero-length rows are always dropped
    and counted (there is nothing to train on).

    Example::

        >>> lens, keep, counts = apply_overflow(np.array([5, 0, 12]), 10, "truncate")
        >>> lens.tolist(), keep.tolist(), counts["truncated"], counts["dropped_empty"]
        ([5, 0, 10], [True, False, True], 1, 1)
    """
    if on_overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"on_overflow must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")
    keep = lengths > 0
    counts = {"samples": int(lengths.size), "dropped_empty": int(lengths.size - keep.sum()),
              "truncated": 0, "dropped_overflow": 0}
    if max_len is None:
        return lengths, keep, counts
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    over = lengths > max_len
    n_over = int(over.sum())
    if n_over == 0:
        return lengths, keep, counts
    if on_overflow == "error":
        row = int(np.flatnonzero(over)[0])
        limit = limit_name or f"max_len={max_len}"
        raise LengthError(f"row {row}: length {int(lengths[row])} is over {limit} "
                          f"({n_over} rows are; use on_overflow='truncate' or 'drop')")
    if on_overflow == "truncate":
        counts["truncated"] = n_over
        return np.minimum(lengths, max_len), keep, counts
    counts["dropped_overflow"] = n_over
    return lengths, keep & ~over, counts


def open_lengths(source: str | os.PathLike[str] | np.ndarray | Iterable[float]) -> np.ndarray:
    """Lengths for planning at scale: ``.npy`` files memory-mapped, arrays not copied.

    Megatron ``.idx`` files are mapped too (:mod:`~lengthwise.planning.readers`).
    Unlike :func:`load_lengths` nothing is converted or scanned: the ranks of a
    node share the file's pages in the page cache, and a windowed plan checks
    each window's values when it reads them. Other sources are read (and
    checked) by :func:`load_lengths`.

    Example::

        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "lens.npy")
        >>> np.save(path, np.array([3, 1, 2], dtype=np.int32))
        >>> lens = open_lengths(path)
        >>> type(lens).__name__, lens.dtype.name, lens.tolist()
        ('memmap', 'int32', [3, 1, 2])
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not path.lower().endswith((".npy", ".idx")) or not os.path.exists(path):
            return load_lengths(source)
        arr = _read_source(path)
        what = f"lengths from {path}"
    elif isinstance(source, np.ndarray):
        arr, what = source, "lengths"
    else:
        return load_lengths(source)
    if arr.ndim != 1:
        raise LengthError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise LengthError(f"{what} are empty: there is nothing to plan")
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise LengthError(f"{what} must be numbers, got dtype {arr.dtype}")
    return arr


def load_lengths(
    source: str | os.PathLike[str] | np.ndarray | Iterable[float],
    *,
    max_len: int | None = None,
    on_overflow: OverflowPolicy = "truncate",
) -> np.ndarray:
    """Read per-sample token lengths, aligned with the source's rows.

    ``source`` is an array or list, a path (``.npy``, ``.txt`` one integer a line,
    ``FILE.jsonl:FIELD``, ``FILE.parquet:COLUMN``, ``FILE.arrow:COLUMN``; a list
    column counts its items; a Megatron ``PREFIX.idx``; ``FOLDER:COLUMN`` for a
    folder of Parquet shards), or a bundled name (see :func:`bundled_names`).
    With ``max_len``, longer samples are truncated to it, or raise with
    ``on_overflow="error"``. ``"drop"`` cannot remove rows without misaligning
    them from the data set, so here it is validated only: pass ``max_len`` and
    ``on_overflow`` to :func:`lengthwise.plan_epoch`, which drops and counts.

    Example::

        >>> load_lengths([10, 70000, 3], max_len=8192).tolist()
        [10, 8192, 3]
    """
    if isinstance(source, (str, os.PathLike)):
        raw = _read_source(source)
        what = f"lengths from {os.fspath(source)}"
    else:
        raw = source
        what = "lengths"
    lengths = validate_lengths(raw, what=what)
    if max_len is not None and on_overflow != "drop":
        lengths, _, _ = apply_overflow(lengths, max_len, on_overflow)
    elif on_overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"on_overflow must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")
    return lengths
