"""Per-sample token lengths, checked: the entry points and the overflow policy.

:func:`load_lengths` reads an array, a file or a bundled distribution (the file
formats are in :mod:`~lengthwise.planning.readers`), :func:`validate_lengths`
checks values, :func:`apply_overflow` truncates, drops or refuses long samples and
counts what it did, and :func:`open_lengths` maps large files for windowed plans.
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

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning.errors import MAX_LENGTH, LengthError
from lengthwise.planning.readers import bundled_names as bundled_names
from lengthwise.planning.readers import read_source
from lengthwise.planning.vocabulary import OVERFLOW_POLICIES, OverflowPolicy


class LoadedLengths(np.ndarray):
    """Lengths that :func:`load_lengths` truncated at ``max_len``, with what it cut.

    ``cut[i]`` is the number of tokens it removed from row ``i``, so a plan of
    these lengths counts those rows in ``truncated``. Derived arrays (slices,
    arithmetic) are plain lengths without that record.

    Example::

        >>> lens = load_lengths([10, 70000, 3], max_len=8192)
        >>> lens.cut.tolist()
        [0, 61808, 0]
    """

    cut: np.ndarray | None

    @classmethod
    def of(cls, lengths: np.ndarray, cut: np.ndarray | None) -> LoadedLengths:
        """``lengths`` carrying the tokens cut from each row."""
        out = np.asarray(lengths).view(cls)
        out.cut = cut
        return out

    def __array_finalize__(self, obj) -> None:
        self.cut = None

    def __reduce__(self):
        # pickled (e.g. to DataLoader workers) as plain lengths plus the record
        return (LoadedLengths.of, (np.asarray(self), self.cut))


def load_record(lengths) -> np.ndarray | None:
    """Tokens :func:`load_lengths` cut from each row (``None``: nothing recorded).

    Example::

        >>> load_record(np.array([3])) is None
        True
    """
    if isinstance(lengths, LoadedLengths) and lengths.cut is not None:
        return lengths.cut
    return None


def validate_lengths(values: np.ndarray | Iterable[float], *, what: str = "lengths",
                     rows: np.ndarray | None = None) -> np.ndarray:
    """Check lengths and return them as ``int64``; errors name the first bad row.

    ``rows`` are the rows ``values`` hold (a window of a larger array): errors name
    ``rows[i]`` for ``values[i]``.

    Example::

        >>> validate_lengths([1, 2.0]).dtype
        dtype('int64')
    """
    if isinstance(values, (set, frozenset, dict)) or (
            isinstance(values, Iterable) and not isinstance(values, (np.ndarray, list, tuple))
            and not hasattr(values, "__len__")):
        kind = type(values).__name__
        unordered = kind in ("set", "frozenset", "dict")
        raise LengthError(f"{what} must be a sequence in row order (a list or an array), got a "
                          f"{kind}" + (", which has no row order" if unordered
                                       else "; pass list(...) of it"))
    arr = np.asarray(values)
    if arr.ndim == 0:
        raise LengthError(f"{what} must be a sequence of lengths, one per row; got the single "
                          f"value {arr.item()!r}")
    if arr.ndim != 1:
        raise LengthError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise LengthError(f"{what} are empty: there is nothing to plan")
    if arr.dtype == object:
        arr = _object_lengths(arr, what, rows)
    check_dtype(arr, what)

    def refuse_first(bad: np.ndarray, problem: str) -> None:
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise LengthError(f"{what}, row {_named(row, rows)}: {arr[row].item()!r} {problem}")

    if arr.dtype.kind in "uf":
        refuse_first(arr >= MAX_LENGTH, "is too large for a length (must be below 2**63)")
    if arr.dtype.kind == "f":
        refuse_first(~np.isfinite(arr), "is not a finite length")
        refuse_first(arr != np.floor(arr), "is not a whole number of tokens")
    if arr.dtype.kind in "fi" and arr.min() < 0:  # one reduction; the mask only to name a row
        refuse_first(arr < 0, "is negative")
    return np.asarray(arr, dtype=np.int64)


def check_dtype(arr: np.ndarray, what: str = "lengths") -> None:
    """Raise unless ``arr`` holds numbers (integers or floats; not bools, dates or text).

    Example::

        >>> check_dtype(np.array([True]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lengthwise.planning.errors.LengthError: lengths must be numbers, got dtype bool
    """
    if arr.dtype.kind in "mM":
        raise LengthError(f"{what} must be numbers of tokens, got dtype {arr.dtype} "
                          "(dates or durations)")
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise LengthError(f"{what} must be numbers, got dtype {arr.dtype}")


def _named(row: int, rows: np.ndarray | None) -> int:
    """The row to name for position ``row`` of checked values (``rows[row]`` when given)."""
    return row if rows is None else int(rows[row])


def _object_lengths(arr: np.ndarray, what: str, rows: np.ndarray | None = None) -> np.ndarray:
    """An object array of Python numbers as int64/float64, naming the first bad value."""
    for i, value in enumerate(arr.tolist()):
        row = _named(i, rows)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                              np.floating)):
            raise LengthError(f"{what}, row {row}: {value!r} is not a number of tokens")
        if value >= MAX_LENGTH:
            raise LengthError(f"{what}, row {row}: {value!r} is too large for a length "
                              "(must be below 2**63)")
        if value < 0:
            raise LengthError(f"{what}, row {row}: {value!r} is negative")
    return arr.astype(np.float64 if any(isinstance(v, (float, np.floating))
                                        for v in arr.tolist()) else np.int64)


def check_max_len(max_len, name: str = "max_len") -> int | None:
    """``max_len`` as an int (``None`` stays): a positive whole number, never a bool or float.

    Example::

        >>> check_max_len(8192), check_max_len(None)
        (8192, None)
    """
    if max_len is None:
        return None
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)):
        raise TypeError(f"{name} must be a whole number of tokens, got {max_len!r}")
    if max_len < 1:
        raise ConfigError(f"{name} must be at least 1, got {max_len}")
    return int(max_len)


def apply_overflow(
    lengths: np.ndarray, max_len: int | None, on_overflow: OverflowPolicy = "truncate",
    *, limit_name: str | None = None, cut: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Apply the over-length policy; return ``(lengths, keep_mask, counts)``.

    Nothing is removed from the array: dropped rows are ``False`` in the mask, so
    indices keep pointing at the source rows. Zero-length rows are always dropped
    and counted (there is nothing to train on). ``cut`` holds tokens already cut
    from each row (by :func:`load_lengths`): those rows count as ``truncated`` too.
    ``truncated_tokens`` counts every token cut, ``truncated_share`` their share
    of all the tokens.

    Example::

        >>> lens, keep, counts = apply_overflow(np.array([5, 0, 12]), 10, "truncate")
        >>> lens.tolist(), keep.tolist(), counts["truncated"], counts["dropped_empty"]
        ([5, 0, 10], [True, False, True], 1, 1)
        >>> counts["truncated_tokens"], round(counts["truncated_share"], 3)
        (2, 0.118)
    """
    if on_overflow not in OVERFLOW_POLICIES:
        raise ConfigError(f"on_overflow must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")
    max_len = check_max_len(max_len, limit_name or "max_len")
    keep = lengths > 0
    counts = {"samples": int(lengths.size),
              "dropped_empty": int(lengths.size - np.count_nonzero(keep)),
              "truncated": 0, "dropped_overflow": 0, "truncated_tokens": 0,
              "truncated_share": 0.0}
    raw = lengths
    n_over = 0
    if max_len is not None and lengths.size and lengths.max() > max_len:
        over = lengths > max_len
        n_over = int(np.count_nonzero(over))
    if n_over and on_overflow == "error":
        row = int(np.flatnonzero(over)[0])
        limit = limit_name or f"max_len={max_len}"
        raise LengthError(f"row {row}: length {int(lengths[row])} is over {limit} "
                          f"({n_over} rows are; use on_overflow='truncate' or 'drop')")
    if n_over and on_overflow == "drop":
        counts["dropped_overflow"] = n_over
        keep = keep & ~over
    truncated = None  # the rows cut, when any are
    removed = 0
    if n_over and on_overflow == "truncate":
        truncated = over
        removed = int((lengths[over] - max_len).sum())
        lengths = np.minimum(lengths, max_len)
    if cut is not None:  # rows cut before, still planned
        earlier = (cut > 0) & keep
        truncated = earlier if truncated is None else truncated | earlier
        removed += int(cut[earlier].sum())
    if truncated is not None:
        counts["truncated"] = int(np.count_nonzero(truncated))
    counts["truncated_tokens"] = removed
    if removed:  # a share of every token, those cut before included
        total = float(raw.sum(dtype=np.float64))
        if cut is not None:
            total += float(cut.sum(dtype=np.float64))
        counts["truncated_share"] = removed / total
    return lengths, keep, counts


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
        arr = read_source(path)
        what = f"lengths from {path}"
    elif isinstance(source, np.ndarray) and source.dtype != object:
        arr, what = source, "lengths"
    else:
        return load_lengths(source)
    if arr.ndim != 1:
        raise LengthError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise LengthError(f"{what} are empty: there is nothing to plan")
    check_dtype(arr, what)
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
    folder of Parquet shards), or a bundled name (see :func:`bundled_names`; a file
    of the same name in the working folder is read instead). With ``max_len``,
    longer samples are truncated to it (the result remembers what it cut, and a
    plan of it counts those samples in ``truncated``), or raise with
    ``on_overflow="error"``. ``"drop"`` cannot remove rows without misaligning
    them from the data set, so here it is validated only: pass ``max_len`` and
    ``on_overflow`` to :func:`lengthwise.plan_epoch`, which drops and counts.

    Example::

        >>> load_lengths([10, 70000, 3], max_len=8192).tolist()
        [10, 8192, 3]
    """
    earlier = load_record(source)
    if isinstance(source, (str, os.PathLike)):
        raw = read_source(source)
        what = f"lengths from {os.fspath(source)}"
    else:
        raw = source
        what = "lengths"
    if on_overflow not in OVERFLOW_POLICIES:
        raise ConfigError(f"on_overflow must be one of {OVERFLOW_POLICIES}, got {on_overflow!r}")
    lengths = validate_lengths(raw, what=what)
    max_len = check_max_len(max_len)
    if max_len is not None and on_overflow != "drop":
        over = lengths > max_len
        if over.any():
            if on_overflow == "error":
                apply_overflow(lengths, max_len, "error")
            cut = np.where(over, lengths - max_len, 0)
            earlier = cut if earlier is None else earlier + cut
            lengths = np.minimum(lengths, max_len)
    return lengths if earlier is None else LoadedLengths.of(lengths, earlier)
