"""``balance="level"``: steps of one cost level, every sample once, every budget kept."""

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise import plan_epoch
from lengthwise.cli import main
from lengthwise.errors import ConfigError
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel, round_up


def _long_shape(n: int = 40_000, seed: int = 0) -> np.ndarray:
    """Log-normal lengths of median 2,000 (sigma 0.7) in [16, 8192]: many micro-batches of
    two to five long rows under a 16,384-token budget."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.normal(np.log(2000), 0.7, n))), 16, 8192).astype(np.int64)


def _batch_costs(plan, cost: CostModel) -> np.ndarray:
    rows = np.diff(plan.offsets)
    longest = np.maximum.reduceat(plan.lengths[plan.indices], plan.offsets[:-1])
    return cost.batch_cost(rows, round_up(longest, plan.config.pad_multiple))


lengths_st = st.lists(st.integers(1, 4000), min_size=40, max_size=600)
rule_st = st.sampled_from([dict(max_tokens=4096), dict(max_tokens=4096, pad_multiple=8),
                           dict(batch_size=3),
                           dict(max_cost=6000.0, cost=CostModel(a=1, b=0.0005, c=20))])


@pytest.mark.filterwarnings("ignore:.*of the tokens are cut")
@settings(max_examples=60, deadline=None)
@given(lengths_st, st.integers(1, 6), st.integers(1, 3), rule_st, st.integers(0, 50))
def test_level_plans_every_sample_once_within_budget_equal_counts(lengths, world, accum, rule,
                                                                   seed):
    lens = np.asarray(lengths)
    kw = PlanConfig(world_size=world, grad_accum=accum, balance="level", **rule)
    plan = plan_epoch(lens, kw, seed=seed)
    limit = plan.config.sample_limit()
    assert np.array_equal(np.sort(plan.indices), np.arange(lens.size))  # exactly once
    assert plan.total_batches % world == 0  # equal counts per rank
    assert all(len(plan.rank_batches(r)) == plan.num_batches for r in range(world))
    assert np.all(np.diff(plan.offsets) >= 1)
    budget = plan.config.row_limit().budget
    if budget is None:
        assert np.all(np.diff(plan.offsets) <= rule["batch_size"])
    else:
        assert np.all(_batch_costs(plan, rule.get("cost", CostModel())) <= budget + 1e-9)
    assert limit is None or plan.lengths.max() <= limit
    again = plan_epoch(lens, kw, seed=seed)  # the same plan on every rank
    assert np.array_equal(again.indices, plan.indices)
    assert np.array_equal(again.offsets, plan.offsets)


def test_level_lowers_rank_imbalance_on_long_samples():
    lens = _long_shape()
    kw = PlanConfig(max_tokens=16384, world_size=64)
    base = plan_epoch(lens, kw).stats
    level = plan_epoch(lens, replace(kw, balance="level")).stats
    assert base["rank_imbalance_p99"] > 1.05  # whole long rows leave batches under-full
    assert level["rank_imbalance_p99"] <= 1.05
    assert level["rank_imbalance_p50"] < base["rank_imbalance_p50"]
    # the same micro-batches: only which of them share a step changes
    assert level["padding_efficiency"] == base["padding_efficiency"]


def test_level_also_balances_accumulation_slots():
    lens = _long_shape(20_000, seed=1)
    kw = PlanConfig(max_tokens=16384, world_size=8, grad_accum=4)
    base = plan_epoch(lens, kw).stats
    level = plan_epoch(lens, replace(kw, balance="level")).stats
    assert level["rank_imbalance_p99"] < base["rank_imbalance_p99"]


def test_default_is_no_balance_and_the_fingerprint_counts_the_balance():
    assert PlanConfig(max_tokens=4096).balance == "none"
    same = PlanConfig(max_tokens=4096, balance="none").fingerprint()
    assert same == PlanConfig(max_tokens=4096).fingerprint()
    assert PlanConfig(max_tokens=4096, balance="level").fingerprint() != same


@pytest.mark.parametrize("kw, match", [
    (dict(max_tokens=4096, balance="even"), "balance must be one of"),
    (dict(max_tokens=4096, balance="level", order="interleave"), "order='stratified'"),
    (dict(max_tokens=4096, balance="level", layout="pack"), "layout='pad'"),
])
def test_level_needs_the_padded_stratified_order(kw, match):
    with pytest.raises(ConfigError, match=match):
        PlanConfig(**kw)


def test_sampler_and_command_line_take_the_policy(capsys):
    pytest.importorskip("torch")
    from lengthwise.pytorch.sampler import BucketBatchSampler

    lens = _long_shape(4000)
    plan = plan_epoch(lens, PlanConfig(max_tokens=16384, world_size=2, balance="level"))
    sampler = BucketBatchSampler(lens, PlanConfig(max_tokens=16384, balance="level"),
                                 num_replicas=2, rank=1)
    assert [list(b) for b in sampler] == [b.tolist() for b in plan.rank_batches(1)]
    assert main(["plan", "sft_mix", "--max-tokens", "16384", "--world-size", "8",
                 "--balance", "level", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unique_samples"] == out["samples"]
    assert main(["plan", "sft_mix", "--max-tokens", "16384", "--balance", "level",
                 "--order", "interleave"]) == 2
    assert "order='stratified'" in capsys.readouterr().err


def test_windowed_level_plan_counts_and_covers_every_sample():
    lens = _long_shape(6000, seed=2)
    plan = plan_epoch(lens, PlanConfig(max_tokens=16384, world_size=4, balance="level"),
                      window=2000)
    per_rank = [list(plan.rank_batches(r)) for r in range(4)]
    assert all(len(b) == plan.num_batches for b in per_rank)
    ids = np.concatenate([np.concatenate(b) for b in per_rank])
    assert np.array_equal(np.sort(ids), np.arange(lens.size))


def test_a_state_resumes_only_under_the_same_balance():
    pytest.importorskip("torch")
    from lengthwise.pytorch.sampler import BucketBatchSampler, ResumeError

    lens = _long_shape(3000)
    for saved_as, resumed_as in (("none", "level"), ("level", "none")):
        old = BucketBatchSampler(lens, PlanConfig(max_tokens=16384, balance=saved_as))
        next(iter(old))
        state = old.state_dict()
        with pytest.raises(ResumeError, match=f"balance is '{resumed_as}', the saved state has "
                                              f"'{saved_as}'"):
            resumed = BucketBatchSampler(lens, PlanConfig(max_tokens=16384, balance=resumed_as))
            resumed.load_state_dict(state)
    same = BucketBatchSampler(lens, PlanConfig(max_tokens=16384, balance="level"))
    same.load_state_dict(state)
    assert same.remaining() == old.remaining()
