"""The cost model's capped term ``d*min(P, cap)``: priced rows, plans within budget, checksums."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.errors import ConfigError
from lengthwise.planning.batching import row_limit
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel
from lengthwise.planning.plan import plan_epoch
from lengthwise.pytorch.collate import Budget, BudgetError, PadCollator, collator_for

#: a DFlash-like step: target tokens, attention, and draft slots in proportion up to a cap
STEP = CostModel(a=14.6, b=0.0003, d=18.6, cap=4096)


def test_the_capped_term_grows_with_the_row_up_to_its_cap():
    m = CostModel(a=1.0, d=2.0, cap=10)
    assert m.row_cost(4) == 12.0 and m.row_cost(10) == 30.0 and m.row_cost(50) == 70.0
    assert m.batch_cost([2, 3], [4, 50]).tolist() == [24.0, 210.0]
    assert not m.linear and CostModel(a=1.0, b=2.0).linear


def test_a_cost_shows_the_capped_term_only_where_used_and_checksums_every_coefficient():
    linear = CostModel(a=1.0, b=0.5, c=2.0)
    assert repr(linear) == "CostModel(a=1.0, b=0.5, c=2.0)"
    assert linear.fields() == {"a": 1.0, "b": 0.5, "c": 2.0}
    cfg = PlanConfig(max_tokens=64, cost=linear)
    capped = PlanConfig(max_tokens=64, cost=CostModel(a=1.0, b=0.5, c=2.0, d=1.0, cap=8))
    other_cap = PlanConfig(max_tokens=64, cost=CostModel(a=1.0, b=0.5, c=2.0, d=1.0, cap=9))
    assert len({cfg.fingerprint(), capped.fingerprint(), other_cap.fingerprint()}) == 3
    assert "d=1.0, cap=8" in repr(capped.cost)


@pytest.mark.parametrize("kwargs, match", [
    (dict(a=1.0, d=-1.0), "must be >= 0"),
    (dict(a=0.0, d=0.0), "not all zero"),
    (dict(a=1.0, d=1.0, cap=0), "cap must be > 0"),
])
def test_bad_capped_coefficients_are_one_line_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        CostModel(**kwargs)


def test_the_packed_layout_refuses_the_capped_term():
    with pytest.raises(ConfigError, match="needs layout='pad'"):
        PlanConfig(max_tokens=64, layout="pack", cost=CostModel(d=1.0, cap=8))


def test_the_longest_row_within_a_capped_cost_budget():
    m = CostModel(a=1.0, d=3.0, cap=10)  # 4P up to 10 tokens, then P + 30
    assert row_limit(cost=m, max_cost=100.0).max_length() == 70
    assert row_limit(cost=m, max_cost=100.0, pad_multiple=16).max_length() == 64
    assert row_limit(cost=m, max_cost=39.0).max_length() == 9
    with pytest.raises(ConfigError, match="cannot hold a single row"):
        row_limit(cost=m, max_cost=3.0)
    flat = CostModel(a=0.0, d=1.0, cap=10)  # no dearer past 10 tokens: no longest row
    assert row_limit(cost=flat, max_cost=10.0).max_length() is None
    assert row_limit(cost=flat, max_cost=9.5).max_length() == 9


def test_the_collator_checks_a_capped_cost_budget():
    cfg = PlanConfig(max_cost=100.0, cost=CostModel(a=1.0, d=3.0, cap=10))
    c = collator_for(cfg, [70], pad_token_id=0, metadata=False)
    assert c.budget == Budget(max_cost=100.0, cost=(1.0, 0.0, 0.0, 3.0, 10))
    batch = [{"input_ids": torch.ones(n, dtype=torch.long)} for n in (20, 20, 21)]
    c(batch[:2])  # 2 rows x (20 + 30) = 100
    with pytest.raises(BudgetError, match=r"cost 102 > max_cost=100.0 \(a=1.0, b=0.0, c=0.0, "
                                          r"d=3.0, cap=10.0\)"):
        PadCollator(0, budget=c.budget)(batch[1:])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=16, max_size=400),
       world=st.integers(1, 8), accum=st.integers(1, 3), seed=st.integers(0, 2**16),
       level=st.booleans())
def test_plans_priced_with_the_capped_term_keep_every_sample_once_and_the_budget(
        lengths, world, accum, seed, level):
    lens = np.asarray(lengths)
    plan = plan_epoch(lens,
                      PlanConfig(max_tokens=4096, cost=STEP, world_size=world, grad_accum=accum,
                                 balance="level" if level else "none"),
                      seed=seed)
    rows = np.diff(plan.offsets)
    longest = np.maximum.reduceat(lens[plan.indices], plan.offsets[:-1])
    assert (rows * longest <= 4096).all()
    counts = np.bincount(plan.indices, minlength=lens.size)
    split = plan.stats.get("repeated_in_schedule", 0)
    assert split == 0 and (counts == 1).all()


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=16, max_size=400),
       world=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_plans_under_a_capped_cost_budget_keep_every_sample_once_and_the_budget(
        lengths, world, seed):
    lens = np.asarray(lengths)
    budget = float(STEP.row_cost(3000)) * 3
    plan = plan_epoch(lens, PlanConfig(max_cost=budget, cost=STEP, world_size=world), seed=seed)
    rows = np.diff(plan.offsets)
    longest = np.maximum.reduceat(lens[plan.indices], plan.offsets[:-1])
    assert (STEP.batch_cost(rows, longest) <= budget * (1 + 1e-12)).all()
    assert (np.bincount(plan.indices, minlength=lens.size) == 1).all()
