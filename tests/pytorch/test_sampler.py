"""BucketBatchSampler: the plan per rank, coverage, epochs, DataLoader use and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from _datasets import IndexDataset
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import lengthwise
from lengthwise.nemo import EpochBatchSampler, LengthwiseSamplerConfig
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.lengths import LengthError
from lengthwise.planning.plan import plan_epoch
from lengthwise.pytorch.sampler import BucketBatchSampler, ResumeError


def _lengths(n=2000, seed=0, top=600):
    return np.random.default_rng(seed).integers(1, top, n)


def _all_ranks(lengths, world, config, **own):
    return [BucketBatchSampler(lengths, config, num_replicas=world, rank=r, **own)
            for r in range(world)]




def test_export_and_yields_plan_batches_as_python_ints():
    assert lengthwise.BucketBatchSampler is BucketBatchSampler
    lens = _lengths()
    kw = PlanConfig(max_tokens=4096, grad_accum=2)
    plan = plan_epoch(lens, replace(kw, world_size=3), seed=3, epoch=0)
    for r, s in enumerate(_all_ranks(lens, 3, kw, seed=3)):
        got = list(s)
        assert got == [b.tolist() for b in plan.rank_batches(r)]
        assert len(got) == len(s) == plan.num_batches
        assert all(type(i) is int for b in got for i in b)
        assert all(int(lens[b].max()) * len(b) <= 4096 for b in got)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=8, max_size=400),
    world=st.integers(1, 5),
    accum=st.integers(1, 3),
    rule=st.sampled_from([("batch_size", 4), ("max_tokens", 600), ("batch_size", 1)]),
    order=st.sampled_from(["stratified", "interleave", "bucket-random", "random", "sorted"]),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 3),
)
def test_every_sample_exactly_once_and_equal_counts(lengths, world, accum, rule, order, seed,
                                                    epoch):
    lens = np.asarray(lengths)
    planned = np.flatnonzero(lens > 0)
    if planned.size < world:
        return  # too few samples to give every rank a batch (an error, tested below)
    samplers = _all_ranks(lens, world, PlanConfig(**{rule[0]: rule[1]}, grad_accum=accum,
                                                  order=order), seed=seed)
    for s in samplers:
        s.set_epoch(epoch)
    try:
        len(samplers[0])
    except ValueError as exc:  # the planner's documented limit: too few samples to split
        assert "cannot give each of" in str(exc)
        assume(False)
    per_rank = []
    for s in samplers:
        per_rank.append(list(s))
        assert len(per_rank[-1]) == len(s) >= 1
    assert len({len(b) for b in per_rank}) == 1  # the same count on every rank
    seen = np.sort(np.concatenate([np.concatenate(b) for b in per_rank]))
    np.testing.assert_array_equal(seen, planned)  # exactly once, empty samples left out


def test_epochs_differ_are_deterministic_and_set_epoch_is_idempotent():
    lens = _lengths()
    a = BucketBatchSampler(lens, PlanConfig(max_tokens=4096), seed=1)
    b = BucketBatchSampler(lens, PlanConfig(max_tokens=4096), seed=1)
    e0 = list(a)
    a.set_epoch(1)
    e1 = list(a)
    assert e0 != e1
    b.set_epoch(1)
    assert list(b) == e1
    b.set_epoch(0)
    assert list(b) == e0
    # iterating again without set_epoch repeats the epoch, as DistributedSampler does
    assert list(b) == e0
    c = BucketBatchSampler(lens, PlanConfig(max_tokens=4096), seed=2)
    assert list(c) != e0


def test_plan_is_built_once_per_epoch():
    s = BucketBatchSampler(_lengths(), PlanConfig(max_tokens=4096))
    first = s.plan
    assert s.plan is first
    list(s)
    assert s.plan is first
    s.set_epoch(1)
    assert s.plan is not first


def test_dataloader_loads_the_planned_rows():
    lens = _lengths(500)
    s = BucketBatchSampler(lens, PlanConfig(batch_size=8), num_replicas=2, rank=1, seed=4)
    loader = DataLoader(IndexDataset(lens.size), batch_sampler=s)
    got = [b.tolist() for b in loader]
    assert got == list(s)
    assert len(loader) == len(s)


def test_even_out_drop_drops_whole_batches_and_counts_them():
    lens = _lengths(1003)
    world = 4
    samplers = _all_ranks(lens, world, PlanConfig(batch_size=10, even_out="drop"))
    seen = np.concatenate([np.concatenate(list(s)) for s in samplers])
    assert np.unique(seen).size == seen.size
    stats = samplers[0].plan.stats
    assert stats["dropped_to_even_out"] == lens.size - seen.size > 0
    assert samplers[0].drop_last  # what loader wrappers read


def test_lengths_from_files_match_arrays(tmp_path):
    lens = _lengths(300)
    np.save(tmp_path / "l.npy", lens)
    with open(tmp_path / "l.jsonl", "w") as fh:
        for n in lens.tolist():
            fh.write(json.dumps({"n": n}) + "\n")
    want = list(BucketBatchSampler(lens, PlanConfig(max_tokens=2048)))
    assert list(BucketBatchSampler(str(tmp_path / "l.npy"), PlanConfig(max_tokens=2048))) == want
    jsonl = f"{tmp_path / 'l.jsonl'}:n"
    assert list(BucketBatchSampler(jsonl, PlanConfig(max_tokens=2048))) == want


def test_ranks_default_to_single_process_and_are_checked():
    s = BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4))
    assert (s.num_replicas, s.rank) == (1, 0)
    with pytest.raises(ValueError, match="rank 2 is out of range for num_replicas=2"):
        BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4), num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas must be a positive whole number"):
        BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4), num_replicas=0, rank=0)
    with pytest.raises(TypeError, match="num_replicas must be a whole number, got 2.5"):
        BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4), num_replicas=2.5, rank=0)
    with pytest.raises(ValueError, match="rank must be a non-negative"):
        BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4), num_replicas=2, rank=-1)


def test_ranks_default_to_the_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        s = BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4))
        assert (s.num_replicas, s.rank) == (dist.get_world_size(), dist.get_rank())
    finally:
        dist.destroy_process_group()


def test_import_lengthwise_works_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import lengthwise\n"
        "p = lengthwise.plan_epoch([3, 5, 2, 7], lengthwise.PlanConfig(batch_size=2))\n"
        "assert p.num_batches == 2\n"
        "try:\n"
        "    lengthwise.BucketBatchSampler\n"
        "except ImportError:\n"
        "    print('needs torch')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "needs torch"


def test_remaining_counts_what_is_left():
    s = BucketBatchSampler(_lengths(400), PlanConfig(batch_size=8))
    n = len(s)
    it = iter(s)
    for _ in range(5):
        next(it)
    assert s.remaining() == n - 5
    list(it)
    assert s.remaining() == 0


# ---------------------------------------------------------------- bad input


def test_budget_below_the_longest_sample_follows_the_policy():
    lens = np.array([10, 50, 700, 20, 900, 30] * 20)
    with pytest.raises(LengthError, match=r"sample 2 has 700 tokens.*max_tokens=512.*40 samples"):
        BucketBatchSampler(lens, PlanConfig(max_tokens=512, on_overflow="error"))
    with pytest.raises(LengthError, match=r"max_len=600"):
        BucketBatchSampler(lens, PlanConfig(max_tokens=4096, max_len=600, on_overflow="error"))
    trunc = BucketBatchSampler(lens, PlanConfig(max_tokens=512))
    assert trunc.plan.stats["truncated"] == 40
    assert sorted(np.concatenate(list(trunc)).tolist()) == list(range(lens.size))
    drop = BucketBatchSampler(lens, PlanConfig(max_tokens=512, on_overflow="drop"))
    kept = np.concatenate(list(drop))
    assert drop.plan.stats["dropped_overflow"] == 40
    assert set(kept.tolist()) == set(np.flatnonzero(lens <= 512).tolist())


def test_budget_that_cannot_hold_one_row():
    with pytest.raises(ValueError,
                       match="max_tokens=4 cannot hold a single row of pad_multiple=8 tokens"):
        BucketBatchSampler([3, 4], PlanConfig(max_tokens=4, pad_multiple=8))


def test_batch_rule_must_be_given_once():
    with pytest.raises(ValueError, match="exactly one of batch_size, max_tokens or max_cost"):
        BucketBatchSampler([3, 4], PlanConfig(max_tokens=100, batch_size=2))
    with pytest.raises(TypeError, match="config must be a lengthwise.PlanConfig, got 8"):
        BucketBatchSampler([3, 4], 8)


def _nemo_sampler(lengths, config, **keywords):
    return LengthwiseSamplerConfig(lengths, config, {"seed": 3, **keywords}).build(
        dataset_len=lengths.size, rank=1, world_size=2)


@pytest.mark.parametrize("make", [BucketBatchSampler, EpochBatchSampler, _nemo_sampler])
def test_plan_options_as_keywords_sample_as_their_config(plan_keywords, make):
    lengths = _lengths(300)
    mine = {} if make is _nemo_sampler else {"seed": 3, "num_replicas": 2, "rank": 1}
    who = "LengthwiseSamplerConfig" if make is _nemo_sampler else make.__name__
    plan_keywords(lambda config, **kw: list(make(lengths, config, **mine, **kw)), who,
                  max_tokens=1200, grad_accum=2, even_out="drop")


def test_an_unknown_keyword_of_the_sampler_names_its_nearest_option():
    with pytest.raises(ValueError, match=r"unknown option 'num_replica'; did you mean "
                                         r"'num_replicas'\?$"):
        BucketBatchSampler([3, 4], batch_size=2, num_replica=2)
    with pytest.raises(ValueError, match=r"unknown option 'pad_multiples'; did you mean "
                                         r"'pad_multiple'\?$"):
        BucketBatchSampler([3, 4], PlanConfig(batch_size=2), pad_multiples=8)


def test_lengths_that_do_not_match_the_dataset():
    s = BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4))
    s.check_dataset(IndexDataset(100))
    with pytest.raises(ValueError, match="lengths for 100 samples but the dataset has 99 rows"):
        s.check_dataset(IndexDataset(99))
    with pytest.raises(TypeError, match="no len"):
        s.check_dataset(iter(range(100)))


def test_too_few_samples_for_the_ranks():
    with pytest.raises(ValueError, match="cannot give each of 4 ranks"):
        len(BucketBatchSampler([5, 6, 7], PlanConfig(batch_size=1), num_replicas=4, rank=0))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"max_tokens": 2048}, r"max_tokens is 2048, the saved state has 4096"),
        ({"order": "interleave"}, r"order is 'interleave', the saved state has 'stratified'"),
        ({"seed": 9}, r"seed is 9, the saved state has 0"),
        ({"buckets": 3}, r"buckets is 3, the saved state has 'auto'"),
        ({"even_out": "drop"}, r"even_out is 'drop', the saved state has 'split'"),
    ],
)
def test_state_from_another_config_is_refused(change, expected):
    lens = _lengths()
    kw = PlanConfig(max_tokens=4096)
    old = BucketBatchSampler(lens, kw)
    it = iter(old)
    next(it)
    state = old.state_dict()
    options = {k: v for k, v in change.items() if k != "seed"}
    new = BucketBatchSampler(lens, replace(kw, **options), seed=change.get("seed", 0))
    with pytest.raises(ResumeError, match=expected):
        new.load_state_dict(state)


def test_state_from_other_lengths_is_refused():
    lens = _lengths()
    state = BucketBatchSampler(lens, PlanConfig(max_tokens=4096)).state_dict()
    other = lens.copy()
    other[7] += 1
    with pytest.raises(ResumeError, match="the lengths differ from the saved ones"):
        BucketBatchSampler(other, PlanConfig(max_tokens=4096)).load_state_dict(state)
    with pytest.raises(ResumeError, match="the lengths have 1999 samples, the saved state 2000"):
        BucketBatchSampler(lens[:-1], PlanConfig(max_tokens=4096)).load_state_dict(state)


def test_malformed_states_are_refused():
    s = BucketBatchSampler(_lengths(), PlanConfig(max_tokens=4096))
    good = s.state_dict()
    with pytest.raises(ResumeError, match="missing"):
        s.load_state_dict({"epoch": 0})
    with pytest.raises(ResumeError, match="version 99"):
        s.load_state_dict({**good, "version": 99})
    with pytest.raises(ResumeError, match=r"yielded, but epoch 0 has only \d+ per rank"):
        s.load_state_dict({**good, "yielded": len(s) + 1})
    with pytest.raises(ResumeError, match="a sampler state is a dict"):
        s.load_state_dict([1, 2])
    # the sampler is still usable after refusing
    assert len(list(s)) == len(s)


def test_sampler_exposes_no_fixed_batch_size():
    # accelerate's BatchSamplerShard treats a batch sampler with batch_size as fixed-size
    s = BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4))
    assert s.batch_size is None
    assert s.config.batch_size == 4
    assert isinstance(s, torch.utils.data.Sampler)
