"""Steps at one cost level (``balance="level"``): every rank of a step waits alike.

Under a token budget a micro-batch of ``r`` rows of length ``P`` costs ``r * P``;
where long samples leave two to five rows, whole rows cannot fill the budget, and
a step that mixes lengths holds such batches beside full ones: its slowest rank
sets the step's time. This policy gives each optimizer step one cost level:

- *coarse* micro-batches (fewer than :data:`FINE_ROWS` rows; their cost moves in
  steps of a whole long row) are formed as usual, sorted by cost and dealt to
  steps in contiguous runs, so a step's coarse batches cost alike; the level of a
  step is their mean cost;
- the samples of the *fine* buckets (many short rows, a cost that can be cut
  finely) are re-cut, bucket by bucket, into micro-batches whose cost is the
  level of the step they go to (rounded to whole rows, never over the budget),
  dealt to steps in rounds so each step takes fine batches from every part of
  the fine length range.

Samples that the steps' fine slots do not take are cut into a multiple of the
world size of micro-batches of equal cost, after the last step. Steps run in random
order. Every sample is planned exactly once and no micro-batch exceeds its budget.

Example::

    >>> import numpy as np
    >>> lens = np.random.default_rng(0).integers(16, 8192, 20_000)
    >>> edges = [256 * k for k in range(1, 33)]
    >>> limit = batching.row_limit(max_tokens=16384)
    >>> idx, off, head = level_steps(lens, np.arange(lens.size), edges, limit, 8, 1,
    ...                        np.random.default_rng(0))
    >>> sorted(idx.tolist()) == list(range(lens.size))
    True
"""

from __future__ import annotations

import numpy as np

from lengthwise.planning import batching
from lengthwise.planning.cost import round_up

__all__ = ["FINE_ROWS", "level_steps"]

#: a bucket whose budget holds at least this many rows is cut to the step's level
FINE_ROWS = 16


def _fine_cuts(edge_of: np.ndarray, targets: np.ndarray, budget: float) -> np.ndarray:
    """Sizes of consecutive micro-batches along samples whose rows, padded to their bucket's
    edge, cost ``edge_of`` (non-decreasing), the ``j``-th costing about ``targets[j]``
    (``rows * edge_of``, rounded to whole rows, at most ``budget``); stops when samples or
    targets run out."""
    n = edge_of.size
    sizes = []
    pos = 0
    for target in targets.tolist():
        if pos >= n:
            break
        edge = float(edge_of[pos])
        rows = 0
        for _ in range(8):  # a batch that reaches a longer bucket pads to its edge
            rows = max(1, min(int(round(target / edge)), int(budget // edge)))
            rows = min(rows, n - pos)
            last = float(edge_of[pos + rows - 1])
            if last == edge:
                break
            edge = last
        sizes.append(rows)
        pos += rows
    return np.asarray(sizes, dtype=np.int64)


def _even_cuts(edge_of: np.ndarray, world_size: int, budget: float) -> np.ndarray:
    """Sizes of micro-batches that cut all the samples whose rows cost ``edge_of`` into a
    multiple of ``world_size`` batches of about equal cost (within the budget), where their
    rows allow it."""
    count = world_size * max(1, -(-int(np.ceil(edge_of.sum())) // int(world_size * budget)))
    target = float(edge_of.sum()) / count
    while True:
        cuts = _fine_cuts(edge_of, np.full(count, target), budget)
        if cuts.sum() == edge_of.size or target >= budget:
            break
        target = min(budget, target * 1.01)  # rows rounded down left samples over
    if cuts.sum() < edge_of.size:  # whole rows of these lengths need more batches
        more = _fine_cuts(edge_of[int(cuts.sum()):], np.full(edge_of.size, budget), budget)
        cuts = np.concatenate((cuts, more))
    return cuts


def _slot_steps(fine_slots: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The step of each fine slot, in the order fine batches are cut: round ``k`` gives
    the ``k``-th fine batch of every step that has one, steps in random order."""
    steps = np.repeat(np.arange(fine_slots.size), fine_slots)
    rounds = np.arange(steps.size) - np.repeat(np.cumsum(fine_slots) - fine_slots, fine_slots)
    return steps[np.lexsort((rng.random(steps.size), rounds))]


def level_steps(lengths: np.ndarray, ids: np.ndarray, edges, limit: batching.RowLimit,
                world_size: int,
                grad_accum: int, rng: np.random.Generator,
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """``(indices, offsets, head)`` of an epoch in schedule order: the first ``head``
    micro-batches are whole optimizer steps, each at one cost level (see the module
    docstring), the rest is what no step took, cut under the full budget of ``limit`` (a
    token or cost budget); ``edges`` are the bucket edges. The caller evens out the count of
    the micro-batches after ``head``."""
    edge_arr = np.asarray(edges, dtype=np.int64)
    bucket = np.searchsorted(edge_arr, lengths[ids], side="left")
    budget = float(limit.budget)
    row_cost = np.asarray(limit.cost.row_cost(round_up(edge_arr, limit.pad_multiple)))
    rows = limit.rows(edge_arr)
    idx, off, tag = batching.bucket_batches(ids, bucket, rows, rng)
    sizes = np.diff(off)
    fine_batch = rows[tag] >= FINE_ROWS
    longest = batching.batch_longest(lengths, idx, off)
    cost = limit.cost.batch_cost(sizes, round_up(longest, limit.pad_multiple))
    coarse = np.flatnonzero(~fine_batch)
    coarse = coarse[np.lexsort((rng.random(coarse.size), cost[coarse]))]  # by cost
    fine_ids = idx[np.repeat(fine_batch, sizes)]
    fine_bucket = np.searchsorted(edge_arr, lengths[fine_ids], side="left")
    order = np.argsort(fine_bucket, kind="stable")
    fine_ids = fine_ids[order]
    fine_edge = row_cost[fine_bucket[order]]  # the cost of a fine sample's row
    per_step = world_size * grad_accum
    level = float(cost[coarse].mean()) if coarse.size else float(budget)
    least = max(1, -(-coarse.size // per_step))
    steps = max(least, int((coarse.size + float(fine_edge.sum()) / level) // per_step))
    for _ in range(8):  # as many steps as the fine samples fill, to within one step
        chunk = np.array_split(coarse, steps)
        levels = np.array([cost[c].mean() if c.size else budget for c in chunk])
        fine_slots = per_step - np.array([c.size for c in chunk])
        slot_step = _slot_steps(fine_slots, rng)
        cut = _fine_cuts(fine_edge, levels[slot_step], budget)
        left = fine_ids.size - int(cut.sum())
        if cut.size < slot_step.size:  # samples ran out: fewer steps
            missing = slot_step.size - cut.size
            if steps == least:
                break
            steps = max(least, steps - max(1, -(-missing // per_step)))
            continue
        extra = int(left * float(fine_edge.mean()) // budget) if left else 0
        if extra < per_step:
            break
        steps += max(1, extra // per_step)
    fine_off = np.concatenate(([0], np.cumsum(cut)))
    by_step: list[list[tuple[np.ndarray, float]]] = [[] for _ in range(steps)]
    for s, c in enumerate(chunk):
        by_step[s] += [(idx[off[k]:off[k + 1]], float(cost[k])) for k in c.tolist()]
    for j, s in enumerate(slot_step[:cut.size].tolist()):
        batch = fine_ids[fine_off[j]:fine_off[j + 1]]
        by_step[s].append((batch, float(batch.size * fine_edge[fine_off[j + 1] - 1])))
    pieces: list[np.ndarray] = []
    rest: list[np.ndarray] = []
    for s in rng.permutation(steps).tolist():
        if len(by_step[s]) == per_step:  # similar costs share an accumulation slot
            pieces += [p[0] for p in sorted(by_step[s], key=lambda p: p[1])]
        else:  # a step the fine samples did not fill runs after the whole ones
            rest += [p[0] for p in by_step[s]]
    head = len(pieces)
    tail = fine_off[-1]
    if tail < fine_ids.size:
        t_off = tail + np.concatenate(([0], np.cumsum(_even_cuts(fine_edge[tail:], world_size,
                                                                 budget))))
        rest += [fine_ids[a:b] for a, b in zip(t_off[:-1].tolist(), t_off[1:].tolist(),
                                               strict=True)]
    pieces += rest
    out_sizes = np.array([p.size for p in pieces], dtype=np.int64)
    out_idx = np.concatenate(pieces).astype(idx.dtype)
    return out_idx, np.concatenate(([0], np.cumsum(out_sizes))).astype(np.int64), head
