"""Sampler states and options that cannot be honoured are refused, naming what and where."""

from __future__ import annotations

import numpy as np
import pytest

from lengthwise.errors import ConfigError
from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.sampler import BucketBatchSampler, ResumeError

BIG = 64 * 16384 + 4097  # over a million lengths: a change in any of them is seen


def _windowed(lengths):
    return BucketBatchSampler(lengths, PlanConfig(batch_size=64, buckets=4), window=1 << 16, seed=1)


def test_windowed_resume_refuses_a_length_changed_anywhere():
    lengths = np.random.default_rng(0).integers(1, 500, BIG)
    sampler = _windowed(lengths)
    it = iter(sampler)
    for _ in range(3):
        next(it)
    state = sampler.state_dict()
    changed = lengths.copy()
    changed[(BIG - 16384) // 126] += 1  # a row between two blocks of a sampled checksum
    with pytest.raises(ResumeError, match="lengths differ"):
        _windowed(changed).load_state_dict(state)
    same = _windowed(lengths.copy())
    same.load_state_dict(state)
    assert next(iter(same)) == next(it)


def test_a_windowed_state_of_an_older_version_is_one_line_refusal():
    lengths = np.random.default_rng(0).integers(1, 500, 5000)
    state = _windowed(lengths).state_dict()
    old = dict(state, version=1, options={k: v for k, v in state["options"].items()
                                          if k != "balance"})  # as version 1 saved it
    fresh = _windowed(lengths)
    with pytest.raises(ResumeError) as err:
        fresh.load_state_dict(old)
    assert str(err.value) == ("sampler state version 1 is from an older lengthwise, which this "
                              "version does not read (it reads version 2); start the epoch over "
                              "with set_epoch()")
    with pytest.raises(ResumeError, match=r"balance is 'none', the saved state has None"):
        fresh.load_state_dict(dict(old, version=2))  # every option is in a state now
    fresh.load_state_dict(state)


def test_windowed_refusal_names_the_window_and_the_state():
    lengths = np.random.default_rng(0).integers(1, 200, 3000)
    sampler = BucketBatchSampler(lengths, PlanConfig(max_tokens=512), window=500, num_replicas=2,
                                 rank=0)
    it = iter(sampler)
    for _ in range(5):
        next(it)
    state = dict(sampler.state_dict(), window_yielded=500, yielded=505)
    fresh = BucketBatchSampler(lengths, PlanConfig(max_tokens=512), window=500, num_replicas=2,
                               rank=0)
    with pytest.raises(ResumeError) as err:
        fresh.load_state_dict(state)
    msg = str(err.value)
    assert "window_index=0" in msg and "window_yielded=500" in msg and "epoch 0" in msg
    assert "past the end" in msg and "\n" not in msg


def test_collator_edges_repeat_the_plans_or_are_refused_by_name():
    sampler = BucketBatchSampler([5, 30, 12, 7], PlanConfig(max_tokens=64, buckets=[8, 16, 32]))
    edges = sampler.edges
    assert sampler.collator(0, edges=edges) is not None  # the plan's own: allowed
    with pytest.raises(ConfigError, match=r"edges=\[4, 64\] disagrees with the plan"):
        sampler.collator(0, edges=[4, 64])
    packed = BucketBatchSampler([5, 30, 12, 7], PlanConfig(max_tokens=64, layout="pack"))
    with pytest.raises(ConfigError, match="edges="):
        packed.collator(edges=[8])
