"""The packed layout: samples concatenated into rows of ``C`` tokens, no padding.

``plan_epoch(lengths, max_tokens=C, layout="pack")`` calls
:func:`plan_packed_epoch`. Every micro-batch is one row (or ``rows_per_batch``
rows) whose lengths sum to at most ``C``. Rows are not cut from a global sort:

1. **Stratified mix.** Samples sorted by length are cut into blocks of equal
   length rank; a fresh random permutation per block and epoch deals one sample of
   every block to every *cell* (a chunk of ~4 rows' worth of samples), so each
   chunk holds the data set's length mix and is re-drawn every epoch.
2. **Near best fit.** Many independent packers (*lanes*) run in lock-step, one
   NumPy operation serving all of them: each takes its chunks' samples longest
   first and puts each into the fullest of its ``pool`` open rows that still has
   room (best fit), keeping partly filled rows open from chunk to chunk; a row
   closes when nearly full, or when a new row needs its place. Rows under 98 %
   full, and the least full under 99.5 % within a budget of items, are repacked
   together by best fit in a jittered decreasing order. Fill comes out within a
   few rows of ``ceil(tokens / C)``, about what best fit decreasing over the
   whole sorted set reaches.
3. **Balance.** Rows are priced with the cost model (``a*tokens + b*sum(L^2) +
   c*samples``; default ``a=1``) and grouped ``world_size`` at a time within 2 %
   of each other's cost (the micro-batches that run side by side on the ranks in
   one accumulation slot; inside a cost class, mixed by ``sum(L^2)``). Groups are
   dealt to optimizer steps in a snake order of their ``sum(L^2)``, so every step
   gets light and heavy rows alike and no rank waits on another.

Samples longer than ``C`` follow ``on_overflow``: ``"split"`` cuts them into
consecutive pieces of at most ``C`` tokens (``plan.token_spans`` holds the
``(start, length)`` of every entry of ``plan.indices``), ``"truncate"``,
``"drop"`` or ``"error"`` as for the padded layout. With ``split``, ``max_len``
(if given) first truncates samples to that many tokens.

Example::

    >>> import numpy as np
    >>> from lengthwise.plan import plan_epoch
    >>> lens = np.random.default_rng(0).integers(1, 3000, 5000)
    >>> plan = plan_epoch(lens, max_tokens=8192, layout="pack", world_size=2)
    >>> bool(all(lens[plan.batch(k)].sum() <= 8192 for k in range(plan.total_batches)))
    True
    >>> plan.stats["padding_efficiency"] > 0.99
    True
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lengthwise import batching, metrics
from lengthwise.cost import CostModel
from lengthwise.plan import EpochPlan, PlanConfig, index_dtype, prepare_lengths

__all__ = ["PackedEpochPlan", "pack_rows", "plan_packed_epoch", "schedule_groups"]

PACK_ORDERS = ("stratified", "random")
PACK_OVERFLOW = ("split", "truncate", "drop", "error")

# random streams of one (seed, epoch), apart from those of the padded planner
_STREAM_DEAL, _STREAM_EVEN, _STREAM_ORDER = 11, 12, 13

#: open rows per lane
POOL = 8
#: rows under this fill are repacked at the end ...
REPACK_BELOW = 0.98
#: ... and, lowest fill first, those under this one while the items stay within the budget
REPACK_TRY = 0.995
#: items that may be repacked beyond those of rows under ``REPACK_BELOW``
REPACK_BUDGET = 20_000
#: relative jitter of the lengths that order the repacked items
JITTER = 0.03
#: rows' worth of tokens per chunk of a lane
ROWS_PER_CHUNK = 4
#: relative width of the cost classes whose micro-batches may share an accumulation slot
COST_CLASS = 0.02


@dataclass
class PackedEpochPlan(EpochPlan):
    """An :class:`EpochPlan` of packed rows, with per-row and per-piece helpers.

    ``offsets`` bounds micro-batches; with ``rows_per_batch > 1``, ``row_offsets``
    bounds the rows inside them. With ``on_overflow="split"``, ``token_spans[i]``
    is the ``(start, length)`` of entry ``i`` of ``indices`` within its sample.
    """

    @property
    def capacity(self) -> int:
        """Tokens per row (``max_tokens``)."""
        return int(self.config.max_tokens)

    def piece_lengths(self) -> np.ndarray:
        """Tokens of every entry of ``indices`` (a piece when samples were split)."""
        if self.token_spans is not None:
            return self.token_spans[:, 1].astype(np.int64)
        return self.lengths[self.indices]

    def batch_spans(self, k: int) -> np.ndarray | None:
        """``(start, length)`` rows of micro-batch ``k``'s entries (None: no splitting)."""
        if self.token_spans is None:
            return None
        return self.token_spans[self.offsets[k] : self.offsets[k + 1]]

    def batch_rows(self, k: int) -> list[np.ndarray]:
        """Sample ids of micro-batch ``k``, one array per packed row."""
        lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
        if self.row_offsets is None:
            return [self.indices[lo:hi]]
        bounds = self.row_offsets[(self.row_offsets >= lo) & (self.row_offsets <= hi)]
        return [self.indices[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    @cached_property
    def stats(self) -> dict:
        """METRICS.md figures (fill as ``padding_efficiency``) plus packing counts."""
        cfg = self.config
        rows_per = cfg.rows_per_batch
        pieces = self.piece_lengths()
        out = metrics.batch_stats(
            pieces, np.arange(pieces.size), self.offsets, world_size=cfg.world_size,
            grad_accum=cfg.grad_accum, cost=cfg.cost, capacity=self.capacity * rows_per,
            seed=self.seed)
        key = self.indices.astype(np.int64)
        if self.token_spans is not None:  # a piece is (sample, start)
            key = key * (int(self.lengths.max()) + 1) + self.token_spans[:, 0]
        rows = (self.row_offsets.size - 1 if self.row_offsets is not None
                else self.total_batches)
        tokens = int(pieces.sum())
        best_rows = -(-tokens // self.capacity)
        out.update(
            pieces=int(pieces.size), unique_samples=int(np.unique(self.indices).size),
            repeated_in_schedule=int(key.size - np.unique(key).size),
            max_same_bucket_run=None, layout="pack", capacity=self.capacity, rows=int(rows),
            rows_per_batch=rows_per,
            fill=out["padding_efficiency"], best_rows=int(best_rows),
            efficiency_vs_sorted=best_rows / rows if rows else None,
            order=cfg.order, num_buckets=1, edges=list(self.edges),
            num_batches=self.num_batches, plan_seconds=self.plan_seconds)
        cost = cfg.cost or CostModel()
        out["cost_model"] = {"a": cost.a, "b": cost.b, "c": cost.c}
        out.update(self.counts)
        return out


# ------------------------------------------------------------------ packing


def _best_fit_decreasing(lengths: np.ndarray, capacity: int,
                         rng: np.random.Generator | None = None,
                         ) -> tuple[np.ndarray, np.ndarray, int]:
    """Best fit decreasing: (row of each item, position in its row, number of rows).

    With ``rng``, items go in a nearly decreasing order (lengths jittered by up to
    ``JITTER``), so rows differ from draw to draw at no cost in fill.
    """
    key = lengths.astype(np.float64)
    if rng is not None:
        key *= 1 + JITTER * rng.uniform(-1, 1, key.size)
    order = np.argsort(-key, kind="stable")
    row = np.empty(lengths.size, dtype=np.int64)
    rank = np.empty(lengths.size, dtype=np.int64)
    gaps: list[tuple[int, int]] = []  # open rows as (room, row), sorted
    used: list[int] = []
    for i, x in zip(order.tolist(), lengths[order].tolist(), strict=True):
        p = bisect.bisect_left(gaps, (x, -1))
        if p == len(gaps):
            room, r = capacity, len(used)
            used.append(0)
        else:
            room, r = gaps.pop(p)
        row[i], rank[i] = r, used[r]
        used[r] += 1
        if room > x:
            bisect.insort(gaps, (room - x, r))
    return row, rank, len(used)


def _deal(lengths: np.ndarray, capacity: int, chunk: int, lanes: int,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Deal items to cells: one item of every length block to every cell.

    Returns ``(items, lengths)`` tables of shape ``(chunk, cells)``: column ``c`` is
    cell ``c``'s items, longest first (``-1`` and length 0 where items ran out).
    Row ``j`` holds the ``j``-th length block in an order drawn from ``rng``.
    """
    n = lengths.size
    small = lengths.astype(np.uint16 if capacity < 2**16 else np.uint32)
    key = np.subtract(capacity, small, dtype=small.dtype)
    cells = -(-n // chunk)
    cells = -(-cells // lanes) * lanes  # the same number of cells for every lane
    items = np.empty(chunk * cells, dtype=np.int32 if n < 2**31 else np.int64)
    items[:n] = np.argsort(key, kind="stable")  # a radix sort: longest first
    del key
    items[n:] = -1
    items = rng.permuted(items.reshape(chunk, cells), axis=1, out=items.reshape(chunk, cells))
    table_len = np.append(small, 0)[items]  # -1 reads the appended 0
    return items, table_len.astype(np.int32)


def _lockstep(table_len: np.ndarray, capacity: int, lanes: int, pool: int,
              close_at: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Run ``lanes`` pooled best-fit packers in lock-step over dealt lengths.

    Step ``(k, j)`` gives lane ``l`` the item at ``table_len[j, k*lanes + l]``
    (chunk ``k`` of the lane, its ``j``-th longest item). Returns, per table entry,
    its row and its position in that row, and the number of rows opened.

    Every slot of a lane's pool is encoded as ``room << shift | slot`` while open
    and ``slot - 2**shift`` (negative) while free, so one unsigned minimum over
    the slots of ``encoded - length << shift`` finds, for all lanes at once, the
    fullest open row that still has room, with the row's new encoding.
    """
    chunk, cells = table_len.shape
    shift = max(1, (pool - 1).bit_length())
    mask = np.int32((1 << shift) - 1)
    encoded = (np.arange(pool, dtype=np.int32)[:, None] - np.int32(1 << shift)
               ).repeat(lanes, axis=1)  # (pool, lanes), all free
    flat_enc = encoded.reshape(-1)
    row_of = np.zeros(pool * lanes, dtype=np.int32)  # the row in each slot
    used = np.zeros(pool * lanes, dtype=np.int32)  # and the items placed in it
    out_row = np.empty((chunk, cells), dtype=np.int32)
    out_rank = np.empty((chunk, cells), dtype=np.int32)
    lane = np.arange(lanes, dtype=np.int32)
    none_fits = np.uint32(2**31)
    close_below = np.int32((close_at + 1) << shift)
    full_code = np.int32(capacity << shift)
    scaled = table_len << shift
    placed = (table_len > 0).astype(np.int32)
    row_ids = np.arange(table_len.size, dtype=np.int32)  # at most one new row per item
    next_row = 0
    for k in range(cells // lanes):
        cols = slice(k * lanes, (k + 1) * lanes)
        for j in range(chunk):
            x = scaled[j, cols]
            best = (encoded - x).view(np.uint32).min(axis=0)
            need = best >= none_fits
            if need.any():  # open a row: a free slot, else close the fullest row
                new = need.nonzero()[0]
                slot = encoded[:, new].min(axis=0) & mask
                flat = slot * lanes + new
                row_of[flat] = row_ids[next_row : next_row + new.size]
                used[flat] = 0
                next_row += new.size
                best[new] = (full_code + slot - x[new]).view(np.uint32)
            best = best.view(np.int32)
            flat = (best & mask) * lanes + lane
            out_row[j, cols] = row_of[flat]
            rank = used[flat]
            out_rank[j, cols] = rank
            used[flat] = rank + placed[j, cols]
            flat_enc[flat] = np.where(best < close_below, (best & mask) - (mask + 1), best)
    return out_row, out_rank, next_row


def _rows_to_keep(fill: np.ndarray, size: np.ndarray, budget: int) -> np.ndarray:
    """Rows to keep as packed: all but those under ``REPACK_BELOW`` and, lowest fill
    first, those under ``REPACK_TRY`` whose items fit in what is left of ``budget``."""
    keep = fill >= REPACK_BELOW
    left = budget - int(size[~keep].sum())
    maybe = np.flatnonzero(keep & (fill < REPACK_TRY))
    if left > 0 and maybe.size:
        maybe = maybe[np.argsort(fill[maybe], kind="stable")]
        keep[maybe[np.cumsum(size[maybe]) <= left]] = False
    return keep


def pack_rows(lengths: np.ndarray, capacity: int, rng: np.random.Generator, *,
              lanes: int | None = None, pool: int = POOL,
              ) -> tuple[np.ndarray, np.ndarray]:
    """Pack items of ``lengths`` (each ``<= capacity``) into rows; return (order, offsets).

    Row ``r`` holds items ``order[offsets[r]:offsets[r+1]]``. Rows mix lengths at
    random (a new mix for every ``rng``) and fill within a row or two of the least
    possible number, ``ceil(sum / capacity)``. Linear in the number of items.

    Example::

        >>> lens = np.random.default_rng(0).integers(1, 500, 1000)
        >>> order, off = pack_rows(lens, 2048, np.random.default_rng(1))
        >>> bool(np.add.reduceat(lens[order], off[:-1]).max() <= 2048)
        True
        >>> off.size - 1 - int(-(-lens.sum() // 2048)) <= 2
        True
    """
    lengths = np.asarray(lengths)
    if lengths.dtype.kind not in "iu":
        lengths = lengths.astype(np.int64)
    n = lengths.size
    if n == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    if lengths.min() < 1 or lengths.max() > capacity:
        raise ValueError(f"item lengths must lie in [1, {capacity}]")
    if pool < 1:
        raise ValueError(f"pool must be >= 1, got {pool}")
    if capacity << max(1, (pool - 1).bit_length()) >= 2**31:
        raise ValueError(f"capacity {capacity} is too large for a pool of {pool} rows")
    if lanes is None:
        lanes = int(np.clip(n // 4096, 1, 1024))
    chunk = int(np.clip(round(ROWS_PER_CHUNK * capacity / lengths.mean()), 8, 512))
    items, table_len = _deal(lengths, capacity, chunk, lanes, rng)
    row, rank, num_rows = _lockstep(table_len, capacity, lanes, pool, capacity // 512)
    items, row, rank = items.reshape(-1), row.reshape(-1), rank.reshape(-1)
    tokens = np.bincount(row, weights=table_len.reshape(-1), minlength=num_rows)
    del table_len
    real = items >= 0
    keep = _rows_to_keep(tokens / capacity, np.bincount(row, minlength=num_rows)
                         - np.bincount(row[~real], minlength=num_rows), max(REPACK_BUDGET, n // 50))
    new_id = (np.cumsum(keep) - 1).astype(np.int32)
    kept_rows = int(new_id[-1]) + 1 if num_rows else 0
    stay = keep[row] & real
    items_stay, row, rank = items[stay], new_id[row[stay]], rank[stay]
    sizes = np.bincount(row, minlength=kept_rows)
    # the rest by best fit decreasing
    left = items[~stay & real]
    left_row, left_rank, left_rows = _best_fit_decreasing(lengths[left], capacity, rng)
    sizes = np.concatenate((sizes, np.bincount(left_row, minlength=left_rows)))
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    order = np.empty(n, dtype=items.dtype)
    order[offsets[row] + rank] = items_stay
    order[offsets[kept_rows + left_row] + left_rank] = left
    return order, offsets


# ----------------------------------------------------------------- schedule


def _snake(num_bins: int, count: int) -> np.ndarray:
    """Bin of each of ``count`` items in snake order (0..B-1, B-1..0, ...)."""
    pos = np.arange(count)
    rnd, at = divmod(pos, num_bins)
    return np.where(rnd % 2 == 0, at, num_bins - 1 - at)


def _slot_groups(cost: np.ndarray, weight: np.ndarray, world_size: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Micro-batches in groups of ``world_size`` of nearly equal cost, ``(groups, W)``.

    Sorted by cost and cut into groups, micro-batches all of one cost class
    (``COST_CLASS`` wide) are dealt again inside their run of such groups: sorted by
    weight, in snake order, so a group takes one light and one heavy micro-batch
    where costs allow it, and its weight is that of its class, not of one extreme.
    """
    m, w = cost.size, world_size
    by_cost = np.lexsort((rng.random(m), cost))
    groups = by_cost.reshape(-1, w)
    cls = np.floor(np.log(np.maximum(cost, 1e-300)) / math.log1p(COST_CLASS))
    lo, hi = cls[groups[:, 0]], cls[groups[:, -1]]
    pure = lo == hi
    new_block = np.ones(lo.size, dtype=bool)
    new_block[1:] = ~pure[1:] | ~pure[:-1] | (lo[1:] != lo[:-1])
    block = np.cumsum(new_block) - 1
    first = np.flatnonzero(new_block)
    size = np.diff(np.append(first, lo.size))  # groups per block
    row_block = np.repeat(block, w)
    dealt = by_cost[np.lexsort((rng.random(m), weight[by_cost], row_block))]
    k = size[row_block]
    pos = np.arange(m) - first[row_block] * w
    rnd, at = np.divmod(pos, k)
    group = first[row_block] + np.where(rnd % 2 == 0, at, k - 1 - at)
    out = np.empty((lo.size, w), dtype=np.int64)
    out[group, rnd] = dealt
    return out


def schedule_groups(cost: np.ndarray, weight: np.ndarray, world_size: int, grad_accum: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Schedule order of micro-batches: balanced across ranks, representative per step.

    Micro-batches form groups of ``world_size`` of nearly equal cost (within one
    ``COST_CLASS``, mixed by ``weight`` where costs allow): the micro-batches of one
    accumulation slot, run side by side on the ranks. Groups sorted by weight (their
    ``sum(L^2)``) are dealt to steps in snake order, ``grad_accum`` per step, so
    every step holds light and heavy groups and steps carry similar token-weighted
    lengths. Steps run in random order; slots and ranks are drawn at random inside
    them. Returns ``order``: micro-batch ``order[k]`` runs ``k``-th.

    Example::

        >>> order = schedule_groups(np.array([1., 9, 1, 9]), np.array([1., 81, 1, 81]), 2, 1,
        ...                         np.random.default_rng(0))
        >>> sorted(order[:2].tolist()) in ([0, 2], [1, 3])
        True
    """
    m = cost.size
    w, g = world_size, grad_accum
    if m % w:
        raise ValueError(f"{m} micro-batches do not split evenly over {w} ranks")
    groups = _slot_groups(cost, weight, w, rng)
    n_groups = groups.shape[0]
    group_weight = weight[groups].sum(axis=1)
    full, rem = divmod(n_groups, g)
    by_weight = np.argsort(group_weight, kind="stable")
    # the last, partial step takes groups spread evenly over the weight order
    last = by_weight[((np.arange(rem) + 0.5) * n_groups / rem).astype(np.int64)] if rem else \
        np.zeros(0, dtype=np.int64)
    rest = by_weight[~np.isin(by_weight, last)] if rem else by_weight
    step = np.empty(n_groups, dtype=np.int64)
    if full:
        step[rest] = rng.permutation(full)[_snake(full, rest.size)]
    step[last] = full
    # slot inside the step at random, rank inside the group at random
    by_step = np.lexsort((rng.random(n_groups), step))
    start = np.searchsorted(step[by_step], step[by_step], side="left")
    slot = np.arange(n_groups) - start
    position = np.empty(n_groups, dtype=np.int64)
    position[by_step] = step[by_step] * g + slot
    members = rng.permuted(groups, axis=1)
    order = np.empty(m, dtype=np.int64)
    order[(position[:, None] * w + np.arange(w)).reshape(-1)] = members.reshape(-1)
    return order


def _row_prices(pieces: np.ndarray, offsets: np.ndarray, cost: CostModel,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Cost and ``sum(L^2)`` of every row."""
    starts = offsets[:-1]
    tokens = np.add.reduceat(pieces, starts, dtype=np.int64).astype(np.float64)
    wide = pieces.astype(np.int64)
    sq = np.add.reduceat(np.multiply(wide, wide, out=wide), starts).astype(np.float64)
    count = np.diff(offsets).astype(np.float64)
    return cost.a * tokens + cost.b * sq + cost.c * count, sq


# --------------------------------------------------------------------- plan


def _check(config: PlanConfig) -> int:
    if config.max_tokens is None:
        raise ValueError("layout='pack' needs max_tokens: the tokens of one packed row")
    if config.order not in PACK_ORDERS:
        raise ValueError(f"layout='pack' supports order in {PACK_ORDERS}, got {config.order!r}")
    if config.on_overflow not in PACK_OVERFLOW:
        raise ValueError(f"on_overflow must be one of {PACK_OVERFLOW}, "
                         f"got {config.on_overflow!r}")
    if not isinstance(config.rows_per_batch, (int, np.integer)) or config.rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be a positive integer, "
                         f"got {config.rows_per_batch!r}")
    return int(config.max_tokens)


def _pieces(lens: np.ndarray, ids: np.ndarray, capacity: int, every: bool,
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int]:
    """Cut samples longer than ``capacity`` into consecutive pieces.

    ``every``: ``ids`` is ``0..n-1``. Returns (sample id, start, length) of every
    piece (start None when no sample is cut) and the number of samples cut.
    """
    planned = lens if every else lens[ids]
    over = planned > capacity
    n_over = int(np.count_nonzero(over))
    if n_over == 0:
        return ids, None, planned, 0
    long_ids, long_len = ids[over], planned[over]
    count = -(-long_len // capacity)
    piece_id = np.repeat(long_ids, count)
    first = np.repeat(np.cumsum(count) - count, count)
    start = (np.arange(piece_id.size) - first) * capacity
    piece_len = np.minimum(capacity, np.repeat(long_len, count) - start)
    return (np.concatenate((ids[~over], piece_id)),
            np.concatenate((np.zeros(ids.size - n_over, dtype=np.int64), start)),
            np.concatenate((planned[~over], piece_len)), n_over)


def plan_packed_epoch(lengths, config: PlanConfig, *, seed: int = 0, epoch: int = 0,
                      indices: np.ndarray | None = None) -> PackedEpochPlan:
    """Plan one epoch of packed rows (``layout="pack"``; see the module docstring).

    ``config.max_tokens`` is the row capacity ``C``; a micro-batch is
    ``config.rows_per_batch`` rows. The plan is a pure function of the lengths, the
    configuration, ``seed`` and ``epoch``; ``indices`` restricts it to those samples.

    Example::

        >>> cfg = PlanConfig(max_tokens=16, layout="pack", on_overflow="split")
        >>> plan = plan_packed_epoch([20, 9, 7, 12], cfg, seed=0, epoch=0)
        >>> sorted(map(tuple, plan.token_spans.tolist()))
        [(0, 7), (0, 9), (0, 12), (0, 16), (16, 4)]
    """
    started = time.perf_counter()
    capacity = _check(config)
    split = config.on_overflow == "split"
    # with "split", over-long samples stay whole here (only max_len truncates); cut below
    lens, ids, counts = prepare_lengths(lengths, config, indices, cap_to_budget=not split)
    every = ids.size == lens.size and (indices is None
                                       or np.array_equal(ids, np.arange(ids.size)))
    piece_id, piece_start, piece_len, n_split = _pieces(lens, ids, capacity, every)
    counts = dict(counts, split_samples=n_split,
                  split_pieces=int(piece_id.size - ids.size + n_split))

    def rng(stream: int) -> np.random.Generator:
        return np.random.default_rng([seed, epoch, stream])

    order, row_off = pack_rows(piece_len, capacity, rng(_STREAM_DEAL))
    w, rows_per = config.world_size, config.rows_per_batch
    multiple = w * rows_per
    short = (-(row_off.size - 1)) % multiple
    if config.even_out == "split" and short and row_off.size - 1 + short > piece_id.size:
        raise ValueError(
            f"{piece_id.size} samples cannot fill {row_off.size - 1 + short} rows "
            f"({w} ranks x {rows_per} rows per micro-batch); use fewer ranks or rows, "
            "or even_out='repeat'")
    tags = np.zeros(row_off.size - 1, dtype=np.int64)
    order, row_off, _, even = batching.even_out(order, row_off, tags, multiple,
                                                config.even_out, rng(_STREAM_EVEN))
    o = rng(_STREAM_ORDER)
    cost = config.cost or CostModel()
    price, weight = _row_prices(piece_len[order], row_off, cost)
    n_rows = row_off.size - 1
    if rows_per > 1:  # rows to micro-batches: sorted rows dealt in snake order
        n_mb = n_rows // rows_per
        ranked = np.lexsort((o.random(n_rows), price))
        mb_of_row = np.empty(n_rows, dtype=np.int64)
        mb_of_row[ranked] = _snake(n_mb, n_rows)
        row_perm = np.argsort(mb_of_row, kind="stable")
        order, row_off = batching.take_batches(order, row_off, row_perm)
        price = np.bincount(mb_of_row, weights=price, minlength=n_mb)
        weight = np.bincount(mb_of_row, weights=weight, minlength=n_mb)
    if config.order == "stratified":
        mb_perm = schedule_groups(price, weight, w, config.grad_accum, o)
    else:
        mb_perm = o.permutation(price.size)
    if rows_per > 1:
        row_perm = (mb_perm[:, None] * rows_per + np.arange(rows_per)).reshape(-1)
    else:
        row_perm = mb_perm
    order, row_off = batching.take_batches(order, row_off, row_perm)
    itype = index_dtype(lens.size)
    if every and n_split == 0:  # pieces are the sample ids
        sample_ids = order.astype(itype, copy=False)
    else:
        sample_ids = piece_id[order].astype(itype, copy=False)
    spans = None
    if split:
        span_type = np.int32 if lens.max(initial=0) < 2**31 else np.int64
        spans = np.empty((order.size, 2), dtype=span_type)
        spans[:, 0] = 0 if piece_start is None else piece_start[order]
        spans[:, 1] = lens[sample_ids] if piece_start is None else piece_len[order]
    offsets = row_off[::rows_per].copy()
    changed = even.repeated or even.dropped
    counts.update(planned=int(np.unique(sample_ids).size) if changed else int(ids.size),
                  split_batches=even.split_batches, dropped_to_even_out=even.dropped,
                  repeated=even.repeated)
    return PackedEpochPlan(
        indices=sample_ids, offsets=offsets, bucket=np.zeros(offsets.size - 1, dtype=np.int32),
        edges=[capacity], lengths=lens, config=config, seed=seed, epoch=epoch,
        plan_seconds=time.perf_counter() - started, counts=counts,
        row_offsets=row_off if rows_per > 1 else None, token_spans=spans)
