"""Forming micro-batches: inside buckets, greedily along an order, and evening out counts.

Micro-batches are held as two flat arrays, like a CSR matrix: ``indices`` (sample
ids of all batches, concatenated) and ``offsets`` (``M + 1`` boundaries), so
millions of samples never become millions of Python objects.

Example::

    >>> lens = np.array([5, 9, 3, 8])
    >>> idx, off = greedy_batches(np.arange(4), lens, row_limit(max_tokens=18))
    >>> [idx[a:b].tolist() for a, b in zip(off[:-1], off[1:])]
    [[0, 1], [2, 3]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.errors import ConfigError, DataError
from lengthwise.planning.cost import CostModel, round_up


@dataclass(frozen=True)
class RowLimit:
    """The batch rule: how many rows of padded length ``P`` fit one micro-batch."""

    batch_size: int | None = None
    budget: float | None = None
    cost: CostModel = CostModel()
    pad_multiple: int = 1

    def rows(self, longest: np.ndarray) -> np.ndarray:
        """Rows allowed for micro-batches whose longest sample is ``longest``."""
        longest = np.asarray(longest)
        if self.batch_size is not None:
            return np.full(longest.shape, self.batch_size, dtype=np.int64)
        per_row = self.cost.row_cost(round_up(longest, self.pad_multiple))
        return np.floor(self.budget / per_row).astype(np.int64)

    def max_length(self) -> int | None:
        """The longest sample that fits one row within the budget (None: no limit)."""
        if self.budget is None:
            return None
        m = max(1, self.pad_multiple)
        c = self.cost
        if not c.linear:  # the capped term: the largest multiple of m found by bisection
            return _largest_within(c, self.budget, m)
        # largest P with a*P + b*P^2 + c <= budget, then down to a multiple of m
        if c.b > 0:
            p = (-c.a + np.sqrt(c.a * c.a + 4 * c.b * (self.budget - c.c))) / (2 * c.b)
        else:
            p = (self.budget - c.c) / c.a
        p = int(np.floor(p + 1e-9)) // m * m
        while p > 0 and c.row_cost(p) > self.budget:
            p -= m
        return p


def _largest_within(cost: CostModel, budget: float, multiple: int) -> int | None:
    """The largest multiple of ``multiple`` whose row costs at most ``budget`` (0: none;
    ``None``: any length, a cost that stops growing at its cap within the budget)."""
    if cost.a == 0 and cost.b == 0 and cost.row_cost(cost.cap) <= budget:
        return None
    lo, hi = 0, 1
    while cost.row_cost(hi * multiple) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # row_cost(lo * multiple) <= budget < row_cost(hi * multiple)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost.row_cost(mid * multiple) <= budget else (lo, mid)
    return lo * multiple


def whole_number(name: str, value, *, minimum: int = 1) -> int:
    """``value`` as an int: a whole number (never a bool or a float) of at least ``minimum``.

    Example::

        >>> whole_number("batch_size", 8)
        8
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        kind = {0: "a non-negative", 1: "a positive"}.get(minimum, f"a >= {minimum}")
        raise ConfigError(f"{name} must be {kind} whole number (>= {minimum}), got {value}")
    return int(value)


def row_limit(*, batch_size: int | None = None, max_tokens: int | None = None,
              cost: CostModel | None = None, max_cost: float | None = None,
              pad_multiple: int = 1) -> RowLimit:
    """Build the batch rule from exactly one of ``batch_size``, ``max_tokens``, ``max_cost``.

    Example::

        >>> row_limit(max_tokens=8, pad_multiple=16)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: max_tokens=8 cannot hold a single row of ...
    """
    given = [x is not None for x in (batch_size, max_tokens, max_cost)]
    if sum(given) != 1:
        raise ConfigError("give exactly one of batch_size, max_tokens or max_cost")
    pad_multiple = whole_number("pad_multiple", pad_multiple)
    if batch_size is not None:
        return RowLimit(batch_size=whole_number("batch_size", batch_size),
                        pad_multiple=pad_multiple)
    if max_tokens is not None:
        max_tokens = whole_number("max_tokens", max_tokens)
        if max_tokens < pad_multiple:
            raise ConfigError(f"max_tokens={max_tokens} cannot hold a single row of "
                              f"pad_multiple={pad_multiple} tokens; raise max_tokens or lower "
                              "pad_multiple")
        return RowLimit(budget=float(max_tokens), pad_multiple=pad_multiple)
    if cost is None:
        raise ConfigError("max_cost needs a cost model: cost=CostModel(a, b, c)")
    if not isinstance(cost, CostModel):
        raise TypeError(f"cost must be a lengthwise.CostModel, got {cost!r}")
    if isinstance(max_cost, bool) or not isinstance(max_cost, (int, float, np.integer,
                                                               np.floating)):
        raise TypeError(f"max_cost must be a number, got {max_cost!r}")
    if not np.isfinite(max_cost) or max_cost <= 0:
        raise ConfigError(f"max_cost must be a finite number > 0, got {max_cost}")
    limit = RowLimit(budget=float(max_cost), cost=cost, pad_multiple=pad_multiple)
    longest = limit.max_length()  # None: any length fits one row
    if longest is not None and longest < 1:
        raise ConfigError(f"max_cost={max_cost} with {cost} cannot hold a single row of "
                          f"pad_multiple={pad_multiple} tokens; raise max_cost")
    return limit


def index_dtype(n: int) -> type:
    """The smallest integer type that holds sample ids below ``n``.

    Example::

        >>> index_dtype(1000) is np.int32
        True
    """
    return np.int32 if n < 2**31 else np.int64


def bucket_dtype(buckets: int) -> type:
    """The smallest unsigned type that holds the ids of ``buckets`` buckets (radix-sortable).

    Example::

        >>> bucket_dtype(6) is np.uint8
        True
    """
    return np.uint8 if buckets <= 256 else np.uint16 if buckets <= 65536 else np.int64


def bucket_batches(ids: np.ndarray | None, bucket: np.ndarray, rows: np.ndarray,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shuffle samples inside each bucket and cut them into full micro-batches.

    ``bucket[i]`` is the bucket of ``ids[i]`` (``ids=None``: of sample ``i``); bucket
    ``k`` allows ``rows[k]`` rows. The few samples left over in a bucket join the next
    (longer) bucket's first batch, where they fit because they are shorter than its edge,
    so every batch but the last one is full. Returns ``(indices, offsets, batch_bucket)``,
    the indices as int32 below 2**31 samples with ``ids=None`` (``np.intp`` otherwise); a
    new ``rng`` re-forms every batch.
    """
    # narrow positions: half the memory of int64, the same draws as for any integer type
    perm = np.arange(bucket.size, dtype=index_dtype(bucket.size))
    rng.shuffle(perm)
    small = bucket.astype(bucket_dtype(rows.size), copy=False)
    grouped = perm[np.argsort(small[perm], kind="stable")]  # radix sort: one pass
    del perm
    sizes = np.bincount(small, minlength=rows.size)
    cuts = _bucket_cuts(sizes, rows)
    starts = [np.arange(pos, pos + full * int(rows[k]), int(rows[k])) for k, pos, full in cuts]
    tags = [np.full(full, k) for k, _, full in cuts]
    placed = _placed(cuts, rows)
    if placed < bucket.size:  # what the longest bucket left over
        starts.append(np.array([placed]))
        tags.append(np.array([rows.size - 1]))
    offsets = np.append(np.concatenate(starts), bucket.size).astype(np.int64)
    indices = grouped if ids is None else np.asarray(ids, dtype=np.intp)[grouped]
    return indices, offsets, np.concatenate(tags).astype(np.int64)


def _bucket_cuts(sizes: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, int]]:
    """``(bucket, first position, full batches)`` of the buckets that fill at least one batch,
    along the samples grouped by bucket (``sizes[k]`` of bucket ``k``): what a bucket leaves
    over joins the next bucket's first batch."""
    out = []
    pos = 0
    begin = 0
    for k, end in enumerate(np.cumsum(sizes).tolist()):
        r = int(rows[k])
        if r < 1:  # not even one row of this bucket's edge fits the budget
            if end > begin:
                raise ConfigError(f"bucket {k} holds {end - begin} samples, but not even one row "
                                  "of its upper edge fits the budget; lower the edge to what one "
                                  "row of the budget holds")
            continue
        begin = end
        full = (end - pos) // r
        if full > 0:
            out.append((k, pos, full))
            pos += full * r
    return out


def bucket_batch_count(sizes: np.ndarray, rows: np.ndarray) -> int:
    """Micro-batches :func:`bucket_batches` cuts from buckets of ``sizes`` samples, without
    shuffling or sorting a sample.

    Example::

        >>> bucket_batch_count(np.array([5, 3]), np.array([2, 2]))
        4
    """
    cuts = _bucket_cuts(sizes, rows)
    return sum(full for _, _, full in cuts) + int(_placed(cuts, rows) < int(np.sum(sizes)))


def _placed(cuts: list[tuple[int, int, int]], rows: np.ndarray) -> int:
    """Samples the full batches of ``cuts`` hold."""
    return sum(full * int(rows[k]) for k, _, full in cuts)


def greedy_batches(ids: np.ndarray, lengths: np.ndarray, limit: RowLimit,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``ids`` (in the given order) into consecutive micro-batches under ``limit``.

    A batch grows while ``rows * row_cost(round_up(longest))`` stays within the
    budget (or up to ``batch_size`` rows), as fairseq's ``batch_by_size`` does.
    """
    n = ids.size
    if limit.batch_size is not None:
        offsets = np.append(np.arange(0, n, limit.batch_size), n)
        return ids, offsets.astype(np.int64)
    lens = lengths[ids]
    top = int(lens.max())
    table = limit.cost.row_cost(round_up(np.arange(top + 1), limit.pad_multiple)).tolist()
    budget = limit.budget
    cuts = [0]
    rows, longest = 0, 0
    for pos, length in enumerate(lens.tolist()):
        m = length if length > longest else longest
        if rows and (rows + 1) * table[m] > budget:
            cuts.append(pos)
            rows, m = 0, length
        rows += 1
        longest = m
    cuts.append(n)
    return ids, np.asarray(cuts, dtype=np.int64)


def sorted_padded_tokens(values: np.ndarray, counts: np.ndarray, limit: RowLimit) -> int:
    """Padded tokens of :func:`greedy_batches` along the lengths sorted ascending, from their
    histogram (``counts[k]`` samples of length ``values[k]``, ascending) in one pass over it.

    Example::

        >>> sorted_padded_tokens(np.array([5, 9]), np.array([3, 1]), row_limit(max_tokens=18))
        24
    """
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    padded = np.asarray(round_up(values, limit.pad_multiple), dtype=np.int64).tolist()
    if limit.batch_size is not None:  # cuts every batch_size samples: each ends at a length
        ends = np.arange(limit.batch_size, int(counts.sum()) + limit.batch_size,
                         limit.batch_size)
        ends[-1] = counts.sum()
        last = np.searchsorted(np.cumsum(counts), ends, side="left")
        rows = np.diff(ends, prepend=0)
        return int(np.sum(rows * np.asarray(padded, dtype=np.int64)[last]))
    table = limit.cost.row_cost(np.asarray(padded)).tolist()
    budget = limit.budget
    total, rows, longest = 0, 0, 0
    for v, c, t in zip(padded, counts.tolist(), table, strict=True):
        # rows of length v one batch may hold: q with q * t <= budget, as greedy_batches checks
        cap = max(1, int(budget // t))
        while (cap + 1) * t <= budget:
            cap += 1
        while cap > 1 and cap * t > budget:
            cap -= 1
        if rows and rows >= cap:  # the next sample of length v does not fit: cut
            total += rows * longest
            rows = 0
        take = min(c, cap - rows)
        rows += take
        longest = v
        c -= take
        if c:
            total += rows * v + (c // cap) * cap * v
            rows = c % cap
    return total + rows * longest


def batch_longest(lengths: np.ndarray, indices: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Longest sample of each micro-batch."""
    return longest_per_batch(lengths[indices], offsets)


def longest_per_batch(sample_lens: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Longest sample of each micro-batch, from the samples' lengths in schedule order.

    Example::

        >>> longest_per_batch(np.array([3, 9, 5]), np.array([0, 2, 3])).tolist()
        [9, 5]
    """
    if offsets.size <= 1:
        return np.zeros(0, dtype=np.int64)
    return np.maximum.reduceat(sample_lens, offsets[:-1])


def batch_padded_lengths(lengths: np.ndarray, indices: np.ndarray, offsets: np.ndarray,
                         pad_multiple: int = 1) -> np.ndarray:
    """Padded length of each micro-batch: its longest sample rounded up to ``pad_multiple``.

    Example::

        >>> batch_padded_lengths(np.array([3, 9, 5]), np.arange(3), np.array([0, 2, 3]), 8).tolist()
        [16, 8]
    """
    return np.asarray(round_up(batch_longest(lengths, indices, offsets), pad_multiple))


@dataclass
class EvenOutReport:
    """What evening out the micro-batch count did."""

    split_batches: int = 0
    dropped: int = 0
    repeated: int = 0


def even_out(indices: np.ndarray, offsets: np.ndarray, tags: np.ndarray, multiple: int,
             policy: str, rng: np.random.Generator,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, EvenOutReport]:
    """Make the number of micro-batches a multiple of ``multiple`` (the world size).

    ``split`` (default) halves the largest batches, so every sample stays exactly
    once; ``drop`` leaves out whole batches; ``repeat`` adds batches of samples
    drawn again. ``tags`` (for example bucket ids) follow their batches.
    """
    report = EvenOutReport()
    m = offsets.size - 1
    short = (-m) % multiple
    if short == 0:
        return indices, offsets, tags, report
    sizes = np.diff(offsets)
    keep = evened_count(m, indices.size, multiple, policy)  # checks what the policy can do
    if policy == "split":
        # halve the largest batch, `short` times (arrays, not lists: m may be 100,000s)
        new_sizes, new_tags = sizes.astype(np.int64), np.asarray(tags)
        for _ in range(short):
            i = int(np.argmax(new_sizes))
            half = new_sizes[i] // 2
            new_sizes = np.concatenate((new_sizes[:i], [new_sizes[i] - half, half],
                                        new_sizes[i + 1:]))
            new_tags = np.concatenate((new_tags[:i], new_tags[i : i + 1], new_tags[i:]))
        report.split_batches = short
        off = np.concatenate(([0], np.cumsum(new_sizes))).astype(np.int64)
        return indices, off, new_tags.astype(tags.dtype), report
    if policy == "drop":
        drop = rng.choice(m, size=m - keep, replace=False)
        mask = np.ones(m, dtype=bool)
        mask[drop] = False
        report.dropped = int(sizes[~mask].sum())
        sel = np.repeat(mask, sizes)
        return (indices[sel], np.concatenate(([0], np.cumsum(sizes[mask]))).astype(np.int64),
                tags[mask], report)
    if policy == "repeat":
        extra = rng.choice(m, size=short, replace=short > m)
        starts, stops = offsets[extra], offsets[extra + 1]
        more = np.concatenate([indices[a:b] for a, b in zip(starts, stops, strict=True)])
        report.repeated = int(more.size)
        off = np.concatenate((offsets, offsets[-1] + np.cumsum(sizes[extra])))
        return np.concatenate((indices, more)), off, np.concatenate((tags, tags[extra])), report
    raise AssertionError(f"unreachable: evened_count accepted even_out={policy!r}")


def evened_count(m: int, samples: int, multiple: int, policy: str) -> int:
    """Micro-batches :func:`even_out` leaves of ``m`` batches holding ``samples`` samples.

    Example::

        >>> evened_count(10, 40, 4, "split"), evened_count(10, 40, 4, "drop")
        (12, 8)
    """
    short = (-m) % multiple
    if short == 0:
        return m
    if policy == "split":
        if samples < m + short:
            raise DataError(
                f"{samples} samples cannot give each of {multiple} ranks the same number "
                f"of micro-batches ({m} batches, {m + short} needed); use fewer ranks, or "
                "even_out='drop' or 'repeat'")
        return m + short
    if policy == "drop":
        keep = m - (m % multiple)
        if keep == 0:
            raise ConfigError(f"even_out='drop' would drop every batch ({m} < {multiple} ranks)")
        return keep
    if policy == "repeat":
        return m + short
    raise ConfigError(f"even_out must be 'split', 'drop' or 'repeat', got {policy!r}")


def take_batches(indices: np.ndarray, offsets: np.ndarray, order: np.ndarray,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Reorder micro-batches: batch ``order[k]`` becomes batch ``k``.

    Example::

        >>> idx, off = take_batches(np.array([7, 8, 9]), np.array([0, 2, 3]), np.array([1, 0]))
        >>> idx.tolist(), off.tolist()
        ([9, 7, 8], [0, 1, 3])
    """
    sizes = np.diff(offsets)[order]
    new_off = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    starts = offsets[:-1][order]
    # position of every output element in the input: one step on inside a batch, a jump
    # from the end of the previous (non-empty) batch to the start of the next one
    held = sizes > 0
    starts, sizes = starts[held], sizes[held]
    jump = starts.copy()
    jump[1:] -= starts[:-1] + sizes[:-1] - 1
    src = np.ones(new_off[-1], dtype=np.intp)
    src[new_off[:-1][held]] = jump
    return indices[np.cumsum(src, out=src)], new_off
