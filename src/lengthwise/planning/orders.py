"""Orders of micro-batches over an epoch: which batch runs where and when.

Every function here takes per-batch arrays and returns a permutation ``order``:
batch ``order[k]`` becomes the ``k``-th of the schedule, which sends it to rank
``k % world_size`` at that rank's position ``k // world_size``.

Example::

    >>> rng = np.random.default_rng(0)
    >>> order = interleave(np.array([0, 0, 0, 1, 1, 1]), rng, world_size=2)
    >>> sorted(order.tolist())
    [0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

import numpy as np

from lengthwise.planning.sorting import stable_argsort


def _run_positions(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For an array of group ids laid out in contiguous runs: (run id, index in run, run size)."""
    starts = np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))
    sizes = np.diff(np.append(starts, groups.size))
    run = np.repeat(np.arange(starts.size), sizes)
    return run, np.arange(groups.size) - starts[run], sizes[run]


def interleave(batch_bucket: np.ndarray, rng: np.random.Generator,
               world_size: int = 1) -> np.ndarray:
    """Stride-based proportional interleaving with a random phase per bucket.

    Bucket ``k`` with ``n_k`` batches puts its ``j``-th batch at ``(j + phase_k)/n_k``
    of the epoch, so every bucket is spread evenly and all run out together. Each
    step takes ``world_size`` consecutive batches of that sequence, dealt to ranks in
    a rotation that moves by one every step (a fixed deal could give a rank one
    bucket only, for example two alternating buckets on two ranks).
    """
    grouped = np.argsort(batch_bucket, kind="stable")
    run, j, n = _run_positions(batch_bucket[grouped])
    phase = rng.random(int(run.max()) + 1 if run.size else 0)
    key = (j + phase[run]) / n
    tie = rng.random(key.size)
    seq = grouped[np.lexsort((tie, key))]
    k = np.arange(seq.size)
    step, lane = divmod(k, world_size)
    order = np.empty_like(seq)
    order[step * world_size + (lane + step) % world_size] = seq
    return order


def _run_through(tag: list, p: int) -> int:
    lo, hi = p, p
    while lo > 0 and tag[lo - 1] == tag[p]:
        lo -= 1
    while hi + 1 < len(tag) and tag[hi + 1] == tag[p]:
        hi += 1
    return hi - lo + 1


def _swap_keeps_runs(tag: list, p: int, i: int, max_run: int) -> bool:
    tag[p], tag[i] = tag[i], tag[p]
    ok = _run_through(tag, p) <= max_run and _run_through(tag, i) <= max_run
    tag[p], tag[i] = tag[i], tag[p]
    return ok


def limit_runs(order: np.ndarray, batch_bucket: np.ndarray, world_size: int,
               max_run: int) -> np.ndarray:
    """Swap batches so no rank gets more than ``max_run`` in a row from one bucket.

    Works on each rank's own sequence (every ``world_size``-th entry), so the
    number of batches per rank is unchanged. Where a bucket holds too large a
    share for the limit to be met, the longest runs that remain are reported by
    the plan's ``max_same_bucket_run``.
    """
    order = order.copy()
    for rank in range(world_size):
        seq = order[rank::world_size].tolist()
        tag = batch_bucket[order[rank::world_size]].tolist()
        changed = False
        run = 0
        for i in range(len(seq)):
            run = run + 1 if i and tag[i] == tag[i - 1] else 1
            if run <= max_run:
                continue
            j = next((j for j in range(i + 1, len(seq)) if tag[j] != tag[i]), None)
            if j is None:  # nothing different later: trade places with an earlier batch
                j = next((p for p in range(i - 2, -1, -1)
                          if tag[p] != tag[i] and _swap_keeps_runs(tag, p, i, max_run)), None)
                if j is None:
                    break
            seq[i], seq[j] = seq[j], seq[i]
            tag[i], tag[j] = tag[j], tag[i]
            run = 1
            changed = True
        if changed:
            order[rank::world_size] = seq
    return order


#: a micro-batch costing less than this share of the median is dealt to a step of its own
#: (a half split off to even out the ranks, a bucket's left-over)
CHEAP_SHARE = 0.6


def cost_levels(batch_cost: np.ndarray, world_size: int, grad_accum: int,
                rng: np.random.Generator) -> np.ndarray:
    """Steps of micro-batches of one cost level: batches sorted by cost (ties at random)
    are cut into steps of ``world_size * grad_accum``, so the ranks of a step wait alike.

    Batches far cheaper than the median (below :data:`CHEAP_SHARE` of it: halves split off
    to even out the ranks, a bucket's left-over) would share a step with dearer ones: they
    are spread over the steps instead, at most ``S / 16`` to a step of ``S``, where each
    moves the step's mean by less than ``1 / S``. The
    cheapest of the rest make the last, partial step; the whole steps run in random order,
    and inside a step batches of similar cost share an accumulation slot. Steps then hold
    micro-batches of like cost, not the data's length mix.

    Example::

        >>> cost = np.array([5., 9., 5., 9., 5., 9., 5., 9.])
        >>> order = cost_levels(cost, 4, 1, np.random.default_rng(0))
        >>> sorted(sorted(step) for step in order.reshape(-1, 4).tolist())
        [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    s = world_size * grad_accum
    m = batch_cost.size
    by_cost = np.lexsort((rng.random(m), batch_cost))
    steps = m // s
    cheap = int(np.count_nonzero(batch_cost < CHEAP_SHARE * np.median(batch_cost))) if m else 0
    # at most s/16 cheap batches to a step, spread round-robin from the dearest step down
    k = min(cheap, steps * max(1, s // 16))
    took = np.full(steps, k // max(steps, 1), dtype=np.int64)
    extra = k % max(steps, 1)
    if extra:  # the dearest steps take one more
        took[steps - extra:] += 1
    rest = by_cost[k:]
    partial = rest[:m % s]
    rest = rest[m % s:]
    # step t: its share of the cheap batches (in cost order), then its run of the rest
    cheap_of = np.split(by_cost[:k], np.cumsum(took)[:-1]) if steps else []
    rest_of = np.split(rest, np.cumsum(s - took)[:-1]) if steps else []
    groups = [np.concatenate(pair) for pair in zip(cheap_of, rest_of, strict=True)]
    order = [groups[t] for t in rng.permutation(steps).tolist()]
    # inside a step, batches of similar cost share an accumulation slot
    order = [g[np.argsort(batch_cost[g], kind="stable")] for g in order]
    return np.concatenate([*order, partial]).astype(np.int64)


def _sort_by_group_then_cost(group: np.ndarray, cost: np.ndarray,
                             rng: np.random.Generator) -> np.ndarray:
    """Order by group, then cost, ties at random (one float sort instead of a lexsort)."""
    span = float(cost.max(initial=0.0)) + 2.0
    key = group * span + cost + rng.random(group.size)
    return stable_argsort(key)


def _balanced_steps(value: np.ndarray, stratum: np.ndarray, steps: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Deal each stratum's batches over ``steps`` steps so that every step's sum of
    ``value`` comes out alike: strata with the widest spread first, each one's largest
    values to the steps with the smallest sums so far (a greedy number partition)."""
    out = np.empty(value.size, dtype=np.int64)
    total = np.zeros(steps)
    order = np.argsort(stratum, kind="stable")
    bounds = np.flatnonzero(np.diff(stratum[order])) + 1
    groups = np.split(order, bounds)
    spread = [float(np.ptp(value[g])) for g in groups]
    for k in np.argsort(spread, kind="stable")[::-1]:
        g = groups[k]
        big_first = g[stable_argsort(-value[g] + 1e-9 * rng.random(g.size))]
        small_first = stable_argsort(total + 1e-9 * rng.random(steps))[:g.size]
        out[big_first] = small_first
        total[small_first] += value[big_first]
    return out


def stratified(batch_bucket: np.ndarray, batch_cost: np.ndarray, world_size: int,
               grad_accum: int, rng: np.random.Generator,
               batch_length: np.ndarray | None = None) -> np.ndarray:
    """Every optimizer step takes one micro-batch from each of ``W*G`` length strata.

    Batches sorted by bucket are cut into ``S = world_size * grad_accum`` contiguous
    strata of (nearly) equal batch count: under a token budget that is equal token
    mass. Step ``t`` takes one batch of every stratum, so each step carries the
    data's length mix. To keep ranks in step, batches of the same cost quantile
    in their strata share a step (steps then run in random order), the cheapest
    left-over batches go to the last step, and inside a step batches of similar
    cost share an accumulation slot, dealt to ranks in a rotation that changes
    every step.

    With ``batch_length`` (each batch's token-weighted mean length), batches are
    dealt to steps by :func:`_balanced_steps` instead of by cost rank, so that the
    steps' mean lengths come out alike: each stratum spans a range of lengths, and
    when steps hold few batches (short samples, few ranks) that range would make
    the steps differ more than a shuffle's.
    """
    m = batch_bucket.size
    s = world_size * grad_accum
    q, rem = divmod(m, s)
    sizes = np.full(s, q, dtype=np.int64)
    sizes[:rem] += 1
    stratum = np.repeat(np.arange(s), sizes)
    grouped = np.argsort(batch_bucket, kind="stable")
    cost = batch_cost[grouped]
    # cost rank inside each stratum
    by_cost = _sort_by_group_then_cost(stratum, cost, rng)
    grouped, cost = grouped[by_cost], cost[by_cost]
    j = np.arange(m) - np.repeat(np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
    # the cheapest batch of every stratum (left-overs, split halves) runs in the last
    # step; the other cost ranks map to steps in random order
    last = q if rem else q - 1
    runs_last = (sizes[stratum] > q) | (rem == 0)  # strata whose cheapest batch runs last
    goes_last = (j == 0) & runs_last
    step_of_rank = rng.permutation(max(last, 1))
    rank = np.clip(j - runs_last, 0, max(last - 1, 0))
    t = np.where(goes_last, last, step_of_rank[rank])
    if batch_length is not None and last > 1:
        rest = np.flatnonzero(~goes_last)
        dealt = _balanced_steps(batch_length[grouped[rest]], stratum[rest], last, rng)
        t[rest] = step_of_rank[dealt]
    order = np.empty(m, dtype=np.int64)
    if grad_accum == 1 and rem == 0:  # one slot per step, every step full: no sort needed
        order[t * s + (stratum + t) % world_size] = grouped
        return order
    by_step = _sort_by_group_then_cost(t, cost, rng)
    within, t = grouped[by_step], t[by_step]
    # every step holds s batches but the last, which holds the rest: position inside
    # the step -> (slot, rank), ranks rotated by step
    pos = np.arange(m) - t * s
    slot, lane = divmod(pos, world_size)
    rank = (lane + t) % world_size
    target = t * s + slot * world_size + rank
    order[target] = within
    return order
