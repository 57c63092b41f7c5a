"""A simulated world of ranks in one process, and rank 0's per-micro-batch log beside the step log.

The doctor reads both views of one run: on the per-micro-batch log of bucket-random (one
micro-batch, from one bucket, per line) it finds a level per bucket and says they are the
composition of the logged micro-batch; on the step log of stratified and interleave it finds
no bands.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lengthwise.doctor import diagnose  # noqa: E402
from lengthwise.train.config import LoopConfig  # noqa: E402
from lengthwise.train.loop import MicroOut, TrainLoop, make_sampler  # noqa: E402
from lengthwise.train.simulated import simulated_sampler  # noqa: E402

LEVEL = 0.25  # loss per token added by each bucket above the shortest


class _BucketTask:
    """A one-weight model whose loss per token is its squared weight, plus a level set by the
    micro-batch's length bucket, plus noise drawn from the step and the samples."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.constant_(self.model.weight, 1.0)

    def prepare(self, batch, rows, step):
        ids = sorted(i for row in rows for i in row)
        noise = np.random.default_rng([step, *ids[:4]]).normal(0, 0.05)
        return {"tokens": float(batch["real_tokens"]),
                "level": LEVEL * max(int(batch.get("bucket", 0)), 0) + noise}

    def normaliser(self, prepared) -> float:
        return prepared["tokens"]

    def forward(self, net, prepared) -> MicroOut:
        per_token = net.weight.square().sum() + prepared["level"]
        return MicroOut(loss=per_token * prepared["tokens"], norm=prepared["tokens"])

    def step_fields(self, stats):
        return {}


def _lengths(n: int = 1200) -> np.ndarray:
    return np.clip(np.random.default_rng(0).lognormal(3.4, 0.9, n).astype(int), 8, 256)


def _cfg(steps: int, **kw) -> LoopConfig:
    return LoopConfig(steps=steps, grad_accum=8, max_tokens=512, max_len=256, buckets=4,
                      lr=1e-3, progress=False, **kw)


def test_each_step_holds_every_simulated_ranks_micro_batches_rank_by_rank():
    lengths = _lengths()
    cfg = _cfg(10)
    world = simulated_sampler("bucket-random", lengths, cfg, world=4)
    ranks = [list(make_sampler("bucket-random", lengths, LoopConfig(
        steps=10, grad_accum=2, max_tokens=512, max_len=256, buckets=4, progress=False),
        rank=r, world=4, check_world_size=False)) for r in range(4)]
    got = list(world)
    assert len(got) == 4 * len(ranks[0])
    for k, batch in enumerate(got):
        assert batch == ranks[k % 4][k // 4]
    seen = sorted(i for batch in got for row in batch for i in row)
    assert seen == list(range(lengths.size))  # every sample once per epoch


def test_grad_accum_must_split_over_the_simulated_ranks():
    from lengthwise.errors import ConfigError

    with pytest.raises(ConfigError, match="multiple of the simulated world size 3"):
        simulated_sampler("random", _lengths(), _cfg(2), world=3)


def _train(order: str, steps: int, tmp_path, world: int = 8):
    lengths = _lengths()
    cfg = _cfg(steps)
    loop = TrainLoop(_BucketTask(), order, lengths, lambda i: {"input_ids": [1] * lengths[i]},
                     cfg, run_dir=tmp_path / order, device=torch.device("cpu"),
                     sampler=simulated_sampler(order, lengths, cfg, world=world),
                     micro_log=True, micro_ranks=world)
    records = []
    try:
        while not loop.done:
            records.append(loop.step())
    finally:
        loop.close()
    return records, tmp_path / order / "train_log.jsonl", tmp_path / order / "micro_log.jsonl"


def _lines(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if "event" not in r], [r for r in rows if "event" in r]


def test_the_micro_log_holds_rank_0s_micro_batches_beside_the_step_loss(tmp_path):
    records, step_log, micro_log = _train("bucket-random", 6, tmp_path, world=4)
    micro, events = _lines(micro_log)
    assert events[0]["view"] == "micro-batch" and events[0]["world_size"] == 4
    # grad_accum 8 over 4 ranks: rank 0 logs 2 micro-batches per optimizer step
    assert [r["step"] for r in micro] == list(range(1, 13))
    assert [r["optimizer_step"] for r in micro] == [s for s in range(1, 7) for _ in (0, 1)]
    assert all(r["micro_batches"] == 1 and len(r["buckets"]) == 1 for r in micro)
    steps, _ = _lines(step_log)
    assert all(r["micro_batches"] == 8 for r in steps)
    for rec in records:  # the step loss weighs every micro-batch of every rank by its tokens
        mine = [r for r in micro if r["optimizer_step"] == rec["step"]]
        assert sum(r["real_tokens"] for r in mine) < rec["real_tokens"]


@pytest.mark.slow
def test_the_doctor_reads_both_views(tmp_path):
    _, _, micro_log = _train("bucket-random", 240, tmp_path)
    report = diagnose(str(micro_log))
    cause = report.verdict.causes[0]
    assert cause.name == "micro_batch_bands"
    assert "composition of the logged micro-batch" in cause.claim
    assert "log the optimizer step's loss instead" in cause.fix[0]
    ranges = report.attribution.levels.ranges
    assert [r["buckets"] for r in ranges] == [[b, b] for b in range(4)]  # one level per bucket
    offsets = [r["mean_offset"] for r in ranges]
    assert offsets == sorted(offsets)  # rising with the bucket
    for r in ranges:
        assert any(f"(bucket {r['buckets'][0]}): mean loss" in line for line in cause.evidence)
    for order in ("stratified", "interleave"):
        _, step_log, _ = _train(order, 240, tmp_path)
        step_report = diagnose(str(step_log))
        assert (step_report.bands.count or 0) <= 1, order
        assert "micro_batch_bands" not in [c.name for c in step_report.verdict.causes]
