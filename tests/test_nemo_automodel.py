"""lengthwise in NeMo Automodel's loader (``batch_sampler_config``) and its step scheduler."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

pytest.importorskip("torch")
loader_module = pytest.importorskip("nemo_automodel.components.datasets.loader")
from nemo_automodel.components.training.step_scheduler import StepScheduler  # noqa: E402

from lengthwise.nemo import EpochBatchSampler, LengthwiseSamplerConfig  # noqa: E402
from lengthwise.planning.config import PlanConfig  # noqa: E402


@pytest.fixture(autouse=True)
def keep_start_method():
    """NeMo's loader sets the process-wide start method to spawn; the other tests keep theirs."""
    before = multiprocessing.get_start_method(allow_none=True)
    yield
    multiprocessing.set_start_method(before, force=True)


LENGTHS = np.random.default_rng(4).integers(2, 80, 200)
PLAN = PlanConfig(max_tokens=320, grad_accum=2)


def _loader(rank, world=2):
    data = [{"index": i} for i in range(LENGTHS.size)]
    sampler = LengthwiseSamplerConfig(LENGTHS, PLAN, {"seed": 9}).build(
        dataset_len=len(data), rank=rank, world_size=world)
    return loader_module.ParallelAwareDataloader(
        data, dp_rank=rank, dp_world_size=world, batch_size=None, batch_sampler=sampler,
        collate_fn=lambda items: [x["index"] for x in items])


def _scheduler(loader):
    return StepScheduler(global_batch_size=4, local_batch_size=1, dp_size=2, dataloader=loader,
                         num_epochs=3, preemption_signal=None)


def test_every_sample_once_per_epoch_under_the_step_scheduler():
    loaders = [_loader(r) for r in range(2)]
    assert all(isinstance(x.batch_sampler, EpochBatchSampler) for x in loaders)
    epochs: list[list[list[int]]] = [[], [], []]  # per epoch, per rank: the indices in order
    for loader in loaders:
        scheduler = _scheduler(loader)
        for epoch in scheduler.epochs:
            scheduler.set_epoch(epoch)  # reaches loader.sampler only, as NeMo's recipes do
            epochs[epoch].append([i for step in scheduler for batch in step for i in batch])
    for ranks in epochs:
        assert sorted(ranks[0] + ranks[1]) == list(range(LENGTHS.size))
    assert epochs[0][0] != epochs[1][0] != epochs[2][0]  # each epoch planned anew
    for batch in loaders[0].batch_sampler:
        assert len(batch) * int(LENGTHS[batch].max()) <= PLAN.max_tokens


@pytest.mark.parametrize("stop", [3, "end"])
def test_stateful_loader_resumes(stop):
    loader = _loader(rank=1)
    whole = [list(loader), list(loader)]  # epochs 0 and 1
    loader = _loader(rank=1)
    it = iter(loader)
    done = len(whole[0]) if stop == "end" else stop
    taken = [next(it) for _ in range(done)]
    state = loader.state_dict()
    fresh = _loader(rank=1)
    fresh.load_state_dict(state)
    rest = list(fresh)
    if stop == "end":  # a state saved at the end of epoch 0 continues with epoch 1
        assert taken == whole[0] and rest == whole[1]
    else:
        assert taken + rest == whole[0]
        assert list(fresh) == whole[1]


def test_the_data_set_size_is_checked():
    with pytest.raises(ValueError, match="lengths for 200 samples but the dataset has 10 rows"):
        LengthwiseSamplerConfig(LENGTHS, PLAN, {"seed": 9}).build(dataset_len=10, rank=0,
                                                              world_size=1)
