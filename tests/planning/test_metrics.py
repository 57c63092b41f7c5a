"""The figures of docs/metrics.md, checked on schedules whose answer is known by hand."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.planning.cost import CostModel
from lengthwise.planning.metrics import batch_stats, longest_runs, random_step_cv, recomposition_of


def test_budget_fill_by_hand():
    lengths = np.array([4, 2, 3, 3, 8, 1])
    idx, off = np.arange(6), np.array([0, 2, 4, 6])  # 8 + 6 + 16 padded tokens
    assert batch_stats(lengths, idx, off)["budget_fill"] is None  # no budget: no fill
    assert batch_stats(lengths, idx, off, max_tokens=20)["budget_fill"] == pytest.approx(30 / 60)
    cost = CostModel(a=1, b=1, c=0)  # costs 2*(4+16)=40, 2*(3+9)=24, 2*(8+64)=144
    assert batch_stats(lengths, idx, off, cost=cost, max_cost=200)[
        "budget_fill"] == pytest.approx(208 / 600)
    # packed: the tokens the rows hold over the budget, the fill
    packed = batch_stats(lengths, idx, off, capacity=10, max_tokens=10)
    assert packed["budget_fill"] == pytest.approx(21 / 30) == packed["padding_efficiency"]


def test_padding_and_imbalance_by_hand():
    lengths = np.array([4, 2, 3, 3, 8, 1])
    # batches: [0,1] pads to 4 -> 8 slots; [2,3] -> 6 slots; [4,5] -> 16 slots
    idx, off = np.arange(6), np.array([0, 2, 4, 6])
    s = batch_stats(lengths, idx, off, world_size=1)
    assert s["padding_efficiency"] == pytest.approx(21 / 30)
    assert s["padded_tokens"] == 30 and s["real_tokens"] == 21
    idx2, off2 = np.arange(6)[:4], np.array([0, 2, 4])
    two = batch_stats(lengths, idx2, off2, world_size=2)  # one slot: costs 8 and 6
    assert two["rank_imbalance_p50"] == pytest.approx(8 / 7)
    cost = CostModel(a=1, b=1, c=0)  # costs 2*(4+16)=40 and 2*(3+9)=24
    assert batch_stats(lengths, idx2, off2, world_size=2, cost=cost)[
        "rank_imbalance_p99"] == pytest.approx(40 / 32)
    packed = batch_stats(lengths, idx, off, capacity=10)
    assert packed["padding_efficiency"] == pytest.approx(21 / 30)


def test_step_cv_token_weighted_and_plain():
    lengths = np.array([1, 3, 2, 2])
    idx, off = np.arange(4), np.array([0, 1, 2, 3, 4])
    s = batch_stats(lengths, idx, off, world_size=1, grad_accum=2)  # steps {1,3} and {2,2}
    tw = np.array([(1 + 9) / 4, 8 / 4])
    assert s["step_length_cv"] == pytest.approx(tw.std() / tw.mean())
    assert s["step_sample_cv"] == pytest.approx(0.0)
    assert s["optimizer_steps"] == 2


def test_random_reference_is_near_its_own_measurement():
    lengths = np.random.default_rng(0).lognormal(5, 1, 20_000).astype(np.int64) + 1
    ids = np.random.default_rng(1).permutation(lengths.size)
    off = np.arange(0, lengths.size + 1, 100)  # 200 steps of 100 random samples
    s = batch_stats(lengths, ids, off)
    ref, _ = random_step_cv(lengths, np.arange(lengths.size), 200)
    assert s["step_cv_ratio"] == pytest.approx(1.0, abs=0.25)
    assert ref == pytest.approx(s["step_length_cv"], rel=0.25)


def test_runs_and_recomposition():
    assert longest_runs(np.array([1, 1, 2, 1, 1, 1]), 1) == 3
    assert longest_runs(np.array([1, 2, 1, 2, 1, 2]), 2) == 3  # rank 0 sees 1,1,1
    idx = np.array([0, 1, 2, 3])
    assert recomposition_of(np.array([0, 2, 4]), idx, np.array([0, 2, 4]),
                            np.array([1, 0, 3, 2])) == 1.0
    assert recomposition_of(np.array([0, 2, 4]), idx, np.array([0, 2, 4]),
                            np.array([0, 2, 1, 3])) == 0.0
    assert recomposition_of(np.array([0, 2, 4]), idx, np.array([0, 2, 3, 4]),
                            np.array([1, 0, 2, 3])) == pytest.approx(1 / 3)


def test_every_figure_the_demo_prints_is_defined_in_metrics_md():
    import re
    from pathlib import Path

    from lengthwise.demo.dflash import DFLASH_KEYS
    from lengthwise.demo.report import TABLE_COLUMNS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    defined = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|", doc, flags=re.M))
    # the loss, the verdict and the DFlash figures are defined in docs/demo.md and docs/dflash.md
    elsewhere = {"eval_loss", "verdict", *DFLASH_KEYS[DFLASH_KEYS.index("accuracy_first"):]}
    printed = {name for name, _ in TABLE_COLUMNS} | set(DFLASH_KEYS) | {"real_tokens_per_step"}
    assert sorted(printed - elsewhere - set(defined)) == []
    assert "ratio" in defined["excess"] and "sampling floor" in defined["excess"]


def test_random_reference_shuffles_fewer_times_above_its_sample_budget():
    from lengthwise.planning.metrics import (
        RANDOM_REFERENCE_REPEATS,
        RANDOM_REFERENCE_SAMPLES,
        reference_repeats,
    )

    assert reference_repeats(RANDOM_REFERENCE_SAMPLES // RANDOM_REFERENCE_REPEATS) == 5
    assert reference_repeats(RANDOM_REFERENCE_SAMPLES // 2) == 2
    assert reference_repeats(10 * RANDOM_REFERENCE_SAMPLES) == 1
    lengths = np.random.default_rng(4).integers(1, 3000, 400_000)
    ids = np.arange(lengths.size)
    got = random_step_cv(lengths, ids, 300)
    assert got == random_step_cv(lengths, ids, 300, repeats=2)
    assert got != random_step_cv(lengths, ids, 300, repeats=5)
    small = lengths[:1000]
    assert random_step_cv(small, ids[:1000], 20) == random_step_cv(small, ids[:1000], 20,
                                                                   repeats=5)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 3_000_000), min_size=2, max_size=300),
       scale=st.sampled_from([1, 10, 1000]), n_steps=st.integers(2, 9), seed=st.integers(0, 9),
       repeats=st.integers(1, 3))
def test_random_reference_shuffles_the_lengths_as_the_index_permutation_does(
        lengths, scale, n_steps, seed, repeats):
    """Shuffling the (narrowed) lengths draws the very steps that gathering them through
    ``rng.permutation(n)`` did, whatever the integer width: identical figures."""
    from lengthwise.planning.metrics import narrow_lengths

    lens = np.maximum(np.asarray(lengths, dtype=np.int64) // scale, 1)
    narrow = narrow_lengths(lens)
    assert np.array_equal(narrow, lens)
    assert narrow.dtype == (np.int16 if lens.max() < 2**15 else np.int32)
    n_steps = min(n_steps, lens.size)
    rng = np.random.default_rng([seed, 0x5EED])
    step = np.arange(lens.size) * n_steps // lens.size
    cvs, scvs = [], []
    for _ in range(repeats):
        drawn = lens[rng.permutation(lens.size)].astype(np.float64)
        s1 = np.bincount(step, weights=drawn)
        s2 = np.bincount(step, weights=drawn * drawn)
        tw, mean = s2 / s1, s1 / np.bincount(step)
        cvs.append(float(np.std(tw) / np.mean(tw)))
        scvs.append(float(np.std(mean) / np.mean(mean)))
    assert random_step_cv(lens, np.arange(lens.size), n_steps, seed=seed, repeats=repeats) == (
        float(np.mean(cvs)), float(np.mean(scvs)))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 3_000_000), min_size=2, max_size=200),
       scale=st.sampled_from([1, 100, 10_000]), data=st.data(),
       pad_multiple=st.sampled_from([1, 8, 64]), world=st.integers(1, 3))
def test_figures_from_narrowed_lengths_equal_the_direct_sums(lengths, scale, data, pad_multiple,
                                                             world):
    """Lengths gathered narrow (int16/int32), step sums taken as integers and distinct ids
    marked give the figures of the wide lengths summed directly, repeated ids included."""
    from lengthwise.planning.metrics import _step_means, gathered_lengths, step_ids

    lens = np.maximum(np.asarray(lengths, dtype=np.int64) // scale, 1)
    ids = np.asarray(data.draw(st.lists(st.integers(0, lens.size - 1), min_size=1,
                                        max_size=3 * lens.size)))
    cuts = data.draw(st.lists(st.integers(1, ids.size - 1), max_size=ids.size)) if ids.size > 1 \
        else []
    off = np.unique(np.r_[0, cuts, ids.size]).astype(np.int64)
    got = gathered_lengths(lens, ids)
    assert np.array_equal(got, lens[ids])
    assert got.dtype.itemsize <= 4 or 4 * ids.size < lens.size  # a few ids: gathered wide
    s = batch_stats(lens, ids, off, world_size=world, pad_multiple=pad_multiple)
    wide = lens[ids]
    longest = np.maximum.reduceat(wide, off[:-1])
    padded = int(np.sum(np.diff(off) * (-(-longest // pad_multiple) * pad_multiple)))
    assert (s["real_tokens"], s["padded_tokens"]) == (int(wide.sum()), padded)
    assert s["unique_samples"] == np.unique(ids).size
    steps = step_ids(off.size - 1, world, 1)
    per_sample = np.repeat(steps, np.diff(off))
    x = wide.astype(np.float64)
    s1 = np.bincount(per_sample, weights=x)
    s2 = np.bincount(per_sample, weights=x * x)
    tw, mean = _step_means(got, off, steps)
    assert np.array_equal(tw, s2 / s1) and np.array_equal(mean, s1 / np.bincount(per_sample))


def _as_batches(data, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` cut at drawn places into micro-batches (``indices``, ``offsets``)."""
    cuts = data.draw(st.lists(st.integers(1, max(len(ids) - 1, 1)), max_size=len(ids)))
    off = np.unique(np.r_[0, [c for c in cuts if c < len(ids)], len(ids)]).astype(np.int64)
    return np.asarray(ids, dtype=np.int64), off


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 40), data=st.data(), repeated=st.booleans())
def test_recomposition_equals_the_share_of_batches_whose_set_was_a_batch(n, data, repeated):
    """The owner lookup (and, where ids repeat, the hash) counts exactly the batches of ``b``
    whose sample multiset is a batch of ``a``: batches kept whole in another order, cut
    differently, or with an id of another batch swapped in."""
    first = data.draw(st.permutations(range(n)))
    if repeated:
        first = first + data.draw(st.lists(st.sampled_from(first), max_size=n))
    idx_a, off_a = _as_batches(data, first)
    batches = [idx_a[a:b].tolist() for a, b in zip(off_a[:-1], off_a[1:], strict=True)]
    kept = [data.draw(st.permutations(b)) for b in batches
            if data.draw(st.booleans())]  # whole batches of a, their samples reordered
    rest = data.draw(st.permutations([i for b in batches for i in b]))
    idx_r, off_r = _as_batches(data, rest)
    second = [list(x) for x in kept] + [idx_r[a:b].tolist()
                                        for a, b in zip(off_r[:-1], off_r[1:], strict=True)]
    second = data.draw(st.permutations(second))
    if second and data.draw(st.booleans()):  # one id swapped for an id of another batch
        k = data.draw(st.integers(0, len(second) - 1))
        second[k] = second[k][:-1] + [data.draw(st.sampled_from(first))]
    idx_b = np.asarray([i for b in second for i in b], dtype=np.int64)
    off_b = np.cumsum([0] + [len(b) for b in second]).astype(np.int64)
    sets_a = {tuple(sorted(b)) for b in batches}
    expected = (sum(tuple(sorted(b)) in sets_a for b in second) / len(second)) if second else 0.0
    assert recomposition_of(off_a, idx_a, off_b, idx_b) == expected
    assert recomposition_of(off_a, idx_a.astype(np.int32), off_b, idx_b.astype(np.int32)) == \
        expected


def test_padded_length_of_narrowed_lengths_rounds_up_past_int16():
    s = batch_stats(np.array([32_767, 32_700, 5]), np.arange(3), np.array([0, 2, 3]),
                    pad_multiple=64)
    assert s["padded_tokens"] == 2 * 32_768 + 64
