"""Fast paths of the planner and its figures agree exactly with the direct computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.planning.batching import (
    greedy_batches,
    row_limit,
    sorted_padded_tokens,
    take_batches,
)
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel, round_up
from lengthwise.planning.edges import Histogram
from lengthwise.planning.lengths import LengthError, apply_overflow
from lengthwise.planning.sorting import stable_argsort

RULES = st.sampled_from([
    dict(batch_size=1), dict(batch_size=3), dict(batch_size=8), dict(max_tokens=64),
    dict(max_tokens=100, pad_multiple=8), dict(max_tokens=257),
    dict(max_cost=900.0, cost=CostModel(a=1.0, b=0.05, c=7.0)),
    dict(max_cost=350.0, cost=CostModel(a=0.7, b=0.0, c=3.0), pad_multiple=4),
])


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=300), rule=RULES)
def test_sorted_padded_tokens_equals_greedy_batches_along_the_sort(lengths, rule):
    lens = np.asarray(lengths, dtype=np.int64)
    limit = row_limit(**rule)
    if limit.max_length() is not None:
        lens = np.minimum(lens, limit.max_length())
    order = np.argsort(lens, kind="stable")
    idx, off = greedy_batches(order, lens, limit)
    longest = np.maximum.reduceat(lens[idx], off[:-1])
    expected = int(np.sum(np.diff(off) * round_up(longest, limit.pad_multiple)))
    hist = Histogram.of(lens)
    assert sorted_padded_tokens(hist.values, hist.counts, limit) == expected


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.sampled_from([-1.5, -0.0, 0.0, 0.25, 1e-9, 3.0, 7.0])
                     | st.floats(-1e6, 1e6),
                     max_size=400))
def test_stable_argsort_is_numpys_stable_argsort(keys):
    key = np.asarray(keys, dtype=np.float64)  # few distinct values: long runs of ties
    assert np.array_equal(stable_argsort(key), np.argsort(key, kind="stable"))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 5), max_size=40), seed=st.integers(0, 2**32 - 1))
def test_take_batches_equals_concatenating_the_batches_in_order(sizes, seed):
    offsets = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    indices = np.random.default_rng(seed).permutation(int(offsets[-1])).astype(np.int32)
    order = np.random.default_rng(seed + 1).permutation(len(sizes))
    got, new_off = take_batches(indices, offsets, order)
    batches = [indices[offsets[k]:offsets[k + 1]] for k in order]
    assert np.array_equal(got, np.concatenate([np.zeros(0, np.int32), *batches]))
    assert got.dtype == indices.dtype
    assert np.array_equal(np.diff(new_off), [b.size for b in batches])


def _apply_overflow_as_it_was(lengths, max_len, on_overflow, cut):
    keep = lengths > 0
    counts = {"samples": int(lengths.size), "dropped_empty": int(lengths.size - keep.sum()),
              "truncated": 0, "dropped_overflow": 0, "truncated_tokens": 0,
              "truncated_share": 0.0}
    total = float(lengths.sum(dtype=np.float64))
    if cut is not None:
        total += float(cut.sum(dtype=np.float64))
    over = (lengths > max_len) if max_len is not None else np.zeros(lengths.size, dtype=bool)
    n_over = int(over.sum())
    if n_over and on_overflow == "error":
        raise LengthError("over")
    if n_over and on_overflow == "drop":
        counts["dropped_overflow"] = n_over
        keep = keep & ~over
        over[:] = False
    truncated = over.copy()
    removed = 0
    if n_over and on_overflow == "truncate":
        removed = int((lengths[over] - max_len).sum())
        lengths = np.minimum(lengths, max_len)
    if cut is not None:
        earlier = (cut > 0) & keep
        truncated |= earlier
        removed += int(cut[earlier].sum())
    counts["truncated"] = int(truncated.sum())
    counts["truncated_tokens"] = removed
    counts["truncated_share"] = removed / total if total else 0.0
    return lengths, keep, counts


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=60),
       cut=st.none() | st.lists(st.integers(0, 5), min_size=60, max_size=60),
       max_len=st.none() | st.integers(1, 45),
       policy=st.sampled_from(["truncate", "drop", "error"]))
def test_apply_overflow_counts_what_it_did_before_it_skipped_work(lengths, cut, max_len, policy):
    lens = np.asarray(lengths, dtype=np.int64)
    cut = None if cut is None else np.asarray(cut[:lens.size], dtype=np.int64)
    try:
        expected = _apply_overflow_as_it_was(lens.copy(), max_len, policy, cut)
    except LengthError:
        with pytest.raises(LengthError):
            apply_overflow(lens.copy(), max_len, policy, cut=cut)
        return
    got = apply_overflow(lens.copy(), max_len, policy, cut=cut)
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2]


def _random_step_cv_as_it_was(lengths, ids, n_steps, seed=0, repeats=5):
    rng = np.random.default_rng([seed, 0x5EED])
    lens = lengths[ids].astype(np.float64)
    step = np.arange(ids.size) * n_steps // ids.size
    cvs, scvs = [], []
    for _ in range(repeats):
        perm = lens[rng.permutation(ids.size)]
        s1 = np.bincount(step, weights=perm, minlength=n_steps)
        s2 = np.bincount(step, weights=perm * perm, minlength=n_steps)
        cnt = np.bincount(step, minlength=n_steps)
        cvs.append(float(np.std(s2 / s1) / np.mean(s2 / s1)))
        scvs.append(float(np.std(s1 / cnt) / np.mean(s1 / cnt)))
    return float(np.mean(cvs)), float(np.mean(scvs))


def _step_lengths_as_it_was(lengths, indices, offsets, steps):
    per_sample_step = np.repeat(steps, np.diff(offsets))
    lens = lengths[indices].astype(np.float64)
    n_steps = int(steps[-1]) + 1
    s1 = np.bincount(per_sample_step, weights=lens, minlength=n_steps)
    s2 = np.bincount(per_sample_step, weights=lens * lens, minlength=n_steps)
    cnt = np.bincount(per_sample_step, minlength=n_steps)
    return s2 / np.maximum(s1, 1), s1 / np.maximum(cnt, 1)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 10_000), min_size=4, max_size=400),
       huge=st.booleans(), n_steps=st.integers(2, 4), seed=st.integers(0, 3),
       world=st.integers(1, 3))
def test_step_figures_equal_the_per_sample_sums(lengths, huge, n_steps, seed, world):
    """Segment sums of whole lengths (or, past float64's exact range, the sums as before)
    give the very figures the per-sample bincounts gave."""
    from lengthwise.planning.metrics import _step_means, random_step_cv, step_ids

    lens = np.asarray(lengths, dtype=np.int64) * (10**7 if huge else 1)
    ids = np.arange(lens.size)
    n_steps = min(n_steps, lens.size)
    assert random_step_cv(lens, ids, n_steps, seed=seed) == _random_step_cv_as_it_was(
        lens, ids, n_steps, seed=seed)
    off = np.unique(np.r_[0, np.arange(0, lens.size, 3), lens.size])
    steps = step_ids(off.size - 1, world, 1)
    for new, old in zip(_step_means(lens[ids], off, steps),
                        _step_lengths_as_it_was(lens, ids, off, steps), strict=True):
        assert np.array_equal(new, old)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 5), epoch=st.integers(0, 3), world=st.integers(1, 8),
       order=st.sampled_from(["sorted", "random", "bucket-random", "interleave", "stratified"]),
       even_out=st.sampled_from(["split", "drop", "repeat"]))
def test_batch_sets_before_ordering_are_the_plans_batches(seed, epoch, world, order, even_out):
    """``padded_batch_sets`` holds the sample sets of the plan's micro-batches, so
    ``recomposition`` from it equals the one between two whole plans."""
    from lengthwise.planning.config import PlanConfig
    from lengthwise.planning.metrics import batch_hashes, recomposition, recomposition_of
    from lengthwise.planning.padded import padded_batch_sets, plan_padded_epoch

    lens = np.random.default_rng(seed).integers(1, 3000, 4000)
    cfg = PlanConfig(max_tokens=8192, world_size=world, order=order, even_out=even_out)
    plan = plan_padded_epoch(lens, cfg, seed=seed, epoch=epoch)
    nxt = plan_padded_epoch(lens, cfg, seed=seed, epoch=epoch + 1)
    idx, off = padded_batch_sets(lens, cfg, seed=seed, epoch=epoch + 1)
    assert sorted(batch_hashes(idx, off).tolist()) == sorted(
        batch_hashes(nxt.indices, nxt.offsets).tolist())
    assert recomposition_of(plan.offsets, plan.indices, off, idx) == recomposition(plan, nxt)


def test_edges_solved_once_per_histogram_and_rule(monkeypatch):
    """Later epochs and other orders of the same lengths reuse the solved edges; other
    lengths or another batch rule solve again; at most SOLVED_EDGES_KEPT are kept."""
    from lengthwise.planning import padded
    from lengthwise.planning.plan import plan_epoch

    calls = []
    real = padded.auto_choice
    monkeypatch.setattr(padded, "auto_choice", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(padded, "_SOLVED", {})
    lens = np.random.default_rng(11).integers(1, 3000, 3000)
    first = plan_epoch(lens, PlanConfig(max_tokens=8192, world_size=2))
    again = plan_epoch(lens, PlanConfig(max_tokens=8192, world_size=2, order="interleave"), epoch=1)
    assert len(calls) == 1 and again.edges == first.edges
    again.edges.append(10**6)  # a caller's list is its own
    assert plan_epoch(lens, PlanConfig(max_tokens=8192, world_size=2)).edges == first.edges
    plan_epoch(lens, PlanConfig(max_tokens=4096, world_size=2))
    plan_epoch(lens[:-1], PlanConfig(max_tokens=8192, world_size=2))
    assert len(calls) == 3
    for n in range(padded.SOLVED_EDGES_KEPT + 2):
        plan_epoch(lens[: 2000 + n], PlanConfig(batch_size=4))
    assert len(padded._SOLVED) == padded.SOLVED_EDGES_KEPT
