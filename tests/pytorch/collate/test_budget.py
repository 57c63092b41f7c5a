"""Every collated micro-batch inside the plan's budget: the collator built from the plan."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lengthwise
from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.collate import (
    Budget,
    BudgetError,
    PackCollator,
    PadCollator,
    collator_for,
)


def _samples(lengths):
    return [{"input_ids": torch.ones(int(n), dtype=torch.long)} for n in lengths]


def test_budget_error_is_a_value_error_naming_batch_and_numbers():
    assert issubclass(BudgetError, ValueError)
    assert lengthwise.BudgetError is BudgetError
    c = PadCollator(0, budget=Budget(max_tokens=16))
    c(_samples([8, 8]))
    with pytest.raises(BudgetError, match=r"micro-batch 1 .* 3 rows x 8 padded tokens = 24 > "
                                          r"max_tokens=16"):
        c(_samples([8, 8, 3]))
    with pytest.raises(BudgetError, match="2 rows > batch_size=1"):
        PadCollator(0, budget=Budget(batch_size=1))(_samples([1, 1]))
    with pytest.raises(BudgetError, match="cost 24 > max_cost=20"):
        PadCollator(0, budget=Budget(max_cost=20, cost=(1.0, 0.0, 2.0)))(_samples([10, 1]))


def test_packed_budget_rows_and_capacity():
    budget = Budget(max_tokens=8, rows=2, layout="pack")
    PackCollator(row_capacity=8, budget=budget)(_samples([5, 3, 8]))
    with pytest.raises(BudgetError, match="3 packed rows > rows_per_batch=2"):
        PackCollator(row_capacity=8, budget=budget)(_samples([5, 4, 8]))
    with pytest.raises(BudgetError, match="row 1 holds 9 tokens > max_tokens=8"):
        PackCollator(budget=budget)([_samples([5]), _samples([4, 5])])
    with pytest.raises(BudgetError, match="17 tokens > 2 rows x 8 tokens"):
        PackCollator(budget=budget)(_samples([9, 8]))
    with pytest.raises(ValueError, match="padded one"):
        PackCollator(pad_token_id=0, budget=Budget(max_tokens=8))
    with pytest.raises(TypeError, match="Budget"):
        PadCollator(0, budget=16)


def test_sampler_and_collator_defaults_agree():
    import inspect

    default = inspect.signature(PadCollator).parameters["pad_multiple"].default
    assert default == PlanConfig(batch_size=1).pad_multiple == 1


def test_collator_for_takes_everything_from_the_plan():
    cfg = PlanConfig(max_tokens=100, max_len=200, pad_multiple=8)
    c = collator_for(cfg, [40, 96], pad_token_id=0, metadata=False)
    assert (c.pad_multiple, c.max_length, c.edges) == (8, 96, [40, 96])
    assert c.budget == Budget(max_tokens=100)
    with pytest.raises(ValueError, match="pad_multiple=4 disagrees with the plan"):
        collator_for(cfg, [96], pad_token_id=0, pad_multiple=4)
    assert collator_for(cfg, [96], pad_token_id=0, pad_multiple=8).pad_multiple == 8
    with pytest.raises(TypeError, match="needs pad_token_id"):
        collator_for(cfg, [96])
    packed = PlanConfig(max_tokens=64, layout="pack", rows_per_batch=2)
    assert collator_for(packed, [64]).row_capacity is None
    assert collator_for(packed, [64], yield_rows=True).row_capacity == 64
    split = PlanConfig(max_tokens=64, layout="pack", on_overflow="split", max_len=100)
    assert split.sample_limit() == 100


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=8, max_size=150),
    max_tokens=st.integers(64, 4096), max_len=st.one_of(st.none(), st.integers(1, 2500)),
    pad_multiple=st.sampled_from([1, 3, 8, 64]), layout=st.sampled_from(["pad", "pack"]),
    order=st.sampled_from(["stratified", "sorted", "random", "bucket-random", "interleave"]),
    world=st.integers(1, 3), seed=st.integers(0, 5),
)
def test_plan_collator_never_exceeds_the_budget(lengths, max_tokens, max_len, pad_multiple,
                                                layout, order, world, seed):
    """Full-length samples through the plan's collator: every tensor within the budget."""
    if layout == "pack" and order not in ("stratified", "random"):
        order = "stratified"
    if layout == "pad" and max_tokens < pad_multiple:
        max_tokens = pad_multiple
    lengths = np.asarray(lengths)
    try:
        plan = lengthwise.plan_epoch(lengths,
                                     PlanConfig(max_tokens=max_tokens, max_len=max_len,
                                                pad_multiple=pad_multiple, layout=layout,
                                                order=order, world_size=world),
                                     seed=seed)
    except ValueError as exc:  # too few samples for the ranks: a clear error, not a batch
        assert "ranks" in str(exc)
        return
    collate = collator_for(plan.config, getattr(plan, "edges", None), pad_token_id=0)
    seen = 0
    for k in range(plan.total_batches):
        ids = plan.batch(k)
        batch = collate(_samples(lengths[ids]))
        assert batch["input_ids"].numel() <= max_tokens
        assert batch["real_tokens"] == int(plan.lengths[ids].sum())
        if layout == "pad":
            assert batch["padded_tokens"] == batch["input_ids"].numel()
        seen += len(ids)
    assert seen == plan.indices.size


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=16, max_size=120),
    max_tokens=st.integers(32, 4096), max_len=st.one_of(st.none(), st.integers(1, 3000)),
    pad_multiple=st.sampled_from([1, 8, 64]), layout=st.sampled_from(["pad", "pack"]),
    rows=st.integers(1, 3), yield_rows=st.booleans(), grad_accum=st.integers(1, 4),
    seed=st.integers(0, 3),
)
def test_sampler_collator_never_exceeds_the_budget(lengths, max_tokens, max_len, pad_multiple,
                                                   layout, rows, yield_rows, grad_accum, seed):
    """The documented path: iterate the sampler plainly (or by rows), collate full samples."""
    import warnings

    from lengthwise.pytorch.collate import RowsDataset

    if layout == "pad":
        max_tokens = max(max_tokens, pad_multiple)
        rows, yield_rows = 1, False
    lengths = np.asarray(lengths)
    data = _samples(lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncating over 1% of the tokens warns
        try:
            config = PlanConfig(max_tokens=max_tokens, max_len=max_len,
                                pad_multiple=pad_multiple, layout=layout,
                                rows_per_batch=rows if layout == "pack" else 1,
                                grad_accum=grad_accum)
            sampler = lengthwise.BucketBatchSampler(lengths, config, yield_rows=yield_rows,
                                                    seed=seed)
            collate = sampler.collator(pad_token_id=0)
            batches = list(sampler)
        except ValueError as exc:  # too few samples for the rows: a clear error
            # too few samples for the rows, or rows narrower than one pad multiple
            assert "cannot fill" in str(exc) or "cannot hold a single row" in str(exc)
            return
    fetch = RowsDataset(data) if yield_rows else data
    budget = max_tokens * (rows if layout == "pack" else 1)
    for batch in batches:
        samples = [fetch[i] for i in batch]
        out = collate(samples)
        assert out["input_ids"].numel() <= budget
        assert out["padded_tokens"] <= budget
    # a data set whose samples are longer than the plan's lengths: caught, never passed on
    if layout == "pad":
        widest = max(batches, key=len)
        limit = sampler.config.sample_limit()
        too_long = [{"input_ids": torch.ones(limit + 5, dtype=torch.long)} for _ in widest]
        padded = -(-limit // pad_multiple) * pad_multiple
        if len(widest) * padded > max_tokens:
            with pytest.raises(BudgetError, match="over the plan's budget"):
                collate(too_long)
        elif limit > sampler.edges[-1]:  # longer than any length the plan saw: named
            with pytest.raises(ValueError, match="longer than the last bucket edge"):
                collate(too_long)
        else:
            assert collate(too_long)["input_ids"].numel() <= max_tokens


def test_readme_path_on_sft_mix_stays_inside_the_budget():
    """The check of the docs on the bundled sft_mix: no micro-batch over 16,384 tokens."""
    import warnings

    raw = np.asarray(lengthwise.load_lengths("sft_mix"), dtype=np.int64)
    for layout in ("pad", "pack"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = lengthwise.BucketBatchSampler(raw,
                                              PlanConfig(max_tokens=16384, max_len=8192,
                                                         grad_accum=4, layout=layout))
        c = s.collator(pad_token_id=0)
        sizes = [c([{"input_ids": np.ones(int(raw[i]), dtype=np.int64)} for i in b]
                   )["input_ids"].numel() for b in s]
        assert len(sizes) == len(s) > 1000 and max(sizes) <= 16384, layout


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=8, max_size=100),
    rule=st.sampled_from(["batch_size", "max_cost"]), pad_multiple=st.sampled_from([1, 8]),
    max_len=st.one_of(st.none(), st.integers(16, 2000)), seed=st.integers(0, 3),
    order=st.sampled_from(["stratified", "sorted", "random", "interleave"]),
)
def test_row_and_cost_budgets_hold_too(lengths, rule, pad_multiple, max_len, seed, order):
    """Rows (batch_size) and compute (max_cost) budgets, with full-length samples."""
    import warnings

    from lengthwise.planning.cost import CostModel

    cost = CostModel(a=1.0, b=0.01, c=16.0)
    options = ({"batch_size": 3} if rule == "batch_size"
               else {"max_cost": 60_000.0, "cost": cost})
    lengths = np.asarray(lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = PlanConfig(max_len=max_len, order=order, pad_multiple=pad_multiple, **options)
        sampler = lengthwise.BucketBatchSampler(lengths, config, seed=seed)
        batches = list(sampler)
    collate = sampler.collator(pad_token_id=0)
    for batch in batches:
        rows, padded = collate(_samples(lengths[batch]))["input_ids"].shape
        assert padded % pad_multiple == 0
        if rule == "batch_size":
            assert rows <= 3
        else:
            assert rows * cost.row_cost(padded) <= 60_000.0
    too_many = _samples([min(int(lengths.max()), sampler.config.sample_limit() or 10**9)] * 4)
    if rule == "batch_size":
        with pytest.raises(BudgetError, match="4 rows > batch_size=3"):
            collate(too_many)


def test_a_collator_names_a_budget_it_cannot_use():
    from lengthwise.pytorch.collate import Budget, PackCollator, PadCollator

    for collator in (PadCollator, PackCollator):
        with pytest.raises(TypeError, match=r"budget must be a lengthwise\.pytorch\.collate\."
                                            r"Budget, got \{'max_tokens': 8\}"):
            collator(pad_token_id=0, budget={"max_tokens": 8})
    with pytest.raises(ValueError, match="PadCollator needs a budget of the padded layout, "
                                         "got a packed one"):
        PadCollator(pad_token_id=0, budget=Budget(max_tokens=8, layout="pack"))
    with pytest.raises(ValueError, match="PackCollator needs a budget of the packed layout, "
                                         "got a padded one"):
        PackCollator(pad_token_id=0, budget=Budget(max_tokens=8))
    assert PadCollator(pad_token_id=0, budget=Budget(max_tokens=8)).budget == Budget(max_tokens=8)
