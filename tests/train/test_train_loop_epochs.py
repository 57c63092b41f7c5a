"""The training loop across epochs: each epoch's plan gives the logger its bucket shares."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lengthwise.train import bucket_token_shares  # noqa: E402
from lengthwise.train.config import LoopConfig  # noqa: E402
from lengthwise.train.loop import MicroOut, TrainLoop, make_sampler  # noqa: E402


class _MeanTask:
    """A one-weight model whose loss is the squared weight times the real tokens."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 1, bias=False)

    def prepare(self, batch, rows, step):
        return batch

    def normaliser(self, prepared) -> float:
        return float(prepared["real_tokens"])

    def forward(self, net, prepared) -> MicroOut:
        loss = net.weight.square().sum() * float(prepared["real_tokens"])
        return MicroOut(loss=loss, norm=float(prepared["real_tokens"]))

    def step_fields(self, stats):
        return {}


def test_random_order_buckets_that_first_appear_in_a_later_epoch_are_logged(tmp_path):
    # ``random`` labels a micro-batch by its longest sample: epoch 0 of this data holds no
    # micro-batch of bucket 0 or 1, epoch 1 does (the loop once kept epoch 0's shares and
    # stopped with "bucket 0 has no entry in bucket_shares")
    lengths = np.random.default_rng(0).integers(5, 190, size=300)
    cfg = LoopConfig(steps=40, max_tokens=512, max_len=192, grad_accum=4, progress=False)
    sampler = make_sampler("random", lengths, cfg)
    shares = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        shares.append(set(bucket_token_shares(sampler.plan)))
    assert shares[1] - shares[0], "the data no longer shows the case"
    loop = TrainLoop(_MeanTask(), "random", lengths, lambda i: {"input_ids": [1] * lengths[i]},
                     cfg, run_dir=tmp_path, device=torch.device("cpu"))
    try:
        while not loop.done:
            loop.step()
    finally:
        loop.close()
    log = (tmp_path / "train_log.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in log]
    records = [r for r in records if "step" in r and "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 41))
    assert max(r["epoch"] for r in records) >= 1
    seen = {int(b) for r in records for b in r["bucket_loss"]}
    assert seen - shares[0]  # a bucket epoch 0's plan does not hold was logged
    assert all(np.isfinite(r["corrected_loss"]) for r in records if r.get("corrected_loss"))
