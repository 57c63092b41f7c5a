"""The batching figures of docs/metrics.md, computed for any schedule of micro-batches.

A schedule is ``indices``/``offsets`` (micro-batches concatenated) in the order
that sends micro-batch ``k`` to rank ``k % world_size``, local position
``k // world_size``; a local position ``p`` is optimizer step ``p // grad_accum``.
The same code measures lengthwise's plans and any other sampler's batches.

Example::

    >>> lens = np.array([4, 4, 2, 2])
    >>> s = batch_stats(lens, np.arange(4), np.array([0, 2, 4]))
    >>> s["padding_efficiency"]
    1.0
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lengthwise.errors import DataError
from lengthwise.planning.batching import index_dtype, longest_per_batch
from lengthwise.planning.cost import CostModel, round_up

#: repetitions of the random-shuffle reference for ``step_cv_ratio`` ...
RANDOM_REFERENCE_REPEATS = 5
#: ... as many as keep the samples shuffled in all at or below this (one shuffle at least):
#: above 200,000 samples, fewer shuffles of more samples each (a shuffle is the figures' costliest
#: step, half a sort of the lengths)
RANDOM_REFERENCE_SAMPLES = 1_000_000


def reference_repeats(samples: int) -> int:
    """Shuffles averaged by the random-shuffle reference of ``step_cv_ratio`` for ``samples``.

    Example::

        >>> reference_repeats(30_000), reference_repeats(400_000), reference_repeats(902_087)
        (5, 2, 1)
    """
    return max(1, min(RANDOM_REFERENCE_REPEATS, RANDOM_REFERENCE_SAMPLES // max(samples, 1)))


def _cv(x: np.ndarray) -> float | None:
    if x.size < 2 or float(np.mean(x)) == 0.0:
        return None
    return float(np.std(x) / np.mean(x))


def step_ids(num_batches: int, world_size: int, grad_accum: int) -> np.ndarray:
    """Optimizer step of each micro-batch of a schedule."""
    return np.arange(num_batches) // (world_size * grad_accum)


def _exact_sums(lens: np.ndarray) -> bool:
    """Whether sums of these whole lengths and of their squares are exact in float64 in any
    order (every partial sum below 2**53), so a segment sum may be taken in any order."""
    return lens.size == 0 or float(lens.max()) ** 2 * lens.size < 2.0**53


def narrow_lengths(lengths: np.ndarray) -> np.ndarray:
    """Whole ``lengths`` in the narrowest of int16 and int32 that holds them (other arrays as
    given): gathering or shuffling them then moves a quarter or half of the memory.

    Example::

        >>> narrow_lengths(np.array([3, 40_000])).dtype
        dtype('int32')
    """
    if lengths.dtype.kind not in "iu" or lengths.size == 0:
        return lengths
    lo, hi = int(lengths.min()), int(lengths.max())
    for kind in (np.int16, np.int32):
        info = np.iinfo(kind)
        if info.min <= lo and hi <= info.max:
            return lengths.astype(kind, copy=False)
    return lengths


def gathered_lengths(lengths: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``lengths[indices]``, gathered from the lengths narrowed by :func:`narrow_lengths` when
    the schedule holds a quarter of them or more (equal values, a narrower type).

    Example::

        >>> gathered_lengths(np.array([5, 7, 9]), np.array([2, 0])).tolist()
        [9, 5]
    """
    source = narrow_lengths(lengths) if 4 * indices.size >= lengths.size else lengths
    return source.take(indices)  # the gather of fancy indexing, without its overhead


def _whole_sums(values: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums of whole ``values`` and of their squares over the contiguous non-empty segments
    beginning at ``starts``, summed as integers and returned as float64 (exact when
    :func:`_exact_sums` holds, so equal to the float sums in any order)."""
    s1 = np.add.reduceat(values, starts, dtype=np.int64)
    # squares of int16 values fit int32 (below 2**30)
    squares = values.astype(np.int32 if values.dtype.itemsize <= 2 else np.int64)
    squares *= squares
    s2 = np.add.reduceat(squares, starts, dtype=np.int64)
    return s1.astype(np.float64), s2.astype(np.float64)


def _segment_sums(values: np.ndarray, starts: np.ndarray, segment: np.ndarray | None,
                  n: int) -> np.ndarray:
    """Sums of ``values`` over contiguous segments beginning at ``starts`` (non-empty and
    exact: :func:`_exact_sums`), or by ``segment`` id when ``segment`` is given."""
    if segment is not None:
        return np.bincount(segment, weights=values, minlength=n)
    return np.add.reduceat(values, starts)


def _step_means(sample_lens: np.ndarray, offsets: np.ndarray, steps: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Token-weighted and plain mean length of each optimizer step (full steps only), from
    the lengths of the samples in schedule order."""
    n_steps = int(steps[-1]) + 1
    first = np.searchsorted(steps, np.arange(n_steps))  # first micro-batch of each step
    starts = offsets[first]
    cnt = np.diff(np.append(starts, offsets[-1]))
    exact = _exact_sums(sample_lens) and bool(np.all(cnt > 0))
    if exact and sample_lens.dtype.kind in "iu":
        s1, s2 = _whole_sums(sample_lens, starts)
    else:
        lens = sample_lens.astype(np.float64)
        segment = None if exact else np.repeat(steps, np.diff(offsets))
        s1 = _segment_sums(lens, starts, segment, n_steps)
        s2 = _segment_sums(lens * lens, starts, segment, n_steps)
    return s2 / np.maximum(s1, 1), s1 / np.maximum(cnt, 1)


def random_step_cv(lengths: np.ndarray, ids: np.ndarray, n_steps: int, seed: int = 0,
                   repeats: int | None = None) -> tuple[float | None, float | None]:
    """``step_length_cv`` and ``step_sample_cv`` of a random shuffle cut into ``n_steps``,
    averaged over ``repeats`` shuffles (default: :func:`reference_repeats`).

    Example::

        >>> cv, _ = random_step_cv(np.arange(1, 1001), np.arange(1000), 10)
        >>> 0 < cv < 1
        True
    """
    return _random_cv_of(lengths[ids], n_steps, seed, repeats)


def _random_cv_of(sample_lens: np.ndarray, n_steps: int, seed: int,
                  repeats: int | None) -> tuple[float | None, float | None]:
    """:func:`random_step_cv` from the lengths of the samples."""
    n = sample_lens.size
    if n_steps < 2 or n < n_steps:
        return None, None
    repeats = reference_repeats(n) if repeats is None else repeats
    rng = np.random.default_rng([seed, 0x5EED])
    # sample i goes to step i * n_steps // n: step k starts at ceil(k * n / n_steps), and
    # every step holds a sample
    starts = -(-np.arange(n_steps, dtype=np.int64) * n // n_steps)
    cnt = np.diff(np.append(starts, n))
    exact = sample_lens.dtype.kind in "iu" and _exact_sums(sample_lens)
    # the lengths themselves are shuffled, narrow: the same swaps that shuffle arange(n) into
    # the permutation rng.permutation(n) draws, without an index array to gather through
    source = narrow_lengths(sample_lens) if exact else sample_lens.astype(np.float64)
    step = None if exact else np.repeat(np.arange(n_steps), cnt)  # the step of each sample
    drawn = np.empty_like(source)
    cvs, scvs = [], []
    for _ in range(repeats):
        drawn[:] = source
        rng.shuffle(drawn)
        if exact:
            s1, s2 = _whole_sums(drawn, starts)
        else:
            s1 = _segment_sums(drawn, starts, step, n_steps)
            s2 = _segment_sums(drawn * drawn, starts, step, n_steps)
        cvs.append(_cv(s2 / s1))
        scvs.append(_cv(s1 / cnt))
    return float(np.mean(cvs)), float(np.mean(scvs))


def longest_runs(tags: np.ndarray, world_size: int) -> int:
    """Longest run of equal consecutive tags on any rank of a schedule."""
    best = 0
    for rank in range(world_size):
        seq = tags[rank::world_size]
        if seq.size == 0:
            continue
        starts = np.flatnonzero(np.concatenate(([True], seq[1:] != seq[:-1])))
        best = max(best, int(np.diff(np.append(starts, seq.size)).max()))
    return best


def batch_hashes(indices: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """An order-independent 64-bit hash of each micro-batch's sample set."""
    x = indices.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        sums = np.add.reduceat(x, offsets[:-1]) if offsets.size > 1 else x[:0]
        return sums ^ (np.diff(offsets).astype(np.uint64) << np.uint64(48))


def recomposition_of(offsets_a: np.ndarray, indices_a: np.ndarray,
                     offsets_b: np.ndarray, indices_b: np.ndarray) -> float:
    """Share of the micro-batches of ``b`` whose sample set equals a micro-batch of ``a``.

    When no sample id repeats in either schedule (ranks evened out by splitting or dropping
    batches), a batch of ``b`` equals one of ``a`` exactly when all its samples sit in one
    batch of ``a`` of its size: one owner per sample, looked up. Otherwise the batches are
    compared by an order-independent hash of their sample multisets (:func:`batch_hashes`).
    """
    offsets_b = np.asarray(offsets_b, dtype=np.int64)
    if offsets_b.size <= 1:
        return 0.0
    same = _same_as_owner(np.asarray(offsets_a, dtype=np.int64), np.asarray(indices_a),
                          offsets_b, np.asarray(indices_b))
    if same is None:
        hb = batch_hashes(indices_b, offsets_b)
        ha = np.sort(batch_hashes(indices_a, offsets_a))
        at = np.minimum(np.searchsorted(ha, hb), max(ha.size - 1, 0))
        same = ha[at] == hb if ha.size else np.zeros(hb.size, dtype=bool)
    return float(same.mean())


def _same_as_owner(offsets_a: np.ndarray, indices_a: np.ndarray, offsets_b: np.ndarray,
                   indices_b: np.ndarray) -> np.ndarray | None:
    """Whether each batch of ``b`` holds exactly the samples of one batch of ``a``, from the
    batch of ``a`` that owns each sample; ``None`` where that test does not apply (an id
    repeated or negative, an empty batch)."""
    sizes_a, sizes_b = np.diff(offsets_a), np.diff(offsets_b)
    if (indices_a.size == 0 or indices_b.size == 0 or sizes_a.min() < 1 or sizes_b.min() < 1
            or min(indices_a.min(), indices_b.min()) < 0):
        return None
    n = int(max(indices_a.max(), indices_b.max())) + 1
    owner = np.full(n, -1, dtype=index_dtype(sizes_a.size))
    owner[indices_a] = np.repeat(np.arange(sizes_a.size, dtype=owner.dtype), sizes_a)
    if np.count_nonzero(owner >= 0) != indices_a.size:  # an id in two places of a
        return None
    own = owner.take(indices_b)
    first = np.minimum.reduceat(own, offsets_b[:-1])
    same = (first == np.maximum.reduceat(own, offsets_b[:-1])) & (first >= 0)
    same[same] = sizes_a[first[same]] == sizes_b[same]
    # so far each such batch holds only samples of one batch of a, as many as it has: the
    # same set unless an id repeats inside it
    if same.any() and _distinct_count(indices_b) != indices_b.size:
        return None
    return same


def recomposition(previous, current) -> float:
    """``recomposition`` between two epoch plans (docs/metrics.md).

    Example::

        >>> import lengthwise
        >>> config = lengthwise.PlanConfig(batch_size=4)
        >>> p0 = lengthwise.plan_epoch(np.arange(1, 500), config, epoch=0)
        >>> p1 = lengthwise.plan_epoch(np.arange(1, 500), config, epoch=1)
        >>> recomposition(p0, p1) < 0.05
        True
    """
    return recomposition_of(previous.offsets, previous.indices, current.offsets, current.indices)


def token_means(sample_lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Token-weighted mean length of each micro-batch, ``sum(L^2) / sum(L)``, from the lengths
    of the samples in schedule order.

    Example::

        >>> token_means(np.array([1, 3, 4]), np.array([0, 2, 3])).tolist()
        [2.5, 4.0]
    """
    x = sample_lengths.astype(np.float64)
    starts = offsets[:-1]
    return np.add.reduceat(x * x, starts) / np.maximum(np.add.reduceat(x, starts), 1e-12)


def _token_totals(lens: np.ndarray, offsets: np.ndarray, longest: np.ndarray,
                  pad_multiple: int, cost: CostModel,
                  capacity: int | None) -> tuple[float, float, np.ndarray]:
    """Real tokens, padded (or packed) tokens and the cost of each micro-batch, from the
    lengths of the samples in schedule order; whole lengths give exact integer sums (a plan's
    lengths keep them below 2**62, ``prepare.check_token_total``)."""
    real = int(lens.sum()) if lens.dtype.kind in "iu" else float(lens.sum())
    if capacity is None:
        rows = np.diff(offsets)
        padded_len = np.asarray(round_up(longest, pad_multiple))
        padded = np.sum(rows * padded_len)
        return (real, int(padded) if padded.dtype.kind in "iu" else float(padded),
                cost.batch_cost(rows, padded_len))
    padded = (offsets.size - 1) * capacity
    # a packed sample costs what a row of its own length would
    return real, padded, np.add.reduceat(cost.row_cost(lens), offsets[:-1])


def _step_composition(lens: np.ndarray, offsets: np.ndarray, world_size: int,
                      grad_accum: int, seed: int) -> dict:
    """Step count and step-to-step length spread, against a random-shuffle reference
    (``lens``: the lengths of the samples in schedule order)."""
    m = offsets.size - 1
    steps = step_ids(m, world_size, grad_accum)
    tw_len, mean_len = _step_means(lens, offsets, steps)
    n_steps = tw_len.size
    full = n_steps if m % (world_size * grad_accum) == 0 or n_steps == 1 else n_steps - 1
    step_length_cv = _cv(tw_len[:full])
    step_sample_cv = _cv(mean_len[:full])
    ref_cv, ref_scv = _random_cv_of(lens, full, seed, None)
    return {
        "optimizer_steps": int(n_steps),
        "step_length_cv": step_length_cv,
        "step_sample_cv": step_sample_cv,
        "random_step_length_cv": ref_cv,
        "random_step_sample_cv": ref_scv,
        "step_cv_ratio": (step_length_cv / ref_cv
                          if step_length_cv is not None and ref_cv else None),
    }


def rank_imbalance(cost_of: np.ndarray, world_size: int) -> dict:
    """p50 and p99 over (step, slot) of max-over-ranks / mean-over-ranks cost.

    ``cost_of`` is each micro-batch's cost in schedule order (micro-batch ``k`` runs on rank
    ``k % world_size``); a last group of fewer than ``world_size`` is left out.

    Example::

        >>> rank_imbalance(np.array([1.0, 1.0, 3.0, 1.0]), 2)["rank_imbalance_p50"]
        1.25
    """
    usable = cost_of.size - cost_of.size % world_size
    groups = cost_of[:usable].reshape(-1, world_size)
    ratio = groups.max(axis=1) / np.maximum(groups.mean(axis=1), 1e-12)
    if not ratio.size:
        return {"rank_imbalance_p50": None, "rank_imbalance_p99": None}
    p50, p99 = np.percentile(ratio, [50, 99])  # one sort for both
    return {"rank_imbalance_p50": float(p50), "rank_imbalance_p99": float(p99)}


def _same_bucket_run(longest: np.ndarray, edges: Sequence[int] | None, world_size: int) -> int:
    """Longest run of micro-batches from one bucket (one longest length without edges)."""
    tags = longest if edges is None else np.searchsorted(np.asarray(edges), longest, side="left")
    return longest_runs(tags, world_size)


def _budget_fill(held: float, cost_of: np.ndarray, m: int, max_tokens: int | None,
                 max_cost: float | None) -> float | None:
    """``budget_fill``: the ``held`` tokens (or, under ``max_cost``, the summed cost of each
    micro-batch) over ``m`` budgets; ``None`` without a budget."""
    if max_tokens is not None:
        return held / (float(max_tokens) * m)
    if max_cost is not None:
        return float(cost_of.sum()) / (float(max_cost) * m)
    return None


def _distinct_count(indices: np.ndarray) -> int:
    """How many distinct sample ids a schedule holds (a mark per id, not a sort)."""
    if indices.size == 0:
        return 0
    if indices.min() < 0:
        return int(np.unique(indices).size)
    seen = np.zeros(int(indices.max()) + 1, dtype=bool)
    seen[indices] = True
    return int(np.count_nonzero(seen))


def batch_stats(
    lengths: np.ndarray,
    indices: np.ndarray,
    offsets: np.ndarray,
    *,
    world_size: int = 1,
    grad_accum: int = 1,
    edges: Sequence[int] | None = None,
    pad_multiple: int = 1,
    cost: CostModel | None = None,
    capacity: int | None = None,
    seed: int = 0,
    max_tokens: int | None = None,
    max_cost: float | None = None,
) -> dict:
    """docs/metrics.md figures for a schedule of micro-batches.

    ``capacity`` switches to the packed layout: each micro-batch is one row of
    ``capacity`` tokens, and ``padding_efficiency`` is the fill. ``cost`` (default:
    padded tokens) prices micro-batches for ``rank_imbalance``. ``max_tokens`` (or
    ``max_cost``), the budget of a micro-batch, gives ``budget_fill``: the padded (packed)
    tokens, or the cost, the micro-batches hold over what as many budgets hold.
    """
    lengths = np.asarray(lengths)
    indices = np.asarray(indices)
    offsets = np.asarray(offsets, dtype=np.int64)
    cost = cost or CostModel()
    m = offsets.size - 1
    if m < 1:
        raise DataError("no micro-batches to measure")
    lens = gathered_lengths(lengths, indices)  # gathered once for every figure
    longest = longest_per_batch(lens, offsets)
    if longest.dtype.kind in "iu":  # narrowed: widened again, to be rounded up without overflow
        longest = longest.astype(np.int64)
    real, padded, cost_of = _token_totals(lens, offsets, longest, pad_multiple, cost, capacity)
    composition = _step_composition(lens, offsets, world_size, grad_accum, seed)
    unique = _distinct_count(indices)
    return {
        "samples": int(indices.size),
        "unique_samples": unique,
        "repeated_in_schedule": int(indices.size - unique),
        "micro_batches": int(m),
        "micro_batches_per_rank": int(m // world_size),
        "optimizer_steps": composition.pop("optimizer_steps"),
        "real_tokens": int(real),
        "padded_tokens": int(padded),
        "padding_efficiency": real / padded if padded else None,
        "budget_fill": _budget_fill(real if capacity else padded, cost_of, m, max_tokens,
                                    max_cost),
        **composition,
        **rank_imbalance(cost_of, world_size),
        # packed rows have no buckets
        "max_same_bucket_run": (_same_bucket_run(longest, edges, world_size)
                                if capacity is None else None),
    }
