"""The sampler's state counts the micro-batches the loop received, whatever loader fetched ahead.

A ``DataLoader`` with workers pulls ``prefetch_factor x num_workers`` micro-batches from
the sampler before the loop receives them, and Accelerate's ``DataLoaderShard`` one; a
state taken inside the loop must still resume at the next micro-batch the loop had not
received.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _datasets import IndexDataset
from torch.utils.data import DataLoader

from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.sampler import BucketBatchSampler, ResumeError

KW = PlanConfig(max_tokens=512, buckets=4)
N = 600


def _lengths():
    return np.random.default_rng(1).integers(1, 200, N)


def _collate(items):
    return list(items)


def _all_batches(**kw):
    return [list(b) for b in BucketBatchSampler(_lengths(), KW, seed=3, **kw)]


def _rest(state, **kw):
    fresh = BucketBatchSampler(_lengths(), KW, seed=3, **kw)
    fresh.load_state_dict(state)
    return [list(b) for b in fresh]


@pytest.mark.parametrize("workers,persistent,window", [
    (0, False, None), (2, False, None), (2, True, None), (2, False, 200)])
def test_state_inside_a_loader_with_workers_resumes_at_the_next_untrained_batch(
        workers, persistent, window):
    full = _all_batches(window=window)
    sampler = BucketBatchSampler(_lengths(), KW, seed=3, window=window)
    loader = DataLoader(IndexDataset(N), batch_sampler=sampler, num_workers=workers,
                        persistent_workers=persistent, collate_fn=_collate)
    cut = 5
    for epoch in range(2 if persistent else 1):  # a persistent loader's second pass too
        sampler.set_epoch(epoch)
        full = _all_batches(window=window) if epoch == 0 else None
        received = []
        for batch in loader:
            received.append(batch)
            if len(received) == cut:
                state = sampler.state_dict()
                break
        assert state["yielded"] == cut
        if full is not None:
            assert received + _rest(state, window=window) == full
        if window is not None:
            assert state["window_yielded"] <= state["yielded"]


def test_a_finished_epoch_with_workers_counts_every_batch():
    sampler = BucketBatchSampler(_lengths(), KW, seed=3)
    loader = DataLoader(IndexDataset(N), batch_sampler=sampler, num_workers=2,
                        collate_fn=_collate)
    assert sum(1 for _ in loader) == len(sampler)
    state = sampler.state_dict()  # the loader is gone: the whole epoch was received
    assert state["yielded"] == len(sampler)
    assert _rest(state) == []


def test_a_loader_closed_mid_epoch_after_fetching_ahead_is_refused():
    sampler = BucketBatchSampler(_lengths(), KW, seed=3)
    loader = DataLoader(IndexDataset(N), batch_sampler=sampler, num_workers=2,
                        collate_fn=_collate)
    it = iter(loader)
    next(it)
    del it  # closed: how many were trained is unknown
    with pytest.raises(ResumeError, match=r"2 loader workers fetched ahead.*inside the loop"):
        sampler.state_dict()
    sampler.set_epoch(1)  # a new epoch starts from a known place
    assert sampler.state_dict()["yielded"] == 0


def test_windowed_state_fetched_across_a_window_start_names_the_window():
    sampler = BucketBatchSampler(_lengths(), KW, seed=3, window=100)
    full = _all_batches(window=100)
    loader = DataLoader(IndexDataset(N), batch_sampler=sampler, num_workers=2,
                        prefetch_factor=3, collate_fn=_collate)
    states, refused = [], []
    for k, _ in enumerate(loader, 1):
        try:
            states.append((k, sampler.state_dict()))
        except ResumeError as exc:
            refused.append(str(exc))
    assert refused and states
    assert all("window" in msg and "epoch 0" in msg for msg in refused)
    for k, state in states:
        assert full[:k] + _rest(state, window=100) == full


def test_accelerate_shard_looking_one_batch_ahead_is_counted():
    pytest.importorskip("accelerate")
    from accelerate.data_loader import prepare_data_loader

    full = _all_batches()
    sampler = BucketBatchSampler(_lengths(), KW, seed=3)
    loader = prepare_data_loader(
        DataLoader(IndexDataset(N), batch_sampler=sampler, collate_fn=_collate),
        torch.device("cpu"), num_processes=1, process_index=0, put_on_device=True)
    received = []
    for batch in loader:
        received.append(list(batch))
        state = sampler.state_dict()  # what accelerator.save_state saves of a registered sampler
        assert state["yielded"] == len(received)
        assert received + _rest(state) == full
    assert sampler.state_dict()["yielded"] == len(full)
