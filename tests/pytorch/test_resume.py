"""Exact mid-epoch resume: by hand, through StatefulDataLoader, after a killed process, elastic.

Run as a script, this file is the process that gets killed (see ``_child``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from _datasets import IndexDataset
from _ports import script_env
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.stateful_dataloader import StatefulDataLoader

from lengthwise.planning.config import PlanConfig
from lengthwise.planning.plan import plan_epoch
from lengthwise.pytorch.sampler import BucketBatchSampler, loader_sampler_state

SEED = 7
KW = PlanConfig(max_tokens=4096, grad_accum=2)
FAST = replace(KW, buckets=6)  # fixed bucket count: no edge search, for the many-example tests


def _lengths(n=3000, seed=0):
    return np.random.default_rng(seed).integers(1, 900, n)




def _collate(items):
    return list(items)


def _loader(sampler, workers=0):
    return StatefulDataLoader(IndexDataset(sampler.lengths.size), batch_sampler=sampler,
                              num_workers=workers, collate_fn=_collate)


def _samplers(lens, world, config, seed=SEED):
    return [BucketBatchSampler(lens, config, num_replicas=world, rank=r, seed=seed)
            for r in range(world)]


def _take(sampler, n):
    """First ``n`` micro-batches of a fresh pass, and the iterator left open."""
    it = iter(sampler)
    return [next(it) for _ in range(n)], it


# ---------------------------------------------------------------- same world size, by hand


@settings(max_examples=30, deadline=None)
@given(world=st.integers(1, 4), epoch=st.integers(0, 3), cut=st.floats(0, 1),
       via_json=st.booleans())
def test_resume_by_hand_equals_uninterrupted(world, epoch, cut, via_json):
    lens = _lengths(1500)
    full = []
    for s in _samplers(lens, world, FAST):
        s.set_epoch(epoch)
        full.append(list(s))
    y = int(cut * len(full[0]))  # the same on every rank
    old = _samplers(lens, world, FAST)
    heads = []
    for s in old:
        s.set_epoch(epoch)
        head, _ = _take(s, y)
        heads.append(head)
    state = old[0].state_dict()
    assert state["yielded"] == y and state["epoch"] == epoch
    if via_json:
        state = json.loads(json.dumps(state))
    for r, s in enumerate(_samplers(lens, world, FAST)):
        s.load_state_dict(state)
        s.set_epoch(epoch)  # the usual call at the top of the epoch keeps the resume point
        assert s.remaining() == len(full[r]) - y
        rest = list(s)
        assert heads[r] + rest == full[r]
        # the following epoch is the uninterrupted one again
        s.set_epoch(epoch + 1)
        ref = BucketBatchSampler(lens, FAST, num_replicas=world, rank=r, seed=SEED)
        ref.set_epoch(epoch + 1)
        assert list(s) == list(ref)


def test_state_is_a_few_plain_numbers_and_rank_independent():
    lens = _lengths()
    a, b = _samplers(lens, 2, KW)
    _take(a, 3)
    _take(b, 3)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa == sb
    for key in ("seed", "epoch", "yielded", "world_size", "grad_accum", "fingerprint"):
        assert type(sa[key]) is int
    assert json.loads(json.dumps(sa)) == sa


# ---------------------------------------------------------------- elastic


def _elastic(lens, epoch, steps, config=KW, seed=SEED):
    """Train ``epoch`` over a chain of world sizes; ``steps`` = [(world, accum, take), ...].

    ``take=None`` runs the last world size to the end. Returns every micro-batch
    trained, and the samplers of the last world size.
    """
    trained, state, samplers = [], None, []
    for world, accum, take in steps:
        samplers = _samplers(lens, world, replace(config, grad_accum=accum), seed)
        counts = []
        for s in samplers:
            if state is not None:
                s.load_state_dict(state)
            s.set_epoch(epoch)
            counts.append(len(s))
            part = list(s) if take is None else _take(s, min(take, s.remaining()))[0]
            trained += part
        assert len(set(counts)) == 1  # every new rank has the same number of micro-batches
        state = samplers[0].state_dict()
    return trained, samplers


def _assert_exactly_once(trained, lens):
    ids = np.sort(np.concatenate(trained))
    np.testing.assert_array_equal(ids, np.flatnonzero(lens > 0))


@pytest.mark.parametrize(("old", "new"), [(2, 3), (4, 2)])
def test_elastic_resume_trains_the_rest_exactly_once(old, new):
    lens = _lengths()
    epoch, y = 1, 9
    trained, samplers = _elastic(lens, epoch, [(old, 2, y), (new, 2, None)])
    _assert_exactly_once(trained, lens)
    # the rest is exactly plan_epoch(indices=not yet trained, world_size=new)
    first = plan_epoch(lens, replace(KW, world_size=old), seed=SEED, epoch=epoch)
    done = np.concatenate([np.concatenate(first.rank_batches(r)[:y]) for r in range(old)])
    rest_ids = np.setdiff1d(np.arange(lens.size), done)
    rest = plan_epoch(lens, replace(KW, world_size=new, buckets=tuple(first.edges)),
                      seed=SEED, epoch=epoch, indices=rest_ids)
    for r, s in enumerate(samplers):
        assert s.state_dict()["resumed"] == [[old, 2, y]]
        assert [b.tolist() for b in rest.rank_batches(r)] == list(s)


@settings(max_examples=25, deadline=None)
@given(
    chain=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(0, 40)),
                   min_size=1, max_size=3),
    last=st.tuples(st.integers(1, 5), st.integers(1, 3)),
    epoch=st.integers(0, 2),
)
def test_elastic_chains_keep_every_sample_exactly_once(chain, last, epoch):
    lens = _lengths(800, seed=epoch)
    trained, _ = _elastic(lens, epoch, [*chain, (*last, None)],
                          config=PlanConfig(batch_size=6, buckets=5), seed=3)
    _assert_exactly_once(trained, lens)


def test_elastic_resume_of_a_finished_epoch_yields_nothing():
    lens = _lengths(500)
    trained, samplers = _elastic(lens, 0, [(2, 1, 10_000), (3, 1, None)])
    _assert_exactly_once(trained, lens)
    assert all(len(s) == 0 for s in samplers)
    samplers[0].set_epoch(1)
    assert len(list(samplers[0])) == len(samplers[0]) > 0


# ---------------------------------------------------------------- StatefulDataLoader


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(workers):
    lens = _lengths(2000)
    world, epoch = 2, 1
    full = []
    for r in range(world):
        s = BucketBatchSampler(lens, KW, num_replicas=world, rank=r, seed=SEED)
        s.set_epoch(epoch)
        full.append(list(s))
    cut = int(np.random.default_rng(workers).integers(1, len(full[0]) - 1))
    for r in range(world):
        sampler = BucketBatchSampler(lens, KW, num_replicas=world, rank=r, seed=SEED)
        sampler.set_epoch(epoch)
        loader = _loader(sampler, workers)
        it = iter(loader)
        head = [next(it) for _ in range(cut)]
        if workers:
            assert sampler.state_dict()["yielded"] > cut  # workers prefetched more
        state = loader.state_dict()
        del it, loader
        fresh = BucketBatchSampler(lens, KW, num_replicas=world, rank=r, seed=SEED)
        loader = _loader(fresh, workers)
        loader.load_state_dict(state)
        fresh.set_epoch(epoch)
        rest = list(loader)
        assert head + rest == full[r]
        fresh.set_epoch(epoch + 1)
        ref = BucketBatchSampler(lens, KW, num_replicas=world, rank=r, seed=SEED)
        ref.set_epoch(epoch + 1)
        assert list(loader) == list(ref)


@pytest.mark.parametrize(("workers", "every"), [(0, 1), (2, 1), (2, 3)])
def test_stateful_dataloader_state_resumes_other_world_sizes(workers, every):
    lens = _lengths(2000)
    trained, states = [], []
    for r in range(2):
        s = BucketBatchSampler(lens, KW, num_replicas=2, rank=r, seed=SEED)
        loader = StatefulDataLoader(IndexDataset(lens.size), batch_sampler=s,
                                    num_workers=workers, collate_fn=_collate,
                                    snapshot_every_n_steps=every)
        it = iter(loader)
        trained += [next(it) for _ in range(11)]
        states.append(loader_sampler_state(loader.state_dict()))
        del it
    assert states[0] == states[1] and states[0]["yielded"] == 11
    for s in _samplers(lens, 3, KW):
        s.load_state_dict(states[0])
        trained += list(s)
    _assert_exactly_once(trained, lens)
    with pytest.raises(ValueError, match="not a StatefulDataLoader state"):
        loader_sampler_state({"yielded": 3})


def test_stateful_dataloader_state_after_a_finished_epoch():
    lens = _lengths(600)
    sampler = BucketBatchSampler(lens, KW, seed=SEED)
    loader = _loader(sampler)
    first = list(loader)
    state = loader.state_dict()
    fresh = BucketBatchSampler(lens, KW, seed=SEED)
    loader = _loader(fresh)
    loader.load_state_dict(state)
    assert list(loader) == []  # epoch 0 is done
    fresh.set_epoch(1)
    second = list(loader)
    assert len(second) == len(fresh) and second != first


# ---------------------------------------------------------------- a killed process

CHILD_WORLD = 2
CHILD_EPOCH = 2


def _child(state_path: str, log_path: str, stop_at: int) -> None:
    """Train both ranks in lockstep, save the loaders' state after ``stop_at`` micro-batches,
    keep going (work the kill will lose), and wait to be killed."""
    lens = _lengths()
    loaders, iters = [], []
    for r in range(CHILD_WORLD):
        s = BucketBatchSampler(lens, KW, num_replicas=CHILD_WORLD, rank=r, seed=SEED)
        s.set_epoch(CHILD_EPOCH)
        loaders.append(_loader(s))
        iters.append(iter(loaders[-1]))
    with open(log_path, "w") as log:
        step = 0
        while True:
            for r in range(CHILD_WORLD):
                log.write(json.dumps([r, step, next(iters[r])]) + "\n")
            log.flush()
            step += 1
            if step == stop_at:
                torch.save([ld.state_dict() for ld in loaders], state_path + ".tmp")
                os.replace(state_path + ".tmp", state_path)
                print("saved", flush=True)
            if step == stop_at + 3:
                print("past", flush=True)
                time.sleep(120)


def test_resume_after_the_process_is_killed(tmp_path):
    lens = _lengths()
    full = []
    for r in range(CHILD_WORLD):
        s = BucketBatchSampler(lens, KW, num_replicas=CHILD_WORLD, rank=r, seed=SEED)
        s.set_epoch(CHILD_EPOCH)
        full.append(list(s))
    stop_at = int(np.random.default_rng().integers(1, len(full[0]) - 3))
    state_path, log_path = str(tmp_path / "state.pt"), str(tmp_path / "log.jsonl")
    proc = subprocess.Popen([sys.executable, __file__, state_path, log_path, str(stop_at)],
                            env=script_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saved"
        assert proc.stdout.readline().strip() == "past"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    states = torch.load(state_path)
    log = [json.loads(line) for line in open(log_path)]
    head = [[b for r, step, b in log if r == rank and step < stop_at]
            for rank in range(CHILD_WORLD)]
    assert any(step >= stop_at for _, step, _ in log)  # it trained past the checkpoint

    # same world size: exactly the uninterrupted batches
    for r in range(CHILD_WORLD):
        s = BucketBatchSampler(lens, KW, num_replicas=CHILD_WORLD, rank=r, seed=SEED)
        loader = _loader(s)
        loader.load_state_dict(states[r])
        s.set_epoch(CHILD_EPOCH)
        assert head[r] + list(loader) == full[r]

    # 2 -> 3 ranks from the same checkpoint: every sample exactly once
    sampler_state = loader_sampler_state(states[0])
    rest = []
    for s in _samplers(lens, 3, KW):
        s.load_state_dict(sampler_state)
        s.set_epoch(CHILD_EPOCH)
        rest.append(list(s))
    assert len({len(x) for x in rest}) == 1
    _assert_exactly_once(head[0] + head[1] + [b for x in rest for b in x], lens)



# ---------------------------------------------------------------- bad states

BAD_STATES = [
    ("yielded", "abc", "yielded must be a whole number, got 'abc'"),
    ("yielded", None, "yielded must be a whole number, got None"),
    ("yielded", 2.7, "yielded must be a whole number, got 2.7"),
    ("yielded", True, "yielded must be a whole number, got True"),
    ("yielded", -1, "yielded must be >= 0, got -1"),
    ("epoch", 2.9, "epoch must be a whole number, got 2.9"),
    ("epoch", -1, "epoch must be >= 0, got -1"),
    ("seed", "7", "seed must be a whole number"),
    ("world_size", 0, "world_size must be >= 1"),
    ("grad_accum", 1.5, "grad_accum must be a whole number"),
    ("num_samples", -4, "num_samples must be >= 1"),
    ("fingerprint", -3, r"fingerprint must be in \[0, 4294967296\)"),
    ("lengths_crc", 2**40, "lengths_crc must be in"),
    ("options", "x", "options must map option names"),
    ("options", {"max_tokens": 4096}, "options must map option names"),
    ("resumed", None, "resumed must be a list of"),
    ("resumed", [[2, 2]], r"resumed\[0\] must be a \[world_size, grad_accum, yielded\] triple"),
    ("resumed", [[2, 2, -5]], r"resumed\[0\] yielded must be >= 0, got -5"),
    ("resumed", [[0, 2, 5]], r"resumed\[0\] world_size must be >= 1"),
    ("resumed", [[2, 2, "5"]], r"resumed\[0\] yielded must be a whole number"),
    ("version", 3, "version 3 is not supported"),
    ("version", True, "version True is not supported"),
    ("version", 1, r"^sampler state version 1 is from an older lengthwise, which this version "
                   r"does not read \(it reads version 2\); start the epoch over with "
                   r"set_epoch\(\)$"),
]


@pytest.mark.parametrize(("key", "value", "match"), BAD_STATES)
def test_every_key_of_a_state_is_checked(key, value, match):
    from lengthwise.pytorch.sampler import ResumeError

    lens = _lengths(600)
    a = BucketBatchSampler(lens, FAST, num_replicas=2, rank=0, seed=SEED)
    _take(a, 3)
    state = dict(a.state_dict(), **{key: value})
    fresh = BucketBatchSampler(lens, FAST, num_replicas=2, rank=0, seed=SEED)
    with pytest.raises(ResumeError, match=match):
        fresh.load_state_dict(state)
    assert fresh.epoch == 0 and fresh.remaining() == len(fresh)  # left as it was


def test_counts_that_do_not_fit_the_epoch_name_their_key():
    from lengthwise.pytorch.sampler import ResumeError

    lens = _lengths(600)
    a = BucketBatchSampler(lens, FAST, num_replicas=2, rank=0, seed=SEED)
    _take(a, 3)
    state = a.state_dict()
    n = len(a)
    with pytest.raises(ResumeError, match=rf"the state's yielded says 999 .* only {n} per rank "
                                          "with world_size 2 and grad_accum 2"):
        BucketBatchSampler(lens, FAST, num_replicas=2, rank=0, seed=SEED).load_state_dict(
            dict(state, yielded=999))
    with pytest.raises(ResumeError, match=r"the state's yielded says 999 .* world_size 2"):
        BucketBatchSampler(lens, FAST, num_replicas=3, rank=0, seed=SEED).load_state_dict(
            dict(state, yielded=999))
    with pytest.raises(ResumeError, match=r"resumed\[0\] = \[4, 1, 500\] says 500"):
        BucketBatchSampler(lens, FAST, num_replicas=2, rank=0, seed=SEED).load_state_dict(
            dict(state, resumed=[[4, 1, 500]]))
    # a negative count is refused rather than re-planning a part of the epoch
    with pytest.raises(ResumeError, match="must be >= 0"):
        BucketBatchSampler(lens, FAST, num_replicas=3, rank=0, seed=SEED).load_state_dict(
            dict(state, resumed=[[4, 1, -1]]))


def test_garbled_loader_states():
    from lengthwise.pytorch.sampler import ResumeError

    with pytest.raises(ResumeError, match="a StatefulDataLoader state is a dict"):
        loader_sampler_state(None)
    with pytest.raises(ResumeError, match="not a StatefulDataLoader state"):
        loader_sampler_state({"_snapshot": {}})
    with pytest.raises(ResumeError, match="yielded must be a whole number"):
        loader_sampler_state({"_index_sampler_state": {"yielded": "abc"}})


def test_seed_and_epoch_are_named():
    with pytest.raises(ValueError, match="seed must be a non-negative whole number"):
        BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4), seed=-1)
    s = BucketBatchSampler(_lengths(100), PlanConfig(batch_size=4))
    with pytest.raises(ValueError, match="epoch must be a non-negative whole number"):
        s.set_epoch(-1)
    with pytest.raises(TypeError, match="epoch must be a whole number, got 2.9"):
        s.set_epoch(2.9)
    with pytest.raises(ValueError, match="seed must be a non-negative"):
        plan_epoch(_lengths(100), PlanConfig(batch_size=4), seed=-1)
    with pytest.raises(ValueError, match="epoch must be a non-negative"):
        plan_epoch(_lengths(100), PlanConfig(batch_size=4), epoch=-1)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
