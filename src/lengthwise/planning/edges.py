"""Padding-optimal bucket edges, found exactly by dynamic programming.

A bucket ``(e_{k-1}, e_k]`` pads each of its rows to ``round_up(e_k)``, so
bucket edges chosen from the distinct lengths ``v_1 < ... < v_U`` cost

    sum_k  count(e_{k-1} < L <= e_k) * row_cost(round_up(e_k))

and this module minimises that over all choices of ``K`` edges. The cost of a
bucket ``(v_i, v_j]`` is ``(N_j - N_i) * w_j`` with ``N`` the cumulative counts and
``w`` non-decreasing, which is a Monge array: the best split point is monotone
in ``j``, so each DP layer is solved by divide and conquer in O(U log U). The
layers run compiled (``_layers.c``, built at install when a C compiler is there)
or, without it, level by level with NumPy (all segments of one recursion depth at
once); both give the same costs and splits bit for bit.

Example::

    >>> optimal_edges([1, 1, 2, 9, 10, 10], 2)
    [2, 10]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lengthwise.errors import ConfigError, DataError
from lengthwise.planning.cost import CostModel, round_up
from lengthwise.planning.lengths import validate_lengths

try:  # the DP's layers, compiled at install when a C compiler is available
    from lengthwise.planning import _layers as _compiled
except ImportError:  # pragma: no cover - depends on the install
    _compiled = None

#: with ``num_buckets="auto"``, every bucket must hold at least this many micro-batches,
#: so that its batches can be re-formed from different samples every epoch.
MIN_BATCHES_PER_BUCKET = 2
#: ... and at least this many samples, so that batches of a few long rows are not drawn
#: from so few samples that the same ones meet again next epoch
MIN_SAMPLES_PER_BUCKET = 16
#: ``"auto"`` chooses the smallest K within this fraction of the best efficiency.
AUTO_TOLERANCE = 0.01
#: ``"auto"`` keeps the fewest samples per bucket above while that costs at most this share
#: more than the edges it picks when each bucket need only fill one micro-batch: a tail of a
#: few long samples is not put in a bucket with many short ones, which would then fit no more
#: rows than the long ones
AUTO_MINIMUM_PRICE = 0.05
#: ``"auto"`` considers at most this many buckets.
AUTO_MAX_BUCKETS = 128
#: under a token budget, ``"auto"`` prices a sample at its padded row plus this share of
#: the budget that whole rows cannot fill (see :func:`solve`): edges lean towards
#: ``budget / rows``, so micro-batches of one step cost alike, at a little padding
FILL_WEIGHT = 0.3


@dataclass(frozen=True)
class Histogram:
    """Distinct lengths and how many samples have each."""

    values: np.ndarray  # int64, ascending
    counts: np.ndarray  # int64

    @classmethod
    def of(cls, lengths: np.ndarray) -> Histogram:
        lengths = np.asarray(lengths)
        if lengths.size == 0:
            raise DataError("no lengths to bucket")
        if lengths.min() >= 0 and lengths.max() <= 4 * lengths.size + 1_000_000:
            counts = np.bincount(lengths)
            values = np.flatnonzero(counts)
            return cls(values.astype(np.int64), counts[values].astype(np.int64))
        values, counts = np.unique(lengths, return_counts=True)
        return cls(values.astype(np.int64), counts.astype(np.int64))


def _levels(cum: np.ndarray, w: np.ndarray, reach: np.ndarray | None) -> list[tuple]:
    """The recursion of :func:`_layer`, the same in every layer: per depth, the ``j`` solved
    there (``mid``), the solved neighbours that bound their arg-min window (``jlo - 1`` and
    ``jhi + 1``; ``0`` and ``U + 1`` are sentinels), the last ``i`` each may use, and
    ``cum[mid]``, ``w[mid]``."""
    u = cum.size - 1
    out = []
    jlo = np.array([1], dtype=np.int64)
    jhi = np.array([u], dtype=np.int64)
    while jlo.size:
        mid = (jlo + jhi) >> 1
        cap = mid - 1
        if reach is not None:
            cap = np.minimum(cap, reach[mid])
        out.append((mid, jlo - 1, jhi + 1, cap, cum[mid], w[mid]))
        left = jlo < mid
        right = mid < jhi
        jlo, jhi = (np.concatenate((jlo[left], mid[right] + 1)),
                    np.concatenate((mid[left] - 1, jhi[right])))
    return out


def _layer(prev: np.ndarray, cum: np.ndarray, levels: list[tuple]
           ) -> tuple[np.ndarray, np.ndarray]:
    """One DP layer: ``out[j] = min_{i<j} prev[i] + (cum[j]-cum[i]) * w[j]`` for j=1..U.

    ``prev`` and ``cum`` have length U+1 (index 0 = nothing covered); ``w[j]`` is the
    per-sample cost of a bucket whose last distinct length is the j-th (1-based).
    ``levels`` (:func:`_levels`, built once for all layers) holds ``w`` and the cap of
    each window: with ``reach``, a bucket ending at ``j`` may start after ``i <= reach[j]``
    only (a non-decreasing ``reach`` keeps the arg-min monotone). Divide and conquer: the
    ``j`` of one depth are solved at once, each searching between the arg-mins of its
    solved neighbours. Ties go to the smallest
    ``i``; ``arg[j]`` is the first ``i`` searched when no ``i`` is allowed.
    Returns ``(out, arg)`` with ``out[0] = inf``.
    """
    u = cum.size - 1
    out = np.full(u + 1, np.inf)
    arg = np.zeros(u + 2, dtype=np.int64)
    arg[u + 1] = u - 1  # the window of the last j ends there
    for mid, below, above, cap, cum_j, w_j in levels:
        olo = arg[below]
        width = np.minimum(arg[above], cap)
        width -= olo
        width += 1
        np.maximum(width, 0, out=width)
        ends = np.cumsum(width)
        if ends[-1] == 0:
            arg[mid] = olo
            continue
        starts = ends - width
        cand = np.arange(int(ends[-1]), dtype=np.int64)
        cand -= np.repeat(starts - olo, width)
        # each candidate as (cost, i): NumPy orders complex numbers lexicographically, so
        # one minimum per window gives the least cost and, among ties, the smallest i
        pair = np.empty(cand.size, dtype=np.complex128)
        vals = pair.real
        np.subtract(np.repeat(cum_j, width), cum[cand], out=vals)
        vals *= np.repeat(w_j, width)
        vals += prev[cand]
        pair.imag = cand
        if not width.all():  # no i allowed: the window's first; reduceat needs non-empty
            arg[mid] = olo
            some = width > 0
            mid, starts = mid[some], starts[some]
        best = np.minimum.reduceat(pair, starts)
        out[mid] = best.real
        arg[mid] = best.imag
    return out, arg[:u + 1]


@dataclass(frozen=True)
class EdgeSolution:
    """DP tables for K = 1..max_k over one histogram."""

    hist: Histogram
    totals: np.ndarray  # totals[k-1]: minimal cost with k buckets
    args: list[np.ndarray]  # args[k-1][j]: best split before j with k buckets

    def edges(self, k: int) -> list[int]:
        """Upper edges of the best ``k``-bucket split (ascending, last = longest)."""
        k = min(k, len(self.args))
        cuts = []
        j = self.hist.values.size
        for layer in range(k - 1, -1, -1):
            cuts.append(j)
            j = int(self.args[layer][j])
            if j == 0:
                break
        return [int(self.hist.values[c - 1]) for c in reversed(cuts)]


def sample_prices(hist: Histogram, pad_multiple: int = 1, cost: CostModel | None = None,
                  budget: float | None = None, fill_weight: float = 1.0) -> np.ndarray:
    """What :func:`solve` prices one sample at in a bucket whose edge is each distinct length:
    its padded row, plus ``fill_weight`` of its share of the budget whole rows leave unfilled.

    Example::

        >>> sample_prices(Histogram.of([3, 5]), budget=8, fill_weight=1.0).tolist()
        [4.0, 8.0]
    """
    if not 0.0 <= fill_weight <= 1.0:
        raise ConfigError(f"fill_weight must lie in [0, 1], got {fill_weight}")
    cost = cost or CostModel()
    row = np.asarray(cost.row_cost(round_up(hist.values, pad_multiple)), dtype=np.float64)
    if budget is not None:
        row = row + fill_weight * (budget / np.maximum(1, np.floor(budget / row)) - row)
    return row


def solve(hist: Histogram, max_k: int, *, pad_multiple: int = 1,
          cost: CostModel | None = None, budget: float | None = None,
          fill_weight: float = 1.0, least: np.ndarray | None = None) -> EdgeSolution:
    """Run the DP for 1..max_k buckets over a histogram.

    Without ``budget`` a sample costs its padded row; with a per-micro-batch
    ``budget`` it costs its share of the batch, ``budget / floor(budget / row)``,
    which also counts the budget that whole rows cannot fill (the time a rank
    with a less full micro-batch waits for the others). ``fill_weight`` in [0, 1]
    blends the two: ``row + fill_weight * (share - row)``. Both are non-decreasing
    in the edge, so the DP stays exact. ``least[j]`` (one per distinct length) is the
    fewest samples a bucket whose edge is the ``j``-th distinct length may hold.
    """
    u = hist.values.size
    max_k = max(1, min(max_k, u))
    cum = np.concatenate(([0], np.cumsum(hist.counts))).astype(np.float64)
    w = np.concatenate(([0.0], sample_prices(hist, pad_multiple, cost, budget, fill_weight)))
    reach = None
    if least is not None:  # counts are whole: "at least 2.5 samples" is at least 3
        need = np.concatenate(([0.0], np.ceil(np.asarray(least, dtype=np.float64))))
        reach = np.searchsorted(cum, cum - need, side="right") - 1
    if _compiled is not None and u >= 1:
        return _solved_compiled(hist, max_k, cum, w, reach)
    levels = _levels(cum, w, reach)
    prev = np.full(u + 1, np.inf)
    prev[0] = 0.0
    totals, args = [], []
    for k in range(max_k):
        cur, arg = _layer(prev, cum, levels)
        cur[0] = 0.0  # fewer buckets than layers: an empty prefix stays free
        totals.append(cur[u])
        args.append(arg)
        if np.array_equal(cur, prev):  # one more bucket helped no prefix: every later layer
            totals.extend([cur[u]] * (max_k - k - 1))  # repeats this one's computation
            args.extend([arg] * (max_k - k - 1))
            break
        prev = cur
    return EdgeSolution(hist, np.asarray(totals), args)


def _solved_compiled(hist: Histogram, max_k: int, cum: np.ndarray, w: np.ndarray,
                     reach: np.ndarray | None) -> EdgeSolution:
    """:func:`solve`'s layers by the compiled kernel: the same tables, bit for bit."""
    n = cum.size
    totals = np.empty(max_k)
    table = np.empty((max_k, n), dtype=np.int64)
    if reach is not None:
        reach = np.ascontiguousarray(reach, dtype=np.int64)
    done = _compiled.layers(np.ascontiguousarray(cum, dtype=np.float64),
                            np.ascontiguousarray(w, dtype=np.float64), reach, max_k,
                            totals, table)
    totals[done:] = totals[done - 1]  # the layer that helped no prefix, repeated
    args = [table[k] for k in range(done)] + [table[done - 1]] * (max_k - done)
    return EdgeSolution(hist, totals, args)


def _rows_for(edges: Sequence[int], batch_size: int | None, max_tokens: int | None,
              pad_multiple: int, cost: CostModel) -> np.ndarray:
    p = np.asarray(round_up(np.asarray(edges), pad_multiple))
    if batch_size is not None:
        return np.full(p.size, batch_size, dtype=np.int64)
    if max_tokens is not None:
        return np.maximum(1, (max_tokens // cost.row_cost(p))).astype(np.int64)
    return np.ones(p.size, dtype=np.int64)


def bucket_counts(lengths: np.ndarray | Histogram, edges: Sequence[int]) -> np.ndarray:
    """Samples per bucket for ascending upper ``edges``.

    Example::

        >>> bucket_counts(np.array([1, 2, 3, 9]), [2, 9]).tolist()
        [2, 2]
    """
    hist = lengths if isinstance(lengths, Histogram) else Histogram.of(lengths)
    cum = np.concatenate(([0], np.cumsum(hist.counts)))
    pos = np.searchsorted(hist.values, np.asarray(edges), side="right")
    return np.diff(np.concatenate(([0], cum[pos])))


def optimal_edges(
    lengths: Sequence[int] | np.ndarray,
    num_buckets: int | str,
    *,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    pad_multiple: int = 1,
    cost: CostModel | None = None,
) -> list[int]:
    """Bucket upper edges that minimise padded tokens (or ``cost``) exactly.

    ``num_buckets="auto"`` picks the smallest K whose efficiency is within 1% of
    the best reachable while every bucket holds at least
    ``MIN_BATCHES_PER_BUCKET`` micro-batches (rows per batch from ``batch_size``
    or ``max_tokens``) and ``MIN_SAMPLES_PER_BUCKET`` samples, so batches can be
    re-formed every epoch; under ``max_tokens`` a sample is also priced with
    ``FILL_WEIGHT`` of the budget its batch's whole rows leave unfilled. ``lengths`` are
    checked as :func:`~lengthwise.plan_epoch` checks them: a negative, fractional, NaN or
    too large length raises :class:`~lengthwise.planning.errors.LengthError` naming its row.

    Example::

        >>> optimal_edges([5, 5, 6, 100, 101], 2)
        [6, 101]
    """
    lengths = validate_lengths(lengths)
    if batch_size is not None and max_tokens is not None:
        raise ConfigError("give batch_size or max_tokens, not both")
    cost = cost or CostModel()
    hist = Histogram.of(lengths)
    if num_buckets == "auto":
        return auto_edges(hist, batch_size=batch_size, max_tokens=max_tokens,
                          pad_multiple=pad_multiple, cost=cost)
    if not isinstance(num_buckets, (int, np.integer)) or num_buckets < 1:
        raise ConfigError(f"num_buckets must be a positive integer or 'auto', got {num_buckets!r}")
    return solve(hist, int(num_buckets), pad_multiple=pad_multiple, cost=cost).edges(
        int(num_buckets))


def auto_edges(hist: Histogram, *, batch_size: int | None, max_tokens: int | None,
               pad_multiple: int = 1, cost: CostModel | None = None,
               max_buckets: int = AUTO_MAX_BUCKETS,
               fill_weight: float = FILL_WEIGHT) -> list[int]:
    """The ``"auto"`` rule of :func:`optimal_edges` over a histogram (:func:`auto_choice`)."""
    return auto_choice(hist, batch_size=batch_size, max_tokens=max_tokens,
                       pad_multiple=pad_multiple, cost=cost, max_buckets=max_buckets,
                       fill_weight=fill_weight).edges


@dataclass(frozen=True)
class AutoEdges:
    """The edges ``"auto"`` chose, and how far each bucket's fewest samples were kept.

    ``minimum`` is ``"full"`` (every bucket holds ``MIN_BATCHES_PER_BUCKET`` micro-batches and
    ``MIN_SAMPLES_PER_BUCKET`` samples), ``"batch"`` (one full micro-batch) or ``"none"``;
    ``price`` is the cost of the edges ``"auto"`` picks under the full minimum over the cost
    of ``edges`` (``None``: the full minimum is kept, or no edges can keep it); ``small`` the
    buckets below the full minimum, as ``(edge, samples)``.
    """

    edges: list[int]
    minimum: str
    price: float | None
    small: list[tuple[int, int]]

    def note(self) -> str | None:
        """One line saying which buckets hold fewer samples than the full minimum, and why."""
        if not self.small:
            return None
        listed = ", ".join(f"edge {e}: {n} samples" for e, n in self.small[:3])
        more = f" and {len(self.small) - 3} more" if len(self.small) > 3 else ""
        why = ("the samples are too few to make every bucket that large" if self.price is None
               else f"making every bucket that large would cost {self.price:.2f}x the padded "
                    "tokens and unfilled budget of these edges")
        return (f"auto edges: {len(self.small)} bucket(s) ({listed}{more}) hold fewer than "
                f"{MIN_BATCHES_PER_BUCKET} micro-batches or {MIN_SAMPLES_PER_BUCKET} samples, "
                f"so their batches are re-formed from few samples each epoch; {why}")


def auto_choice(hist: Histogram, *, batch_size: int | None, max_tokens: int | None,
                pad_multiple: int = 1, cost: CostModel | None = None,
                max_buckets: int = AUTO_MAX_BUCKETS,
                fill_weight: float = FILL_WEIGHT) -> AutoEdges:
    """The ``"auto"`` edges over a histogram, with the minimum per bucket they keep.

    Each minimum is a constraint of the DP, and a pick is the smallest K within
    :data:`AUTO_TOLERANCE` of the best efficiency under it. The full minimum is kept while its
    pick costs at most :data:`AUTO_MINIMUM_PRICE` more than the pick of buckets that each
    fill one micro-batch (the least a bucket holds for its cost to be what the DP counts: a
    smaller one passes its samples on to the next bucket's batches). Under a token budget
    (``max_tokens``) samples are priced with ``fill_weight`` of their share of the budget
    (:func:`solve`), so a bucket whose edge is far above its samples costs the rows it
    cannot fit.
    """
    cost = cost or CostModel()
    budget = max_tokens if batch_size is None else None
    ideal = float(np.sum(hist.counts * cost.row_cost(hist.values)))
    rows = _rows_for(hist.values, batch_size, max_tokens, pad_multiple, cost)
    least = np.maximum(MIN_BATCHES_PER_BUCKET * rows, MIN_SAMPLES_PER_BUCKET)
    total = int(hist.counts.sum())

    def pick(need: np.ndarray | None) -> tuple[EdgeSolution, int, float] | None:
        """The pick under the fewest samples ``need`` per bucket: (solution, K, cost)."""
        if need is not None and total < np.ceil(need[-1]):
            return None  # the last bucket holds too few samples for any K: no layer is finite
        sol = solve(hist, max_buckets, pad_multiple=pad_multiple, cost=cost, budget=budget,
                    fill_weight=fill_weight, least=need)
        feasible = [(k, ideal / float(sol.totals[k - 1]))
                    for k in range(1, len(sol.args) + 1) if np.isfinite(sol.totals[k - 1])]
        if not feasible:
            return None
        best = max(eff for _, eff in feasible)
        k = next(k for k, eff in feasible if eff >= (1 - AUTO_TOLERANCE) * best)
        return sol, k, float(sol.totals[k - 1])

    # every bucket large enough to re-form its batches each epoch (a constraint of the DP
    # itself, so narrow buckets go where samples are dense), unless that costs too much more
    # than one full batch per bucket; on data too small for it, one full batch per bucket;
    # failing that, no constraint
    full = pick(least)
    if full is not None:
        # each distinct length a bucket of its own: a floor under the cost of any edges
        floor = float(np.sum(hist.counts * sample_prices(hist, pad_multiple, cost, budget,
                                                         fill_weight)))
        if full[2] <= (1 + AUTO_MINIMUM_PRICE) * floor:
            return _chosen(hist, full, "full", least, None)
        one = pick(rows)  # feasible: it asks for fewer samples
        if full[2] <= (1 + AUTO_MINIMUM_PRICE) * one[2]:
            return _chosen(hist, full, "full", least, None)
        return _chosen(hist, one, "batch", least, full[2])
    one = pick(rows)
    return _chosen(hist, one or pick(None), "batch" if one else "none", least, None)


def _chosen(hist: Histogram, got: tuple[EdgeSolution, int, float], minimum: str,
            least: np.ndarray, first: float | None) -> AutoEdges:
    """The :class:`AutoEdges` of a pick kept under ``minimum``; ``first``: the cost of the
    pick under the full minimum, when that was passed over for costing too much."""
    sol, k, paid = got
    edges = sol.edges(k)
    counts = bucket_counts(hist, edges)
    need = least[np.searchsorted(hist.values, edges)]
    small = [(int(e), int(n)) for e, n, m in zip(edges, counts, need, strict=True) if n < m]
    return AutoEdges(edges, minimum, None if first is None else first / paid, small)
