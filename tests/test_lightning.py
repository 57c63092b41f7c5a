"""PyTorch Lightning: the sampler survives Lightning's rebuild, epochs change, resume is exact.

The slow tests run ``tests/_lightning_run.py``: real 2-process DDP on the CPU (gloo).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from lightning.fabric.utilities.data import (  # noqa: E402
    _dataloader_init_kwargs_resolve_sampler,
    _set_sampler_epoch,
)
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from lengthwise.errors import ConfigError  # noqa: E402
from lengthwise.lightning import LengthwiseCallback, LightningBatchSampler  # noqa: E402
from lengthwise.planning.config import PlanConfig  # noqa: E402
from lengthwise.pytorch.sampler import BucketBatchSampler  # noqa: E402

LENGTHS = np.random.default_rng(0).integers(1, 50, 64)
RUN = Path(__file__).with_name("_lightning_run.py")


def _rebuilt(sampler, num_replicas=2, rank=1):
    """What Lightning's default use_distributed_sampler=True makes of the loader's batch sampler."""
    loader = DataLoader(range(LENGTHS.size), batch_sampler=sampler)
    dist = DistributedSampler(range(LENGTHS.size), num_replicas=num_replicas, rank=rank)
    return _dataloader_init_kwargs_resolve_sampler(loader, dist)["batch_sampler"]


def test_lightning_rebuilds_the_sampler_with_its_options_and_the_ranks():
    sampler = LightningBatchSampler(LENGTHS, PlanConfig(max_tokens=128), seed=4)
    new = _rebuilt(sampler)
    assert type(new) is LightningBatchSampler and new is not sampler
    assert (new.num_replicas, new.rank) == (2, 1)
    assert new.config == LightningBatchSampler(LENGTHS, PlanConfig(max_tokens=128), seed=4,
                                               num_replicas=2, rank=1).config
    twin = BucketBatchSampler(LENGTHS, PlanConfig(max_tokens=128), seed=4, num_replicas=2, rank=1)
    assert list(new) == list(twin)
    # Lightning sets the epoch through loader.batch_sampler.sampler
    _set_sampler_epoch(DataLoader(range(LENGTHS.size), batch_sampler=new), 3)
    assert new.epoch == 3


def test_plan_options_as_keywords_sample_and_rebuild_as_their_config(plan_keywords):
    def build(config, **keywords):
        sampler = LightningBatchSampler(LENGTHS, config, seed=4, **keywords)
        return list(sampler), list(_rebuilt(sampler))

    plan_keywords(build, "LightningBatchSampler", max_tokens=128, grad_accum=2)


def test_given_ranks_must_agree_with_lightnings():
    with pytest.raises(ConfigError, match="num_replicas=4 was given, but Lightning's "
                                         "DistributedSampler has num_replicas=2"):
        _rebuilt(LightningBatchSampler(LENGTHS, PlanConfig(batch_size=4), num_replicas=4, rank=0))


def test_a_plain_sampler_names_the_fix():
    with pytest.raises(ConfigError, match="use_distributed_sampler=False") as err:
        _rebuilt(BucketBatchSampler(LENGTHS, PlanConfig(batch_size=4)))
    assert "LightningBatchSampler" in str(err.value) and "\n" not in str(err.value)


def test_callback_state_counts_trained_batches_not_fetched_ones():
    sampler = BucketBatchSampler(LENGTHS, PlanConfig(max_tokens=128))
    loader = DataLoader(range(LENGTHS.size), batch_sampler=sampler)
    progress = type("P", (), {"processed": 2})
    trainer = type("T", (), {"train_dataloader": loader, "current_epoch": 0})()
    trainer.fit_loop = type("F", (), {"epoch_loop": type("E", (), {
        "batch_progress": type("B", (), {"current": progress})})})
    callback = LengthwiseCallback()
    callback.setup(trainer, None, "fit")
    it = iter(sampler)
    fetched = [next(it) for _ in range(3)]  # the loop trained 2, fetched one ahead
    state = callback.state_dict()["sampler"]
    assert state["yielded"] == 2
    again = BucketBatchSampler(LENGTHS, PlanConfig(max_tokens=128))
    again.load_state_dict(state)
    assert next(iter(again)) == fetched[2]


def test_a_positional_size_is_refused_naming_the_config():
    with pytest.raises(TypeError, match="config must be a lengthwise.PlanConfig, got 8"):
        LightningBatchSampler(LENGTHS, 8)


class _Ranks:
    """A sampler that has ranks, as a DistributedSampler has (of any integer type)."""

    def __init__(self, num_replicas, rank):
        self.num_replicas, self.rank = num_replicas, rank


def test_numpy_integer_ranks_are_taken_over_and_others_named():
    s = LightningBatchSampler(LENGTHS, PlanConfig(max_tokens=256),
                              sampler=_Ranks(np.int64(2), np.int64(1)))
    assert (s.num_replicas, s.rank) == (2, 1) and type(s.rank) is int
    with pytest.raises(ConfigError, match=r"^sampler=_Ranks has rank=1\.0 \(float\), not an "
                                          r"integer$"):
        LightningBatchSampler(LENGTHS, PlanConfig(max_tokens=256), sampler=_Ranks(2, 1.0))
    with pytest.raises(ConfigError, match="^sampler=object has no num_replicas"):
        LightningBatchSampler(LENGTHS, PlanConfig(max_tokens=256), sampler=object())


def test_a_checkpoint_state_of_another_shape_says_what_it_has_and_misses():
    from lengthwise.pytorch.sampler_state import ResumeError

    sampler = LightningBatchSampler(LENGTHS, PlanConfig(max_tokens=256))
    loader = DataLoader(range(LENGTHS.size), batch_sampler=sampler)
    trainer = type("T", (), {"train_dataloader": loader, "current_epoch": 0})()
    callback = LengthwiseCallback()
    callback.setup(trainer, None, "fit")
    callback.load_state_dict({"sampler": {"epoch": "x", "yielded": -4}})
    with pytest.raises(ResumeError) as err:
        callback.on_train_start(trainer, None)
    assert str(err.value).startswith(
        "the checkpoint's LengthwiseCallback state: not a BucketBatchSampler state (what "
        "state_dict() saves): it has ['epoch', 'yielded'], missing ['version', 'seed', ")
    assert "\n" not in str(err.value)
    with pytest.raises(ResumeError, match="^the checkpoint's LengthwiseCallback state is a dict "
                                          r"\(what state_dict\(\) saves\), got list$"):
        callback.load_state_dict(["sampler"])


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``_lightning_run.py`` with ``args``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")}
    src = str(Path(__file__).parents[1] / "src")
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([src, env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(RUN), str(out), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def _launch(out: Path, *args: str, ranks: int = 2) -> list[dict]:
    """Run ``_lightning_run.py`` with ``args``; what each rank trained."""
    proc = _run(out, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"{args[0]}_rank{r}.json").read_text()) for r in range(ranks)]


def _check_epochs(ranks: list[dict]) -> None:
    sys.path.insert(0, str(RUN.parent))
    from _lightning_run import EPOCHS, LENGTHS, MAX_TOKENS

    firsts = []
    for epoch in range(EPOCHS):
        steps = [[s for s in r["seen"] if s["epoch"] == epoch] for r in ranks]
        assert len(steps[0]) == len(steps[1]) > 0  # the ranks take the same number of steps
        trained = sorted(i for rank in steps for s in rank for i in s["idx"])
        assert trained == list(range(LENGTHS.size))  # every sample once per epoch
        assert max(s["tokens"] for rank in steps for s in rank) <= MAX_TOKENS
        firsts.append(steps[0][0]["idx"])
    assert firsts[0] != firsts[1]  # each epoch's batches are planned anew
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.slow
def test_ddp_with_default_settings_then_resume_mid_epoch(tmp_path):
    full = _launch(tmp_path, "default")
    _check_epochs(full)
    resumed = _launch(tmp_path, "resume", str(tmp_path / "ckpt" / "step=3.ckpt"))
    for before, after in zip(full, resumed, strict=True):
        assert 3 < len(before["seen"]) // 2  # step 3 is inside epoch 0
        assert after["seen"] == before["seen"][3:]  # the next planned micro-batch on
        assert after["weights"] == before["weights"]  # bit-identical


@pytest.mark.slow
def test_ddp_without_distributed_sampler_changes_epochs(tmp_path):
    _check_epochs(_launch(tmp_path, "nodist"))


@pytest.mark.slow
def test_sampler_built_before_fit_without_distributed_sampler_is_refused(tmp_path):
    """Not rebuilt by Lightning, no callback: every rank would train every sample."""
    proc = _run(tmp_path, "lbs-nodist")
    assert proc.returncode != 0
    assert "ConfigError" in proc.stderr and "num_replicas=1" in proc.stderr
    assert "use_distributed_sampler=False" in proc.stderr
    assert not list(tmp_path.glob("lbs-nodist_rank*.json"))  # nothing trained


@pytest.mark.slow
def test_resume_mid_epoch_with_loader_workers(tmp_path):
    """Workers fetch ahead of the checkpoint; the resumed run still trains exactly the rest."""
    [full] = _launch(tmp_path, "workers", ranks=1)
    [resumed] = _launch(tmp_path, "workers-resume", str(tmp_path / "ckpt-workers" / "step=3.ckpt"),
                        ranks=1)
    assert resumed["seen"] == full["seen"][3:]
    assert resumed["weights"] == full["weights"]

