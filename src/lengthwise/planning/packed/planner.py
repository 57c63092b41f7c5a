"""One epoch of the packed layout planned: pieces, packed rows, evened out, scheduled.

Example::

    >>> from lengthwise.planning.config import PlanConfig
    >>> plan = plan_packed_epoch([9, 7, 12], PlanConfig(max_tokens=16, layout="pack"))
    >>> sorted(int(plan.lengths[plan.batch(k)].sum()) for k in range(plan.total_batches))
    [12, 16]
"""

from __future__ import annotations

import time

import numpy as np

from lengthwise.errors import ConfigError, DataError
from lengthwise.planning import batching, streams
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel
from lengthwise.planning.packed._pieces import split_pieces, token_spans
from lengthwise.planning.packed.balance import row_prices, rows_to_micro_batches, schedule_groups
from lengthwise.planning.packed.plan import PackedEpochPlan
from lengthwise.planning.packed.rows import pack_rows
from lengthwise.planning.prepare import every_sample, prepare_lengths
from lengthwise.planning.schedule import even_out_counts
from lengthwise.planning.vocabulary import PACK_ORDERS

__all__ = ["plan_packed_epoch"]


def _check(config: PlanConfig) -> int:
    if config.max_tokens is None:
        raise ConfigError("layout='pack' needs max_tokens: the tokens of one packed row")
    if config.order not in PACK_ORDERS:
        raise ConfigError(f"layout='pack' supports order in {PACK_ORDERS}, got {config.order!r}")
    return int(config.max_tokens)


def _even_out_rows(order: np.ndarray, row_off: np.ndarray, n_pieces: int, config: PlanConfig,
                   seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Rows evened out to a multiple of ranks x rows per micro-batch (``config.even_out``)."""
    w, rows_per = config.world_size, config.rows_per_batch
    multiple = w * rows_per
    short = (-(row_off.size - 1)) % multiple
    if config.even_out == "split" and short and row_off.size - 1 + short > n_pieces:
        raise DataError(
            f"{n_pieces} samples cannot fill {row_off.size - 1 + short} rows "
            f"({w} ranks x {rows_per} rows per micro-batch); use fewer ranks or rows, "
            "or even_out='repeat'")
    tags = np.zeros(row_off.size - 1, dtype=np.int64)
    order, row_off, _, even = batching.even_out(order, row_off, tags, multiple,
                                                config.even_out,
                                                streams.rng(seed, epoch, streams.PACK_EVEN))
    return order, row_off, even


def _order_micro_batches(order: np.ndarray, row_off: np.ndarray, row_piece_len: np.ndarray,
                         config: PlanConfig, o: np.random.Generator,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped into micro-batches and put in schedule order (``config.order``)."""
    rows_per = config.rows_per_batch
    price, weight = row_prices(row_piece_len, row_off, config.cost or CostModel())
    if rows_per > 1:  # rows to micro-batches
        row_perm, price, weight = rows_to_micro_batches(price, weight, rows_per, o)
        order, row_off = batching.take_batches(order, row_off, row_perm)
    if config.order == "stratified":
        mb_perm = schedule_groups(price, weight, config.world_size, config.grad_accum, o)
    else:
        mb_perm = o.permutation(price.size)
    row_perm = (mb_perm[:, None] * rows_per + np.arange(rows_per)).reshape(-1)
    return batching.take_batches(order, row_off, row_perm)


def plan_packed_epoch(lengths, config: PlanConfig, *, seed: int = 0, epoch: int = 0,
                      indices: np.ndarray | None = None) -> PackedEpochPlan:
    """Plan one epoch of packed rows (``layout="pack"``; see :mod:`lengthwise.planning.packed`).

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
    every = every_sample(ids, lens.size, indices)
    piece_id, piece_start, piece_len, n_split = split_pieces(lens, ids, capacity, every)
    counts = dict(counts, split_samples=n_split,
                  split_pieces=int(piece_id.size - ids.size + n_split))

    order, row_off = pack_rows(piece_len, capacity, streams.rng(seed, epoch, streams.PACK_DEAL))
    order, row_off, even = _even_out_rows(order, row_off, piece_id.size, config, seed, epoch)
    order, row_off = _order_micro_batches(order, row_off, piece_len[order], config,
                                          streams.rng(seed, epoch, streams.PACK_ORDER))
    rows_per = config.rows_per_batch
    itype = batching.index_dtype(lens.size)
    # pieces are the sample ids when every sample is planned and none is split
    sample_ids = (order if every and n_split == 0 else piece_id[order]).astype(itype, copy=False)
    spans = token_spans(order, lens, sample_ids, piece_start, piece_len) if split else None
    offsets = row_off[::rows_per].copy()
    return PackedEpochPlan(
        indices=sample_ids, offsets=offsets, lengths=lens, config=config, seed=seed,
        epoch=epoch, plan_seconds=time.perf_counter() - started,
        counts=even_out_counts(counts, sample_ids, ids.size, even),
        row_offsets=row_off if rows_per > 1 else None, token_spans=spans)
