"""Epoch plans: invariants (hypothesis), orders, policies and errors."""

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import lengthwise
from lengthwise import load_lengths, plan_epoch
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel, round_up
from lengthwise.planning.lengths import LengthError
from lengthwise.planning.vocabulary import ORDERS

configs = st.fixed_dictionaries({
    "order": st.sampled_from(ORDERS),
    "world_size": st.integers(1, 5),
    "grad_accum": st.integers(1, 3),
    "buckets": st.sampled_from(["auto", 1, 3, 8]),
    "pad_multiple": st.sampled_from([1, 8]),
    "seed": st.integers(0, 3),
    "epoch": st.integers(0, 3),
})


def batches_of(plan):
    return [plan.batch(k) for k in range(plan.total_batches)]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=12, max_size=400), configs,
       st.sampled_from([("max_tokens", 4096), ("max_tokens", 1000), ("batch_size", 3)]))
def test_invariants(lengths, cfg, rule):
    lengths = np.asarray(lengths)
    try:
        own = {k: cfg[k] for k in ("seed", "epoch")}
        options = {k: v for k, v in cfg.items() if k not in own}
        plan = plan_epoch(lengths, PlanConfig(**{rule[0]: rule[1]}, **options), **own)
    except ValueError as exc:  # too few samples for equal counts: a clear error, tested below
        assert "same number of micro-batches" in str(exc) or "no samples left" in str(exc)
        assume(False)
    eff = plan.lengths
    # exactly once: every non-empty sample, nothing else
    assert np.array_equal(np.sort(plan.indices), np.flatnonzero(lengths > 0))
    # equal micro-batch counts per rank
    per_rank = [len(plan.rank_batches(r)) for r in range(cfg["world_size"])]
    assert per_rank == [plan.num_batches] * cfg["world_size"]
    # no micro-batch over its budget
    for batch in batches_of(plan):
        assert batch.size >= 1
        if rule[0] == "batch_size":
            assert batch.size <= rule[1]
        else:
            assert batch.size * round_up(int(eff[batch].max()), cfg["pad_multiple"]) <= rule[1]
    # truncation only where the budget forces it, and counted
    over = lengths > (rule[1] // cfg["pad_multiple"] * cfg["pad_multiple"]
                      if rule[0] == "max_tokens" else 10**9)
    assert plan.counts["truncated"] == int(over.sum())


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.integers(1, 3), st.integers(0, 99))
def test_interleave_respects_max_run(k, world_size, max_run, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2000, 600)
    edges = np.quantile(lengths, np.linspace(0, 1, k + 1)[1:]).astype(int).tolist()
    plan = plan_epoch(lengths,
                      PlanConfig(batch_size=4, buckets=edges, order="interleave",
                                 world_size=world_size, max_run=max_run),
                      seed=seed)
    for rank in range(world_size):
        tags = plan.bucket[rank::world_size]
        counts = np.bincount(tags)
        most = counts.max()
        feasible = most <= max_run * (tags.size - most + 1)
        runs = np.diff(np.flatnonzero(np.diff(np.r_[-1, tags, -1]) != 0))
        assert runs.max() <= max_run or not feasible


def test_plan_is_a_pure_function_of_inputs_and_changes_every_epoch():
    lengths = load_lengths("evals_capped", max_len=4096)
    a = plan_epoch(lengths, PlanConfig(max_tokens=8192, world_size=4), seed=3, epoch=2)
    b = plan_epoch(lengths, PlanConfig(max_tokens=8192, world_size=4), seed=3, epoch=2)
    c = plan_epoch(lengths, PlanConfig(max_tokens=8192, world_size=4), seed=3, epoch=3)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)
    assert not np.array_equal(a.indices, c.indices)
    assert lengthwise.recomposition(a, c) <= 0.01


def test_same_plan_in_another_process():
    code = ("import zlib, lengthwise as lw; p = lw.plan_epoch(lw.load_lengths('sft_mix', "
            "max_len=8192), lw.PlanConfig(max_tokens=16384, world_size=8), seed=7, epoch=1); "
            "print(zlib.crc32(p.indices.tobytes()), zlib.crc32(p.offsets.tobytes()))")
    out = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout for _ in range(2)]
    here = plan_epoch(load_lengths("sft_mix", max_len=8192),
                      PlanConfig(max_tokens=16384, world_size=8), seed=7, epoch=1)
    import zlib
    expected = f"{zlib.crc32(here.indices.tobytes())} {zlib.crc32(here.offsets.tobytes())}\n"
    assert out == [expected, expected]


def test_sft_mix_targets():
    lengths = load_lengths("sft_mix", max_len=8192)
    kw = PlanConfig(max_tokens=16384, world_size=8)
    strat = plan_epoch(lengths, kw).stats
    bucket_random = plan_epoch(lengths, replace(kw, order="bucket-random")).stats
    inter = plan_epoch(lengths, replace(kw, order="interleave")).stats
    assert strat["padding_efficiency"] >= 0.97
    assert strat["step_cv_ratio"] <= 1.0 < bucket_random["step_cv_ratio"]
    assert inter["max_same_bucket_run"] <= 3
    assert strat["samples"] == strat["unique_samples"] == lengths.size


def test_stratified_steps_carry_every_stratum():
    lengths = np.random.default_rng(0).integers(1, 4000, 5000)
    plan = plan_epoch(lengths, PlanConfig(batch_size=4, buckets=16, world_size=2, grad_accum=4))
    longest = np.maximum.reduceat(plan.lengths[plan.indices], plan.offsets[:-1])
    steps = longest[: plan.total_batches // 8 * 8].reshape(-1, 8)
    # each full step holds one micro-batch per length octile: short and long together
    assert np.all(steps.min(axis=1) < np.quantile(lengths, 0.2))
    assert np.all(steps.max(axis=1) > np.quantile(lengths, 0.8))


@pytest.mark.parametrize("options", [
    dict(max_tokens=2048, world_size=4, grad_accum=2),
    dict(batch_size=3, order="sorted", buckets=4),
    dict(max_tokens=512, layout="pack", on_overflow="split", world_size=2),
])
def test_plan_options_as_keywords_plan_as_their_config(plan_keywords, options):
    lengths = np.random.default_rng(0).integers(1, 900, 3000)

    def build(config, **keywords):
        plan = plan_epoch(lengths, config, seed=2, epoch=1, **keywords)
        return [b.tolist() for b in batches_of(plan)]

    plan_keywords(build, "plan_epoch", **options)


def test_an_unknown_keyword_of_plan_epoch_names_its_nearest_option():
    with pytest.raises(ValueError, match=r"unknown option 'epochs'; did you mean 'epoch'\?$"):
        plan_epoch([3, 4], batch_size=2, epochs=1)
    with pytest.raises(TypeError, match=r"config must be a lengthwise.PlanConfig, got 2 \(or "):
        plan_epoch([3, 4], 2)


def test_subset_of_indices():
    lengths = np.arange(1, 101)
    plan = plan_epoch(lengths, PlanConfig(batch_size=4, world_size=2), indices=np.arange(50, 100))
    assert np.array_equal(np.sort(plan.indices), np.arange(50, 100))
    with pytest.raises(ValueError, match="repeat"):
        plan_epoch(lengths, PlanConfig(batch_size=4), indices=[1, 1])
    with pytest.raises(ValueError, match="must lie in"):
        plan_epoch(lengths, PlanConfig(batch_size=4), indices=[100])


def test_indices_in_any_order_keep_every_batch_within_the_budget():
    lengths = np.random.default_rng(0).integers(1, 4000, 20_000)
    shuffled = np.random.default_rng(1).permutation(lengths.size)  # every sample, reordered
    for ids in (shuffled, shuffled[:-1]):
        plan = plan_epoch(lengths, PlanConfig(max_tokens=8192, world_size=2), indices=ids)
        longest = np.maximum.reduceat(plan.lengths[plan.indices], plan.offsets[:-1])
        assert np.max(np.diff(plan.offsets) * longest) <= 8192
        assert np.array_equal(np.sort(plan.indices), np.sort(ids))
        assert np.array_equal(plan.bucket, np.searchsorted(plan.edges, longest))


def test_even_out_policies_are_counted():
    lengths = np.full(22, 10)  # 22 samples, batch_size 4 -> 6 batches over 4 ranks
    split = plan_epoch(lengths, PlanConfig(batch_size=4, world_size=4, order="sorted"))
    assert split.total_batches == 8 and split.counts["split_batches"] == 2
    drop = plan_epoch(lengths,
                      PlanConfig(batch_size=4, world_size=4, even_out="drop", order="sorted"))
    assert drop.total_batches == 4
    assert drop.counts["dropped_to_even_out"] == 22 - drop.indices.size > 0
    rep = plan_epoch(lengths,
                     PlanConfig(batch_size=4, world_size=4, even_out="repeat", order="sorted"))
    assert rep.total_batches == 8
    assert rep.counts["repeated"] == rep.indices.size - 22 > 0
    with pytest.raises(ValueError, match="cannot give each of 8 ranks the same number"):
        plan_epoch(np.full(5, 10), PlanConfig(batch_size=1, world_size=8))


def test_overflow_over_budget():
    lengths = np.array([100, 5000, 200, 300])
    plan = plan_epoch(lengths, PlanConfig(max_tokens=1024, on_overflow="drop"))
    assert 1 not in plan.indices and plan.counts["dropped_overflow"] == 1
    plan = plan_epoch(lengths, PlanConfig(max_tokens=1024))
    assert plan.lengths[1] == 1024 and plan.counts["truncated"] == 1
    with pytest.raises(LengthError, match="row 1: length 5000"):
        plan_epoch(lengths, PlanConfig(max_tokens=1024, on_overflow="error"))
    plan = plan_epoch(np.array([0, 3, 0, 4]), PlanConfig(batch_size=2))
    assert sorted(plan.indices.tolist()) == [1, 3] and plan.counts["dropped_empty"] == 2


def test_cost_budget_and_cost_balance():
    lengths = np.random.default_rng(4).integers(16, 2048, 4000)
    cost = CostModel(a=1.0, b=1 / 512, c=64)
    plan = plan_epoch(lengths, PlanConfig(cost=cost, max_cost=40_000, world_size=4))
    for k in range(plan.total_batches):
        b = plan.batch(k)
        assert cost.batch_cost(b.size, plan.lengths[b].max()) <= 40_000
    assert plan.stats["rank_imbalance_p50"] < 1.1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one of"),
    ({"batch_size": 4, "max_tokens": 10}, "exactly one of"),
    ({"batch_size": 0}, "batch_size must be"),
    ({"batch_size": 4, "order": "zigzag"}, "order must be one of"),
    ({"batch_size": 4, "world_size": 0}, "world_size"),
    ({"batch_size": 4, "buckets": [10, 20]}, "last bucket edge 20 is below"),
    ({"batch_size": 4, "buckets": "many"}, "buckets must be"),
    ({"batch_size": 4, "even_out": "pad"}, "even_out must be"),
    ({"max_cost": 10}, "needs a cost model"),
])
def test_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_epoch(np.arange(1, 100), PlanConfig(**kwargs))


@pytest.mark.parametrize("options, exc, match", [
    (dict(max_tokens=float("nan")), TypeError, "max_tokens must be a whole number, got nan"),
    (dict(max_tokens=float("inf")), TypeError, "max_tokens must be a whole number, got inf"),
    (dict(max_tokens=4096.0), TypeError, "max_tokens must be a whole number"),
    (dict(batch_size=2.5), TypeError, "batch_size must be a whole number, got 2.5"),
    (dict(batch_size=True), TypeError, "batch_size must be a whole number, got True"),
    (dict(batch_size=0), ValueError, "batch_size must be a positive whole number"),
    (dict(max_tokens=64, pad_multiple=2.0), TypeError, "pad_multiple must be a whole number"),
    (dict(max_tokens=8, pad_multiple=16), ValueError,
     "max_tokens=8 cannot hold a single row of pad_multiple=16 tokens"),
    (dict(max_cost=float("nan"), cost=CostModel()), ValueError, "max_cost must be a finite"),
    (dict(max_cost=0.5, cost=CostModel(a=1, c=1)), ValueError,
     "max_cost=0.5 .* cannot hold a single row"),
    (dict(max_cost=10, cost=(1, 0, 0)), TypeError, "cost must be a lengthwise.CostModel"),
])
def test_batch_rule_values_are_never_converted_quietly(options, exc, match):
    with pytest.raises(exc, match=match):
        plan_epoch(np.arange(1, 100), PlanConfig(**options))


def test_bucket_edges_longer_than_a_row_of_the_budget():
    lens = np.random.default_rng(0).integers(1, 9000, 2000)
    plan = plan_epoch(lens, PlanConfig(buckets=[1024, 2048, 4096, 8192], max_tokens=4096))
    assert plan.lengths.max() <= 4096  # truncated to one row of the budget, none in 8192
    assert plan.stats["truncated"] == int((lens > 4096).sum())
    with pytest.raises(ValueError, match="bucket 1 holds 3 samples, but not even one row"):
        from lengthwise.planning.batching import bucket_batches

        bucket_batches(np.arange(4), np.array([0, 1, 1, 1]), np.array([2, 0]),
                       np.random.default_rng(0))


@pytest.mark.parametrize("lengths, kw", [
    (np.full(8, 2**61), dict(batch_size=4, buckets=1)),
    (np.array([2**61] * 8 + [5] * 8), dict(batch_size=3, buckets=1)),
    (np.full(8, 2**59), dict(batch_size=2, order="sorted")),
    (np.array([2**62 - 1, 3]), dict(batch_size=1, pad_multiple=8, layout="pad")),
    (np.array([2**61] * 3), dict(max_tokens=2**62, layout="pack", on_overflow="split")),
])
def test_lengths_whose_token_sums_would_overflow_are_refused(lengths, kw):
    with pytest.raises(LengthError, match=r"samples x the longest length must stay below 2\*\*62"):
        plan_epoch(lengths, PlanConfig(**kw))


def test_the_largest_token_sums_allowed_are_exact():
    lengths = np.array([2**59] * 6 + [5])  # 7 x 2**59: below 2**62 (8 x would be refused)
    stats = plan_epoch(lengths, PlanConfig(batch_size=3, buckets=1)).stats
    assert stats["real_tokens"] == 6 * 2**59 + 5
    assert stats["padding_efficiency"] == pytest.approx((6 * 2**59 + 5) / (7 * 2**59))
    # a budget too large to bound the sums alone: the longest length does
    plan = plan_epoch(np.full(10, 2**58), PlanConfig(max_tokens=2**59))
    assert plan.stats["padding_efficiency"] == 1.0


def test_one_long_sample_among_a_million_short_ones_plans_on_eight_ranks():
    """Auto edges give the long sample a bucket of its own: the short ones fill their
    micro-batches, and eight ranks get equal counts with every sample once."""
    lengths = np.concatenate([np.full(10**6, 3), [8000]])
    plan = plan_epoch(lengths, PlanConfig(max_tokens=8192, world_size=8, grad_accum=2))
    assert plan.edges == [3, 8000]
    assert plan.total_batches < 1200 and plan.total_batches % 8 == 0
    assert np.array_equal(np.sort(plan.indices), np.arange(lengths.size))
    assert "edge 8000: 1 samples" in plan.stats["edges_note"]
