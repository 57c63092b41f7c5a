"""Rows dealt to micro-batches, ranks and optimizer steps so that costs balance.

Rows are priced with the cost model (:func:`row_prices`), grouped into
micro-batches of ``rows_per_batch`` rows (:func:`rows_to_micro_batches`), and the
micro-batches ordered into the schedule (:func:`schedule_groups`).

Example::

    >>> price, weight = row_prices(np.array([3, 1, 2]), np.array([0, 2, 3]), CostModel())
    >>> price.tolist(), weight.tolist()
    ([4.0, 2.0], [10.0, 4.0])
"""

from __future__ import annotations

import math

import numpy as np

from lengthwise.planning.cost import CostModel

__all__ = ["row_prices", "rows_to_micro_batches", "schedule_groups"]

#: relative width of the cost classes whose micro-batches may share an accumulation slot
COST_CLASS = 0.02


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


def row_prices(pieces: np.ndarray, offsets: np.ndarray, cost: CostModel,
               ) -> tuple[np.ndarray, np.ndarray]:
    """Cost and ``sum(L^2)`` of every row (row ``r`` holds ``pieces[offsets[r]:offsets[r+1]]``).

    Example::

        >>> row_prices(np.array([2, 2]), np.array([0, 2]), CostModel(a=1, c=10))[0].tolist()
        [24.0]
    """
    starts = offsets[:-1]
    tokens = np.add.reduceat(pieces, starts, dtype=np.int64).astype(np.float64)
    wide = pieces.astype(np.int64)
    sq = np.add.reduceat(np.multiply(wide, wide, out=wide), starts).astype(np.float64)
    count = np.diff(offsets).astype(np.float64)
    return cost.a * tokens + cost.b * sq + cost.c * count, sq


def rows_to_micro_batches(price: np.ndarray, weight: np.ndarray, rows_per_batch: int,
                          rng: np.random.Generator,
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows grouped ``rows_per_batch`` at a time: rows sorted by price, dealt in snake order.

    Returns ``(row_perm, price, weight)``: the rows in micro-batch order, and the
    summed price and weight of every micro-batch.

    Example::

        >>> perm, price, _ = rows_to_micro_batches(np.array([1., 2, 3, 4]), np.ones(4), 2,
        ...                                        np.random.default_rng(0))
        >>> price.tolist()
        [5.0, 5.0]
    """
    n_rows = price.size
    n_mb = n_rows // rows_per_batch
    ranked = np.lexsort((rng.random(n_rows), price))
    mb_of_row = np.empty(n_rows, dtype=np.int64)
    mb_of_row[ranked] = _snake(n_mb, n_rows)
    row_perm = np.argsort(mb_of_row, kind="stable")
    price = np.bincount(mb_of_row, weights=price, minlength=n_mb)
    weight = np.bincount(mb_of_row, weights=weight, minlength=n_mb)
    return row_perm, price, weight
