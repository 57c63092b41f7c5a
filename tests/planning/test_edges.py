"""Optimal bucket edges: the DP equals brute force, and the "auto" rule."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise import optimal_edges
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel, round_up
from lengthwise.planning.edges import (
    FILL_WEIGHT,
    MIN_BATCHES_PER_BUCKET,
    MIN_SAMPLES_PER_BUCKET,
    Histogram,
    bucket_counts,
    solve,
)


def padded_cost(lengths, edges, multiple=1, cost=None):
    cost = cost or CostModel()
    lengths = np.asarray(lengths)
    total, lo = 0.0, 0
    for e in edges:
        n = np.sum((lengths > lo) & (lengths <= e))
        total += n * cost.row_cost(round_up(e, multiple))
        lo = e
    assert lo >= lengths.max()
    return total


def brute_force(lengths, k, multiple=1, cost=None):
    values = np.unique(lengths)
    best = None
    for inner in itertools.combinations(values[:-1].tolist(), min(k, values.size) - 1):
        c = padded_cost(lengths, [*inner, int(values[-1])], multiple, cost)
        best = c if best is None else min(best, c)
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=40), st.integers(1, 6),
       st.sampled_from([1, 4, 8]), st.sampled_from([(1, 0, 0), (1, 0.01, 0), (1, 0.002, 30)]))
def test_dp_equals_brute_force(lengths, k, multiple, coeffs):
    cost = CostModel(*coeffs)
    edges = optimal_edges(lengths, k, pad_multiple=multiple, cost=cost)
    assert edges == sorted(edges) and edges[-1] == max(lengths)
    assert len(edges) <= k
    assert padded_cost(lengths, edges, multiple, cost) == pytest.approx(
        brute_force(lengths, k, multiple, cost))


def test_reference_lognormal_edges():
    # docs/metrics.md: six optimal edges for this shape come out near
    # [833, 1210, 1661, 2323, 3592, 8192]
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(1050), 0.5, 902_087))), 16, 8192)
    edges = optimal_edges(lengths.astype(np.int64), 6, batch_size=4)
    assert np.allclose(edges, [833, 1210, 1661, 2323, 3592, 8192], rtol=0.03)


def test_more_buckets_never_cost_more():
    lengths = np.random.default_rng(1).integers(1, 5000, 20_000)
    sol = solve(Histogram.of(lengths), 40)
    assert np.all(np.diff(sol.totals) <= 1e-6)
    for k in (1, 7, 40):
        assert padded_cost(lengths, sol.edges(k)) == pytest.approx(sol.totals[k - 1])


def test_auto_keeps_buckets_large_enough_and_near_best():
    raw = np.random.default_rng(2).lognormal(6, 1, 50_000).astype(np.int64) + 1
    lengths = np.minimum(raw, 8192)
    edges = optimal_edges(lengths, "auto", max_tokens=16384)

    def feasible(e):
        rows = np.floor(16384 / np.asarray(e))
        need = np.maximum(MIN_BATCHES_PER_BUCKET * rows, MIN_SAMPLES_PER_BUCKET)
        return np.all(bucket_counts(lengths, e) >= need)

    def priced(e):  # padded row plus FILL_WEIGHT of the budget whole rows leave unfilled
        e = np.asarray(e, dtype=np.float64)
        share = 16384 / np.floor(16384 / e)
        return float(np.sum(bucket_counts(lengths, e) * (e + FILL_WEIGHT * (share - e))))

    assert feasible(edges)
    # each layer is the exact optimum for that k among edges whose buckets are large enough
    hist = Histogram.of(lengths)
    least = np.maximum(MIN_BATCHES_PER_BUCKET * np.floor(16384 / hist.values),
                       MIN_SAMPLES_PER_BUCKET)
    sol = solve(hist, 128, budget=16384, fill_weight=FILL_WEIGHT, least=least)
    eff = {k: lengths.sum() / priced(sol.edges(k))
           for k in range(1, 129) if np.isfinite(sol.totals[k - 1])}
    assert all(feasible(sol.edges(k)) for k in eff)
    best = max(eff.values())
    assert lengths.sum() / priced(edges) >= 0.99 * best
    assert all(v < 0.99 * best for k, v in eff.items() if k < len(edges))
    assert len(edges) >= 10  # many narrow buckets on a wide distribution
    # without the budget's share the rule is the padding-optimal one
    pad_only = optimal_edges(lengths, 8)
    assert solve(Histogram.of(lengths), 8, budget=16384, fill_weight=0.0).edges(8) == pad_only


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=40), k=st.integers(1, 4),
       least=st.integers(0, 6))
def test_dp_with_a_least_count_per_bucket_matches_brute_force(lengths, k, least):
    lengths = np.asarray(lengths)
    hist = Histogram.of(lengths)
    # the fewest samples grows with the rows a short edge allows: cum - least non-decreasing
    need = least * np.maximum(1, 40 // hist.values)
    sol = solve(hist, k, least=need)
    best = np.inf
    values = hist.values.tolist()
    for kk in range(1, min(k, len(values)) + 1):
        for cut in itertools.combinations(values[:-1], kk - 1):
            edges = [*cut, values[-1]]
            counts = bucket_counts(hist, edges)
            idx = np.searchsorted(hist.values, edges)
            if np.all(counts >= need[idx]):
                best = min(best, float(np.sum(counts * np.asarray(edges))))
    got = float(sol.totals[min(k, len(values)) - 1])
    assert (np.isinf(best) and np.isinf(got)) or abs(got - best) < 1e-6


def test_priced_by_budget_share_edges_sit_at_budget_over_rows():
    lengths = np.random.default_rng(3).integers(600, 3000, 20_000)
    edges = solve(Histogram.of(lengths), 6, budget=16384).edges(6)
    # a bucket's edge is the longest sample that still lets its rows fill the budget
    longest_for_rows = [16384 // (16384 // e) for e in edges[:-1]]
    assert all(e >= r - 40 for e, r in zip(edges[:-1], longest_for_rows, strict=True))
    with pytest.raises(ValueError, match="fill_weight"):
        solve(Histogram.of(lengths), 2, budget=16384, fill_weight=2.0)


def test_single_distinct_length_and_bad_counts():
    assert optimal_edges([7, 7, 7], 3) == [7]
    with pytest.raises(ValueError, match="num_buckets"):
        optimal_edges([1, 2], 0)
    with pytest.raises(ValueError, match="not both"):
        optimal_edges([1, 2], 2, batch_size=2, max_tokens=10)


@pytest.mark.parametrize("lengths, says", [
    (np.array([np.nan, 3.0, 4.0]), "row 0: nan is not a finite length"),
    (np.array([np.inf, 3.0, 4.0]), "row 0: inf is too large"),
    (np.array([1, 2**63 + 5], dtype=np.uint64), "row 1: 9223372036854775813 is too large"),
    (np.array([-5, 3, 4]), "row 0: -5 is negative"),
    (np.array([2.7, 3.2, 4.9]), "row 0: 2.7 is not a whole number"),
])
@pytest.mark.parametrize("k", [2, "auto"])
def test_optimal_edges_refuses_lengths_a_plan_refuses(lengths, says, k):
    from lengthwise.planning.errors import LengthError

    with pytest.raises(LengthError, match=says.replace("*", r"\*")):
        optimal_edges(lengths, k, max_tokens=64)
    assert optimal_edges(np.array([2.0, 3.0, 9.0]), 2) == [3, 9]  # whole floats are lengths


def _layer_as_it_was(prev, cum, w, least=None):
    """The DP layer before it was made faster, kept to check that the new one agrees exactly
    (masked candidates instead of a window cut at ``reach``; ``np.unique`` for first hits)."""
    u = cum.size - 1
    out = np.full(u + 1, np.inf)
    arg = np.zeros(u + 1, dtype=np.int64)
    jlo, jhi = np.array([1]), np.array([u])
    olo, ohi = np.array([0]), np.array([u - 1])
    while jlo.size:
        mid = (jlo + jhi) // 2
        hi = np.minimum(ohi, mid - 1)
        width = hi - olo + 1
        seg = np.repeat(np.arange(mid.size), width)
        starts = np.concatenate(([0], np.cumsum(width)[:-1]))
        cand = olo[seg] + (np.arange(seg.size) - starts[seg])
        jm = mid[seg]
        vals = prev[cand] + (cum[jm] - cum[cand]) * w[jm]
        if least is not None:
            vals[cum[jm] - cum[cand] < least[jm]] = np.inf
        mins = np.minimum.reduceat(vals, starts)
        hit = np.flatnonzero(vals == mins[seg])
        best = cand[hit[np.unique(seg[hit], return_index=True)[1]]]
        out[mid] = mins
        arg[mid] = best
        left, right = jlo <= mid - 1, mid + 1 <= jhi
        jlo, jhi, olo, ohi = (
            np.concatenate((jlo[left], mid[right] + 1)),
            np.concatenate((mid[left] - 1, jhi[right])),
            np.concatenate((olo[left], best[right])),
            np.concatenate((best[left], ohi[right])))
    return out, arg


def _solve_as_it_was(hist, max_k, budget, least):
    cum = np.concatenate(([0], np.cumsum(hist.counts))).astype(np.float64)
    row = hist.values.astype(np.float64)
    if budget is not None:
        row = row + FILL_WEIGHT * (budget / np.maximum(1, np.floor(budget / row)) - row)
    w = np.concatenate(([0.0], row))
    lw = None if least is None else np.concatenate(([0.0], np.asarray(least, dtype=np.float64)))
    prev = np.full(cum.size, np.inf)
    prev[0] = 0.0
    layers = []
    for _ in range(max(1, min(max_k, hist.values.size))):
        cur, arg = _layer_as_it_was(prev, cum, w, lw)
        cur[0] = 0.0
        layers.append((cur, arg))
        prev = cur
    return layers


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.integers(1, 60), min_size=1, max_size=40),
       spread=st.integers(1, 400), k=st.integers(1, 12),
       budget=st.sampled_from([None, 256, 1000]), least=st.integers(0, 30))
def test_dp_layers_agree_exactly_with_the_kept_reference(values, spread, k, budget, least):
    """Every layer's costs and arg-mins, ties and infeasible cells included, are bit for bit
    those of the DP before it cut its windows at the least count."""
    lengths = np.repeat(np.asarray(values) * spread // 10 + 1, np.asarray(values) % 5 + 1)
    hist = Histogram.of(lengths)
    need = None if least == 0 else np.full(hist.values.size, least) - hist.values % 3
    sol = solve(hist, k, budget=budget, fill_weight=FILL_WEIGHT if budget else 1.0,
                least=need)
    ref = _solve_as_it_was(hist, k, budget, need)
    assert len(ref) == len(sol.args)
    for (cur, arg), total, new_arg in zip(ref, sol.totals, sol.args, strict=True):
        assert np.array_equal(arg, new_arg)
        assert cur[-1] == total or (np.isinf(cur[-1]) and np.isinf(total))


def _auto_as_it_was(hist, budget, batch_size, max_buckets):
    """The "auto" rule over the layers of the kept reference DP: three tries of the least
    count per bucket, every layer of each, the smallest K within tolerance of the best; the
    full minimum kept unless its pick costs more than AUTO_MINIMUM_PRICE over the pick of one
    full batch per bucket (always compared, no floor to skip the comparison)."""
    from lengthwise.planning.edges import AUTO_MINIMUM_PRICE, AUTO_TOLERANCE

    rows = (np.full(hist.values.size, batch_size) if batch_size is not None
            else np.maximum(1, budget // hist.values))
    ideal = float(np.sum(hist.counts * hist.values))

    def pick(need):
        layers = _solve_as_it_was(hist, max_buckets, budget, need)
        feasible = [(k, ideal / float(cur[-1])) for k, (cur, _) in enumerate(layers, 1)
                    if np.isfinite(cur[-1])]
        if not feasible:
            return None
        best = max(eff for _, eff in feasible)
        k = next(k for k, eff in feasible if eff >= (1 - AUTO_TOLERANCE) * best)
        return layers, k, float(layers[k - 1][0][-1])

    full = pick(np.maximum(MIN_BATCHES_PER_BUCKET * rows, MIN_SAMPLES_PER_BUCKET))
    one = pick(rows)
    if full is not None and one is not None and full[2] > (1 + AUTO_MINIMUM_PRICE) * one[2]:
        full = None  # the full minimum costs too much more than one batch per bucket
    layers, k, _ = full or one or pick(None)
    cuts, j = [], hist.values.size
    for layer in range(k - 1, -1, -1):
        cuts.append(j)
        j = int(layers[layer][1][j])
        if j == 0:
            break
    return [int(hist.values[c - 1]) for c in reversed(cuts)]


@settings(max_examples=120, deadline=None)
@given(values=st.lists(st.integers(1, 80), min_size=1, max_size=30),
       repeat=st.integers(1, 12), scale=st.integers(1, 60),
       rule=st.sampled_from([("budget", 512), ("budget", 4096), ("rows", 2), ("rows", 8)]),
       max_buckets=st.integers(1, 10))
def test_auto_edges_equal_the_kept_reference_dp(values, repeat, scale, rule, max_buckets):
    """Exact ties (repeated and evenly spaced lengths), data too small for the least count
    per bucket, and every fallback of the rule: the same edges as the reference DP."""
    from lengthwise.planning.edges import auto_edges

    lengths = np.repeat(np.asarray(values) * scale, 1 + np.arange(len(values)) % repeat)
    hist = Histogram.of(lengths)
    budget, batch_size = (rule[1], None) if rule[0] == "budget" else (None, rule[1])
    got = auto_edges(hist, batch_size=batch_size, max_tokens=budget, max_buckets=max_buckets)
    assert got == _auto_as_it_was(hist, budget, batch_size, max_buckets)


def test_complex_minimum_is_lexicographic_as_the_layers_need():
    # the DP takes (cost, i) pairs as complex numbers: the least cost, then the smallest i,
    # infeasible (infinite) costs included
    pairs = np.array([2 + 5j, 2 + 3j, 1 + 9j, 1 + 4j, np.inf + 7j, np.inf + 6j])
    assert np.minimum.reduceat(pairs, [0, 2, 4]).tolist() == [2 + 3j, 1 + 4j, complex(np.inf, 6)]


def test_layers_stop_once_one_more_bucket_helps_no_prefix(monkeypatch):
    from lengthwise.planning import edges

    calls = []
    layer = edges._layer
    monkeypatch.setattr(edges, "_compiled", None)  # the NumPy layers (the compiled: elsewhere)
    monkeypatch.setattr(edges, "_layer", lambda *a: calls.append(1) or layer(*a))
    lengths = np.repeat(np.arange(1, 11), 4)  # 40 samples: at most two buckets of 16
    hist = Histogram.of(lengths)
    need = np.full(hist.values.size, 16)
    sol = solve(hist, 10, least=need)
    assert len(calls) < 10 and len(sol.args) == 10
    ref = _solve_as_it_was(hist, 10, None, need)
    for (cur, arg), total, new_arg in zip(ref, sol.totals, sol.args, strict=True):
        assert np.array_equal(arg, new_arg) and cur[-1] == total


@pytest.mark.parametrize("lengths, budget, edges, small", [
    (np.array([2048] * 100_000 + [8192] * 5), 16384, [2048, 8192], [(8192, 5)]),
    (np.concatenate([np.full(10**6, 3), [8000]]), 8192, [3, 8000], [(8000, 1)]),
    (np.array([2048] * 100_000 + [8192] * 16), 16384, [2048, 8192], []),
])
def test_auto_keeps_a_tail_of_few_long_samples_out_of_the_short_bucket(lengths, budget, edges,
                                                                       small):
    from lengthwise.planning.edges import auto_choice

    chosen = auto_choice(Histogram.of(lengths), batch_size=None, max_tokens=budget)
    assert chosen.edges == edges == optimal_edges(lengths, "auto", max_tokens=budget)
    assert chosen.small == small
    if small:  # one bucket would fit the rows of the long samples only: it is said what it costs
        assert chosen.minimum == "batch" and chosen.price > 3.9
        assert f"edge {small[0][0]}: {small[0][1]} samples" in chosen.note()
        assert f"{chosen.price:.2f}x" in chosen.note()
    else:
        assert chosen.minimum == "full" and chosen.note() is None


def _priced(hist, edges, budget, batch_size):
    """What the edges cost as auto prices them: each sample at its bucket edge's price."""
    from lengthwise.planning.edges import sample_prices

    price = sample_prices(Histogram(np.asarray(edges), np.ones(len(edges), dtype=np.int64)),
                          budget=None if batch_size else budget,
                          fill_weight=0.0 if batch_size else FILL_WEIGHT)
    return float(np.sum(bucket_counts(hist, edges) * price))


@settings(max_examples=80, deadline=None)
@given(body=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 400)), min_size=1,
                     max_size=12),
       tail=st.lists(st.tuples(st.integers(1, 8192), st.integers(1, 20)), max_size=4),
       rule=st.sampled_from([("budget", 8192), ("budget", 16384), ("rows", 4)]))
def test_auto_never_costs_much_more_than_one_batch_per_bucket(body, tail, rule):
    """Over histograms of a body and a tail of a few long samples: the auto edges cost at most
    AUTO_MINIMUM_PRICE more than its pick of buckets that each fill one micro-batch, and so at
    most that and AUTO_TOLERANCE more than the best such edges of any count; and a plan of
    them reports its budget fill."""
    from lengthwise import plan_epoch
    from lengthwise.planning.edges import AUTO_MINIMUM_PRICE, AUTO_TOLERANCE, auto_choice

    lengths = np.repeat(*map(np.asarray, zip(*(body + tail), strict=True)))
    hist = Histogram.of(lengths)
    budget, batch_size = (rule[1], None) if rule[0] == "budget" else (None, rule[1])
    chosen = auto_choice(hist, batch_size=batch_size, max_tokens=budget)
    rows = np.full(hist.values.size, batch_size) if batch_size else budget // hist.values
    if hist.counts.sum() < rows[-1]:  # too few samples for one batch per bucket
        assert chosen.minimum == "none"
        return
    one = solve(hist, 128, budget=budget, fill_weight=0.0 if batch_size else FILL_WEIGHT,
                least=rows)
    paid = _priced(hist, chosen.edges, budget, batch_size)
    best = float(np.nanmin(one.totals))
    assert paid <= (1 + AUTO_MINIMUM_PRICE) / (1 - AUTO_TOLERANCE) * best * (1 + 1e-9)
    ideal = float(np.sum(hist.counts * hist.values))
    effs = np.where(np.isfinite(one.totals), ideal / one.totals, 0.0)
    k_one = int(np.argmax(effs >= (1 - AUTO_TOLERANCE) * effs.max())) + 1
    assert paid <= (1 + AUTO_MINIMUM_PRICE) * float(one.totals[k_one - 1]) * (1 + 1e-9)
    assert [e for e, _ in chosen.small] == [
        e for e, n in zip(chosen.edges, bucket_counts(hist, chosen.edges), strict=True)
        if n < max(MIN_SAMPLES_PER_BUCKET, MIN_BATCHES_PER_BUCKET * (
            batch_size or max(1, budget // e)))]
    if budget is not None:
        stats = plan_epoch(lengths, PlanConfig(max_tokens=budget)).stats
        assert stats["budget_fill"] == pytest.approx(
            stats["padded_tokens"] / (budget * stats["micro_batches"]))
        assert 0 < stats["budget_fill"] <= 1
