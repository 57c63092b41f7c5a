"""The DFlash training loop: loss normalised over ranks and micro-steps, exact resume (gloo DDP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _dflash_run import build_loop, config, copy_checkpoint, train
from _ports import free_port

torch = pytest.importorskip("torch")
HERE = Path(__file__).resolve().parent




class _BothRanks:
    """Both ranks' micro-batches of a 2-rank step, for one process."""

    def __init__(self, cfg):
        import numpy as np
        from _dflash_run import data

        from lengthwise.train.loop import StepBatches, make_sampler

        lengths = data().lengths
        half = type(cfg)(**{**cfg.__dict__, "grad_accum": cfg.grad_accum // 2})
        self.parts = [StepBatches(make_sampler("stratified", np.asarray(lengths), half,
                                               rank=r, world=2), half.grad_accum)
                      for r in (0, 1)]

    def next(self):
        return [b for part in self.parts for b in part.next()]


def _one_process_on_the_global_batch(tmp_path):
    cfg = config(grad_accum=4)
    loop = build_loop(cfg, tmp_path / "single")
    loop.batches = _BothRanks(cfg)
    try:
        recs = [loop.step() for _ in range(cfg.steps)]
    finally:
        loop.close()
    return [(r["step"], r["loss"], r["accuracy"]) for r in recs]


@pytest.mark.slow
def test_ddp_loss_equals_one_process_and_resume_is_exact(tmp_path):
    out = tmp_path / "ddp.json"
    port = str(free_port())
    src = str(Path(__file__).resolve().parents[2] / "src")
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "_dflash_run.py"), str(out)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = [p.communicate(timeout=240)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    got = json.loads(out.read_text())
    full, resumed = got["full"], got["resumed"]
    single = _one_process_on_the_global_batch(tmp_path)
    assert [s for s, _, _ in full] == [1, 2, 3, 4]
    for (_, a, acc_a), (_, b, acc_b) in zip(full, single, strict=True):
        assert a == pytest.approx(b, rel=1e-4)
        assert acc_a == pytest.approx(acc_b, abs=1e-9)
    assert [s for s, _, _ in resumed] == [3, 4]
    assert resumed == full[2:]  # bit-identical after resuming from the step-2 checkpoint
    # a checkpoint written by 2 ranks (torch.distributed.checkpoint) exports in one process
    from lengthwise.dflash.export import export_checkpoint
    from lengthwise.dflash.load import load_draft_checkpoint

    step = tmp_path / "full" / "checkpoints" / "step_4"
    assert json.loads((step / "draft_config.json").read_text())["draft"]["block_size"] == 4
    exported = export_checkpoint(tmp_path / "full", tmp_path / "exported")
    from safetensors.torch import load_file

    weights = load_file(str(exported / "model.safetensors"))
    draft = load_draft_checkpoint(step)
    assert weights["hidden_norm.weight"].equal(draft.context_norm.weight)
    assert weights["fc.weight"].equal(draft.fc.weight)


def test_single_process_resume_and_packed_order(tmp_path):
    full = train(config(steps=4, checkpoint_every=2), tmp_path / "a", order="packed")
    copy_checkpoint(tmp_path / "a", tmp_path / "b", step=2)
    resumed = train(config(steps=4, checkpoint_every=2, resume=True), tmp_path / "b",
                    order="packed")
    assert resumed == full[2:]
    losses = [loss for _, loss, _ in full]
    assert all(0 < x < 10 for x in losses)


def test_per_sample_losses_average_back_to_the_micro_batch_loss(tmp_path):
    """What ``StepLogger.record_micro(sample_losses=...)`` gets: each sample's weighted mean."""
    loop = build_loop(config(), tmp_path / "s", order="packed")
    try:
        rows = loop.batches.next()[0]
        batch = loop.collate([[loop.sample(i) for i in row] for row in rows])
        blocks = loop.task.prepare(batch, rows, 0)
        with torch.no_grad():
            out = loop.task.forward(loop.task.model, blocks)
        ids = blocks.sample_ids.reshape(-1)
        w = blocks.weights.sum(dim=-1).reshape(-1)
        per_sample = [float(w[(ids == s) & (w > 0)].sum())
                      for s in sorted(set(ids[w > 0].tolist()))]
        assert len(out.sample_losses) == len(per_sample) > 1
        total = sum(x * y for x, y in zip(out.sample_losses, per_sample, strict=True))
        assert total == pytest.approx(float(out.loss), rel=1e-5)
        assert out.sample_weights == pytest.approx(per_sample, rel=1e-5)
    finally:
        loop.close()


@pytest.mark.parametrize("field", ["block_size", "draft_layers", "num_anchors"])
def test_a_count_that_is_a_bool_is_named(field):
    from lengthwise.dflash.train_config import DFlashTrainConfig

    with pytest.raises(ValueError, match=f"{field} must be a positive integer, got True"):
        DFlashTrainConfig(**{field: True})
