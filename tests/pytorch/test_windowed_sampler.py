"""The sampler over a windowed epoch: coverage, equal counts, exact and elastic resume."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from _datasets import IndexDataset
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.stateful_dataloader import StatefulDataLoader

from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.sampler import BucketBatchSampler, ResumeError, loader_sampler_state

KW = PlanConfig(max_tokens=4096, grad_accum=2)
OWN = dict(seed=5, window=700)


def _lengths(n=3000, seed=0):
    return np.random.default_rng(seed).integers(1, 900, n)


def _samplers(lens, world, config):
    return [BucketBatchSampler(lens, config, num_replicas=world, rank=r, **OWN)
            for r in range(world)]


def _take(sampler, k):
    it = iter(sampler)
    out = [next(it) for _ in range(k)]
    return out, sampler.state_dict()


def _assert_exactly_once(batches, n):
    np.testing.assert_array_equal(np.sort(np.concatenate(batches)), np.arange(n))


def test_windowed_sampler_covers_every_sample_once_with_equal_counts():
    lens = _lengths()
    samplers = _samplers(lens, 3, KW)
    assert samplers[0].window == 700 and samplers[0].plan.num_windows == 5
    runs = [list(s) for s in samplers]
    assert {len(r) for r in runs} == {len(samplers[0])}
    _assert_exactly_once([b for r in runs for b in r], lens.size)
    assert all(max(lens[b]) * len(b) <= 4096 for r in runs for b in r)
    # a whole-epoch sampler of a small data set is unchanged by the default window="auto"
    auto = BucketBatchSampler(lens, PlanConfig(max_tokens=4096), seed=5)
    whole = BucketBatchSampler(lens, PlanConfig(max_tokens=4096), seed=5, window=None)
    assert auto.window is None and list(auto) == list(whole)


@settings(max_examples=15, deadline=None)
@given(cut=st.integers(0, 60), epoch=st.integers(0, 3), via_json=st.booleans())
def test_windowed_resume_is_exact(cut, epoch, via_json):
    lens = _lengths(2000, seed=epoch)
    ref = BucketBatchSampler(lens, KW, num_replicas=2, rank=1, **OWN)
    ref.set_epoch(epoch)
    full = list(ref)
    cut = min(cut, len(full))
    s = BucketBatchSampler(lens, KW, num_replicas=2, rank=1, **OWN)
    s.set_epoch(epoch)
    head, state = _take(s, cut)
    if via_json:
        state = json.loads(json.dumps(state))
    fresh = BucketBatchSampler(lens, KW, num_replicas=2, rank=1, **OWN)
    fresh.load_state_dict(state)
    fresh.set_epoch(epoch)
    assert fresh.remaining() == len(full) - cut
    assert head + list(fresh) == full


@settings(max_examples=12, deadline=None)
@given(chain=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 2), st.integers(0, 30)),
                      min_size=1, max_size=3),
       last=st.tuples(st.integers(1, 4), st.integers(1, 2)))
def test_windowed_elastic_resume_trains_every_sample_once(chain, last):
    lens = _lengths(2500, seed=len(chain))
    trained, state = [], None
    for world, accum, take in [*chain, (*last, None)]:
        samplers = _samplers(lens, world, replace(KW, grad_accum=accum))
        counts = []
        for s in samplers:
            if state is not None:
                s.load_state_dict(state)
            counts.append(s.remaining())
            trained += list(s) if take is None else _take(s, min(take, s.remaining()))[0]
        assert len(set(counts)) == 1  # the new ranks have the same number of micro-batches
        state = samplers[0].state_dict()
    _assert_exactly_once(trained, lens.size)


def test_loader_state_past_a_window_end_moves_on():
    lens = _lengths(2000)
    ref = BucketBatchSampler(lens, KW, **OWN)
    full = list(ref)
    s = BucketBatchSampler(lens, KW, **OWN)
    head, state = _take(s, 3)
    # a loader that handed out more micro-batches since its snapshot: past window 0
    extra = s.plan.window_batches(0) + 2
    moved = loader_sampler_state({"_snapshot": {"_main_snapshot": {
        "_index_sampler_state": state}}, "_steps_since_snapshot": extra})
    assert moved["window_yielded"] == 3 + extra
    fresh = BucketBatchSampler(lens, KW, **OWN)
    fresh.load_state_dict(moved)
    assert fresh.state_dict()["window_index"] == 1
    assert fresh.state_dict()["window_yielded"] == 5
    assert list(fresh) == full[3 + extra:]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_a_windowed_epoch(workers):
    lens = _lengths(2000)
    full = list(BucketBatchSampler(lens, KW, **OWN))
    sampler = BucketBatchSampler(lens, KW, **OWN)
    loader = StatefulDataLoader(IndexDataset(lens.size), batch_sampler=sampler,
                                num_workers=workers, collate_fn=list)
    it = iter(loader)
    head = [next(it) for _ in range(57)]
    state = loader.state_dict()
    del it, loader
    fresh = BucketBatchSampler(lens, KW, **OWN)
    loader = StatefulDataLoader(IndexDataset(lens.size), batch_sampler=fresh,
                                num_workers=workers, collate_fn=list)
    loader.load_state_dict(state)
    assert head + list(loader) == full


def test_windowed_state_refuses_other_settings():
    lens = _lengths(2000)
    _, state = _take(BucketBatchSampler(lens, KW, **OWN), 5)
    with pytest.raises(ResumeError, match="window is 800"):
        BucketBatchSampler(lens, KW, **{**OWN, "window": 800}).load_state_dict(state)
    with pytest.raises(ResumeError, match="window is None"):
        BucketBatchSampler(lens, KW, **{**OWN, "window": None}).load_state_dict(state)
    bad = dict(state, window_yielded=10**6, yielded=10**6)
    with pytest.raises(ResumeError, match="past the end"):
        BucketBatchSampler(lens, KW, **OWN).load_state_dict(bad)


def test_windowed_sampler_reads_a_memory_mapped_file(tmp_path):
    lens = _lengths(3000).astype(np.int32)
    path = tmp_path / "lengths.npy"
    np.save(path, lens)
    s = BucketBatchSampler(str(path), KW, **OWN)
    assert isinstance(s.lengths, np.memmap)
    assert list(s) == list(BucketBatchSampler(lens, KW, **OWN))


def test_windowed_packed_rows_cover_every_sample_once():
    lens = _lengths(3000)
    runs = [list(BucketBatchSampler(lens, PlanConfig(max_tokens=4096, layout="pack"), window=1000,
                                    num_replicas=2, rank=r, yield_rows=True)) for r in range(2)]
    assert len(runs[0]) == len(runs[1])
    rows = [row for run in runs for batch in run for row in batch]
    assert all(sum(lens[row]) <= 4096 for row in rows)
    _assert_exactly_once([np.asarray(row) for row in rows], lens.size)
