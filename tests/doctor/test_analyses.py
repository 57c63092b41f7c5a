"""Each analysis on inputs whose answer is known by construction."""

from __future__ import annotations

import itertools
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.doctor.attribution import (
    attribute,
    composition,
    eta_squared,
    r_squared,
    row_codes,
)
from lengthwise.doctor.bands import find_bands, merge_peaks
from lengthwise.doctor.cliffs import associate, find_cliffs, hypergeom_sf, near_checkpoint
from lengthwise.doctor.curve import find_phases, nonfinite_losses, stable_stats, warmup_from_lr
from lengthwise.doctor.numeric import rolling_mean, rolling_median
from lengthwise.doctor.periodicity import find_periodicity, runs_test

RNG = np.random.default_rng


# ------------------------------------------------------------------ smoothing
@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=40), st.integers(1, 9))
def test_rolling_mean_matches_direct_mean(values: list[float], half: int) -> None:
    y = np.asarray(values)
    got = rolling_mean(y, 2 * half + 1)
    for i in range(y.size):
        window = y[max(0, i - half) : i + half + 1]
        assert math.isclose(got[i], window.mean(), rel_tol=1e-9, abs_tol=1e-9)


def test_rolling_median_is_the_window_median_inside() -> None:
    y = RNG(0).normal(size=200)
    got = rolling_median(y, 11)
    for i in range(5, 195):
        assert got[i] == np.median(y[i - 5 : i + 6])


# ------------------------------------------------------------------ phases
def test_warmup_from_lr_and_no_warmup() -> None:
    steps = np.arange(1, 1001.0)
    lr = np.minimum(steps / 200.0, 1.0) * 3e-4
    assert warmup_from_lr(steps, lr) == (196.0, "lr warm-up")
    assert warmup_from_lr(steps, np.full(1000, 1e-4))[0] == 1.0
    assert warmup_from_lr(steps, np.full(1000, np.nan))[0] is None


def test_stable_region_starts_after_descent_and_user_override() -> None:
    steps = np.arange(1, 3001.0)
    loss = 2.0 + 3.0 * np.exp(-steps / 100.0) + 0.01 * RNG(1).normal(size=3000)
    auto = find_phases(steps, loss)
    assert auto.warmup_source == "loss" and 150 < auto.start < 1500 and auto.end == 3000
    user = find_phases(steps, loss, start=500, end=2500)
    assert (user.start, user.end, user.chosen_by) == (500.0, 2500.0, "user")
    with pytest.raises(ValueError, match="after --to"):
        find_phases(steps, loss, start=900, end=100)
    with pytest.raises(ValueError, match="no logged step"):
        find_phases(steps, loss, start=5000)


def test_flat_noisy_curve_has_no_settle_point() -> None:
    steps = np.arange(1, 2001.0)
    loss = 2.0 + 0.05 * RNG(2).normal(size=2000)
    assert find_phases(steps, loss).start == 1.0


# ------------------------------------------------------------------ stats
def test_loss_roughness_is_std_around_rolling_mean_51() -> None:
    y = 2.0 + 0.1 * RNG(3).normal(size=400)
    region = np.zeros(400, bool)
    region[100:300] = True
    s = stable_stats(y, region, np.zeros(400, bool))
    direct = np.std([y[i] - y[max(0, i - 25) : i + 26].mean() for i in range(100, 300)])
    assert math.isclose(s.loss_roughness, direct, rel_tol=1e-9)
    assert math.isclose(s.mean, y[100:300].mean()) and s.points == 200


def test_nonfinite_and_divergence() -> None:
    steps = np.arange(1, 11.0)
    loss = np.array([1, 1, np.nan, 1, 1, 1, 1, np.inf, np.nan, np.nan])
    nf = nonfinite_losses(steps, loss)
    assert (nf.count, nf.nan, nf.inf, nf.diverged_at) == (4, 3, 1, 8.0)
    assert nf.first_steps == [3.0, 8.0, 9.0, 10.0]
    assert nonfinite_losses(steps, np.ones(10)).count == 0


# ------------------------------------------------------------------ bands
@pytest.mark.parametrize("k", [2, 3, 4])
def test_bands_found_with_centres_and_shares(k: int) -> None:
    rng = RNG(10 + k)
    centres = 0.25 * np.arange(k)
    x = np.concatenate([rng.normal(c, 0.03, 500 + 100 * i) for i, c in enumerate(centres)])
    x = rng.permutation(x)  # steps from the bands interleave in time
    b = find_bands(x, level=2.0, rng=RNG(0))
    assert b.count == k
    assert np.allclose(b.offsets, centres, atol=0.01)
    assert np.allclose(b.centres, 2.0 + centres, atol=0.01)
    assert np.allclose(b.shares, [(500 + 100 * i) / x.size for i in range(k)], atol=0.02)
    assert b.p_value is not None and b.p_value < 0.05 and b.separation > 5


@pytest.mark.parametrize("draw", [
    lambda r: r.normal(size=3000),
    lambda r: r.standard_t(3, size=3000),
    lambda r: r.lognormal(0, 0.6, size=3000),
    lambda r: r.uniform(size=3000),
])
def test_unimodal_noise_is_not_banded(draw) -> None:
    b = find_bands(draw(RNG(7)), rng=RNG(0))
    assert b.count == 1


def test_too_few_points_are_not_tested() -> None:
    b = find_bands(np.arange(20.0))
    assert b.count is None and "not tested" in b.note


def test_merge_peaks_merges_shallow_valleys() -> None:
    x = np.linspace(-1, 1, 401)
    close = np.exp(-((x - 0.08) / 0.1) ** 2) + np.exp(-((x + 0.08) / 0.1) ** 2)
    apart = np.exp(-((x - 0.5) / 0.1) ** 2) + np.exp(-((x + 0.5) / 0.1) ** 2)
    d = np.diff(close)
    assert ((d[:-1] > 0) & (d[1:] <= 0)).sum() == 2  # two maxima, a shallow valley
    assert len(merge_peaks(close)) == 1 and len(merge_peaks(apart)) == 2


# ------------------------------------------------------------------ periodicity
@pytest.mark.parametrize("period", [2, 5, 12, 37, 64])
def test_sawtooth_period_is_found(period: int) -> None:
    t = np.arange(3000)
    x = 0.05 * ((t % period) / period - 0.5) + 0.01 * RNG(period).normal(size=3000)
    p = find_periodicity(x, interval=1.0)
    assert p.period == period and p.p_value < 1e-6
    assert p.runs is not None


def test_period_is_reported_in_steps() -> None:
    t = np.arange(2000)
    x = np.sin(2 * np.pi * t / 20) + 0.5 * RNG(1).normal(size=2000)
    assert find_periodicity(x, interval=10.0).period == 200.0


def test_noise_has_no_period() -> None:
    found = 0
    for seed in range(10):
        w = RNG(seed).normal(size=2000)
        ar = np.zeros(2000)
        for i in range(1, 2000):
            ar[i] = 0.7 * ar[i - 1] + w[i]
        found += find_periodicity(w, interval=1.0).period is not None
        found += find_periodicity(ar, interval=1.0).period is not None
    assert found <= 1


def test_runs_test_sees_long_runs() -> None:
    alternating = np.tile([1.0, -1.0], 200)
    blocks = np.repeat(np.tile([1.0, -1.0], 20), 10)
    assert runs_test(alternating).z > 5
    r = runs_test(blocks)
    assert r.z < -5 and r.mean_high == 10 and r.max_low == 10


# ------------------------------------------------------------------ cliffs
def test_cliffs_height_and_recovery() -> None:
    rng = RNG(4)
    loss = 2.0 + 0.01 * rng.normal(size=2000)
    for s0 in (500, 1200):
        loss[s0 : s0 + 30] += 0.8 * np.exp(-np.arange(30) / 3.0)
    steps = np.arange(1, 2001.0)
    cliffs, mask, _ = find_cliffs(steps, loss, np.ones(2000, bool))
    assert [c.step for c in cliffs] == [501.0, 1201.0]
    for c in cliffs:
        assert abs(c.height - 0.8) < 0.05
        assert 8 <= c.recovery_steps <= 16
    assert mask[500] and mask[1200] and not mask[700]


def test_no_cliffs_in_gaussian_noise_and_first_points() -> None:
    loss = 2.0 + 0.01 * RNG(5).normal(size=5000)
    loss[3] += 5.0  # the first points of a log never start a cliff
    cliffs, _, _ = find_cliffs(np.arange(5000.0), loss, np.ones(5000, bool))
    assert cliffs == []


def test_cliff_that_never_recovers() -> None:
    loss = 2.0 + 0.01 * RNG(6).normal(size=1000)
    loss[700:] += 1.0
    cliffs, _, _ = find_cliffs(np.arange(1000.0), loss, np.ones(1000, bool))
    assert len(cliffs) == 1 and cliffs[0].step == 700 and cliffs[0].recovery_steps is None


# ------------------------------------------------------------------ checkpoints
def test_hypergeometric_tail_matches_enumeration() -> None:
    total, good, draws = 9, 3, 4
    for k in range(5):
        count = sum(1 for c in itertools.combinations(range(total), draws)
                    if sum(i < good for i in c) >= k)
        assert math.isclose(hypergeom_sf(k, total, good, draws),
                            count / math.comb(total, draws), rel_tol=1e-9)


def test_near_checkpoint_window() -> None:
    steps = np.arange(95, 106.0)
    near = near_checkpoint(steps, np.array([100.0]), before=1, after=3)
    assert steps[near].tolist() == [99, 100, 101, 102, 103]


def test_association_true_false_null() -> None:
    steps = np.arange(1, 3001.0)
    ck = np.arange(200.0, 3001, 200)
    aligned = associate(steps, [201, 401, 601, 1001], ck, interval=1)
    assert aligned.associated is True and aligned.p_value < 1e-6 and aligned.aligned == 4
    apart = associate(steps, [250, 777, 1333, 2550], ck, interval=1)
    assert apart.associated is False and apart.p_value == 1.0 and apart.aligned == 0
    assert associate(steps, [], ck, interval=1).associated is None
    none = associate(steps, [250], np.zeros(0), interval=1)
    assert none.associated is None and "--checkpoint-every" in none.note


# ------------------------------------------------------------------ attribution
def test_eta_squared_equals_r_squared_for_one_hot() -> None:
    rng = RNG(8)
    codes = rng.integers(0, 4, 500)
    y = codes * 0.1 + rng.normal(size=500) * 0.2
    one_hot = np.eye(4)[codes]
    assert math.isclose(eta_squared(y, codes), r_squared(y, one_hot), rel_tol=1e-9)


def test_attribution_by_bucket_and_length() -> None:
    rng = RNG(9)
    b = rng.integers(0, 3, 1500)
    length = np.array([400.0, 1000.0, 2500.0])[b] * rng.uniform(0.9, 1.1, 1500)
    resid = np.array([0.2, 0.0, -0.2])[b] + 0.02 * rng.normal(size=1500)
    a = attribute(resid, loss=resid + 2.0, buckets=b.tolist(), length=length,
                  length_field="seq_len")
    assert a.bucket_r2 > 0.95 and a.bucket_p_value < 0.01 and a.bucket_explains
    assert a.length_r2 > 0.9 and a.length_field == "seq_len"
    means = {row["bucket"]: row["mean_loss"] for row in a.per_bucket}
    assert means[0] > means[1] > means[2]


def test_attribution_finds_nothing_in_unrelated_buckets() -> None:
    rng = RNG(10)
    a = attribute(rng.normal(size=2000), loss=np.zeros(2000),
                  buckets=rng.integers(0, 5, 2000).tolist())
    assert a.bucket_r2 < 0.01 and not a.bucket_explains


def test_autocorrelated_noise_is_thinned_before_the_band_test() -> None:
    rng = RNG(5)
    x = np.zeros(3000)
    e = rng.standard_normal(3000)
    for i in range(1, 3000):
        x[i] = 0.9 * x[i - 1] + e[i]
    b = find_bands(x, rng=RNG(0))
    assert b.count == 1 and b.points < 400  # about 3000 / 19 independent points


def test_a_level_shift_is_not_bands() -> None:
    rng = RNG(8)
    x = np.concatenate([rng.normal(0.0, 0.02, 400), rng.normal(0.5, 0.02, 400)])
    b = find_bands(x, rng=RNG(0))
    assert (b.count or 1) == 1  # thinned as autocorrelated, or tested and found not interleaved
    y = rng.permutation(x)  # the same values interleaved in time are two bands
    assert find_bands(y, rng=RNG(0)).count == 2


def test_a_single_outlier_is_not_a_band() -> None:
    x = np.append(RNG(9).normal(0.0, 0.05, 60), 0.9)
    b = find_bands(x, rng=RNG(0))
    assert b.count == 1


_BUCKET = st.one_of(st.none(), st.integers(0, 5), st.sampled_from(["a", "b"]),
                    st.lists(st.integers(0, 5), max_size=3).map(tuple))


@settings(max_examples=200, deadline=None)
@given(st.lists(_BUCKET, min_size=1, max_size=40))
def test_row_codes_are_the_single_bucket_rows_of_the_composition(buckets):
    codes, ids, mixed = row_codes(buckets)
    shares, names, has = composition(buckets)
    single = has & np.isclose(shares.max(axis=1), 1.0)
    assert ids == names
    assert codes.tolist() == np.where(single, np.argmax(shares, axis=1), -1).tolist()
    assert mixed == bool((has & ~single).any())


def _attribution_peak(buckets: int, steps: int = 20_000) -> int:
    rng = np.random.default_rng(0)
    resid = rng.standard_normal(steps)
    ids = rng.integers(0, buckets, steps).tolist()
    tracemalloc.start()
    try:
        a = attribute(resid, loss=resid + 3.0, buckets=[(b,) for b in ids], rng=rng)
        assert a.single_bucket and a.bucket_groups == buckets
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_single_bucket_steps_are_attributed_without_a_steps_by_buckets_matrix():
    # a share matrix of 20,000 steps x 500 buckets would take 80 MB (twice, with its copy)
    assert _attribution_peak(500) < 1.5 * _attribution_peak(5)
