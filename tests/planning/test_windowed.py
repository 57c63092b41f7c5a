"""Windowed plans and the O(1)-memory shuffle: invariants (hypothesis), quality, errors."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lengthwise.planning.config import PlanConfig
from lengthwise.planning.lengths import LengthError, open_lengths
from lengthwise.planning.plan import plan_epoch
from lengthwise.planning.shuffle import permuted
from lengthwise.planning.windowed import WindowedPlan, resolve_window


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
def test_permuted_is_a_bijection(n, seed, epoch):
    ids = permuted(np.arange(n), n, seed, epoch)
    assert np.array_equal(np.sort(ids), np.arange(n))


def test_permuted_depends_on_seed_and_epoch_and_is_uniform():
    n = 100_000
    a, b, c = (permuted(np.arange(n), n, s, e) for s, e in ((0, 0), (0, 1), (1, 0)))
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    # a window of positions is a uniform sample of ids: each decile holds ~10% of it
    share = np.bincount(a[:20_000] * 10 // n, minlength=10) / 20_000
    assert np.all(np.abs(share - 0.1) < 0.01)
    # evaluated anywhere: positions near the end of a billion-sample epoch
    far = permuted(np.arange(10**9 - 1000, 10**9), 10**9, 0, 0)
    assert np.unique(far).size == 1000 and far.max() < 10**9


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 3000), window=st.integers(1, 4000), world=st.integers(1, 6),
       accum=st.integers(1, 3), budget=st.sampled_from([None, 1000, 2000]),
       order=st.sampled_from(["stratified", "interleave", "sorted"]), seed=st.integers(0, 99))
def test_windowed_invariants(n, window, world, accum, budget, order, seed):
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 500, n)
    assume(n >= 2 * world and window >= 2 * world)
    cfg = PlanConfig(max_tokens=budget, batch_size=None if budget else 3, order=order,
                     world_size=world, grad_accum=accum)
    wp = WindowedPlan(lens, cfg, window=window, seed=seed, epoch=1)
    per_rank = [list(wp.rank_batches(r)) for r in range(world)]
    # equal micro-batch counts per rank
    assert {len(b) for b in per_rank} == {wp.num_batches}
    ids = np.concatenate([x for batches in per_rank for x in batches])
    # exactly once over all ranks
    assert np.array_equal(np.sort(ids), np.arange(n))
    # the budget is never exceeded
    if budget:
        assert all(lens[b].max() * b.size <= budget for batches in per_rank for b in batches)
    # resuming at any local position yields the rest of the rank's sequence
    start = int(rng.integers(0, wp.num_batches + 1))
    fresh = WindowedPlan(lens, cfg, window=window, seed=seed, epoch=1)
    rest = list(fresh.rank_batches(world - 1, start))
    assert len(rest) == len(per_rank[-1]) - start
    assert all(np.array_equal(x, y) for x, y in zip(rest, per_rank[-1][start:], strict=True))


def test_windows_are_random_samples_and_quality_matches_the_whole_epoch():
    rng = np.random.default_rng(0)
    lens = np.clip(np.exp(rng.normal(np.log(1050), 0.5, 400_000)).round(), 16, 8192)
    cfg = PlanConfig(max_tokens=16384, world_size=8)
    whole = plan_epoch(lens.astype(np.int64), cfg).stats
    wp = WindowedPlan(lens, cfg, window=100_000)
    plan = wp.materialize()
    assert np.array_equal(np.sort(plan.indices), np.arange(lens.size))
    stats = plan.stats
    assert stats["padding_efficiency"] >= 0.99 * whole["padding_efficiency"]
    assert stats["step_cv_ratio"] < 1.0
    # another epoch shuffles into other windows
    other = WindowedPlan(lens, cfg, window=100_000, epoch=1)
    assert np.intersect1d(wp.window_ids(0), other.window_ids(0)).size < 30_000


def test_window_errors_name_the_sample(tmp_path):
    lens = np.full(1000, 10)
    lens[737] = -4
    wp = WindowedPlan(lens, PlanConfig(batch_size=4), window=100)
    with pytest.raises(LengthError, match="row 737: -4"):
        list(wp.rank_batches(0))
    lens[737] = 9000
    wp = WindowedPlan(lens, PlanConfig(max_tokens=4096, on_overflow="error"), window=100)
    with pytest.raises(LengthError, match="sample 737 has 9000 tokens, but one row holds"):
        list(wp.rank_batches(0))
    with pytest.raises(ValueError, match="window must be"):
        resolve_window("big", 10)
    with pytest.raises(ValueError, match="window must be >= 1"):
        resolve_window(0, 10)
    with pytest.raises(ValueError, match="too small for 8 ranks"):
        WindowedPlan(lens, PlanConfig(batch_size=4, world_size=8), window=10)


def test_open_lengths_maps_npy_without_copying(tmp_path):
    path = tmp_path / "lens.npy"
    np.save(path, np.arange(1, 100_001, dtype=np.int32))
    lens = open_lengths(path)
    assert isinstance(lens, np.memmap) and lens.dtype == np.int32
    wp = WindowedPlan(lens, PlanConfig(max_tokens=400_000, world_size=2), window=30_000)
    ids = np.concatenate([b for r in range(2) for b in wp.rank_batches(r)])
    assert np.array_equal(np.sort(ids), np.arange(100_000))
    np.save(tmp_path / "bad.npy", np.ones((3, 2)))
    with pytest.raises(LengthError, match="one-dimensional"):
        open_lengths(tmp_path / "bad.npy")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(200, 3000), window=st.integers(50, 1500), world=st.integers(1, 4),
       order=st.sampled_from(["stratified", "interleave", "bucket-random"]),
       even_out=st.sampled_from(["split", "drop", "repeat"]),
       rule=st.sampled_from([dict(max_tokens=4096), dict(batch_size=5),
                             dict(max_tokens=2048, max_len=900, pad_multiple=8)]),
       seed=st.integers(0, 3))
def test_windowed_len_counts_without_planning_a_window(n, window, world, order, even_out,
                                                       rule, seed):
    """``num_batches`` (the sampler's ``len()``) of a padded windowed plan comes from the
    windows' bucket sizes: no window is planned, and every count is the planned one."""
    assume(window >= 2 * world)
    lens = np.random.default_rng(seed).integers(1, 2000, n)
    config = PlanConfig(world_size=world, order=order, even_out=even_out, **rule)
    counted = WindowedPlan(lens, config, window=window, seed=seed)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(WindowedPlan, "plan_window", lambda *a, **k: pytest.fail("planned a window"))
        try:
            total = counted.num_batches
        except Exception as err:  # the same error the planned windows raise
            with pytest.raises(type(err)):
                for w in range(counted.num_windows):
                    WindowedPlan(lens, config, window=window, seed=seed).plan_window(w)
            return
    planned = WindowedPlan(lens, config, window=window, seed=seed)
    per_window = [planned.plan_window(w).num_batches for w in range(planned.num_windows)]
    assert total == sum(per_window)
    assert [counted.window_batches(w) for w in range(counted.num_windows)] == per_window
