"""``max_slots``: no planned micro-batch holds more draft slots, whatever the order or layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from lengthwise.dflash.blocks import make_blocks  # noqa: E402
from lengthwise.dflash.objective import IGNORE, anchor_quota, sample_anchors  # noqa: E402
from lengthwise.dflash.train_config import DFlashTrainConfig  # noqa: E402
from lengthwise.errors import ConfigError, DataError  # noqa: E402
from lengthwise.train.loop import make_collator, make_sampler  # noqa: E402


def _samples(lengths: np.ndarray, seed: int, supervised: float) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = rng.integers(1, 50, int(n)).tolist()
        keep = rng.random(int(n)) < supervised
        labels = [t if k else IGNORE for t, k in zip(ids, keep, strict=True)]
        out.append({"input_ids": ids, "labels": labels})
    return out


def _micro_batches(order: str, samples: list[dict], cfg: DFlashTrainConfig):
    lengths = np.array([len(s["input_ids"]) for s in samples])
    sampler = make_sampler(order, lengths, cfg)
    collate = make_collator(order, cfg, sampler)
    for rows in sampler:
        yield rows, collate([[samples[i] for i in row] for row in rows])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), n=st.integers(16, 40), max_len=st.integers(8, 40),
       rows=st.integers(1, 4), block=st.integers(2, 6), anchors=st.integers(1, 40),
       share=st.floats(0.001, 1.0), supervised=st.floats(0.3, 1.0),
       order=st.sampled_from(["random", "stratified", "packed"]))
def test_no_micro_batch_holds_more_than_max_slots(seed, n, max_len, rows, block, anchors,
                                                  share, supervised, order):
    max_tokens = rows * max_len
    max_slots = max(block, int(share * block * max_tokens))
    cfg = DFlashTrainConfig(steps=1, grad_accum=1, max_tokens=max_tokens, max_len=max_len,
                            block_size=block, num_anchors=anchors, max_slots=max_slots,
                            seed=seed, warmup=0)
    rng = np.random.default_rng(seed)
    samples = _samples(rng.integers(1, 2 * max_len, n), seed, supervised)
    capacity = max_len if order == "packed" else None
    for step, (batch_rows, batch) in enumerate(_micro_batches(order, samples, cfg)):
        blocks = make_blocks(batch, batch_rows, step=step, seed=seed, num_anchors=anchors,
                             block_size=block, gamma=1.0, capacity=capacity,
                             max_slots=cfg.slot_budget, max_tokens=max_tokens)
        assert blocks.slots <= max_slots
        assert blocks.slots <= blocks.slot_capacity
        # each sample's anchors are its own draw under its own quota, whatever its companions
        ids = blocks.sample_ids.numpy()
        starts = blocks.starts.numpy()
        labels = batch["labels"].reshape(blocks.input_ids.shape).numpy()
        for i in {int(x) for x in ids[ids >= 0]}:
            length = min(len(samples[i]["input_ids"]), max_len)
            r, k = np.argwhere(ids == i)[0]
            start = int(starts[r, k])
            mask = labels[r, start:start + length] != IGNORE  # as collated
            quota = anchor_quota(length, num_anchors=anchors, block_size=block,
                                 max_slots=max_slots, max_tokens=max_tokens)
            want = sample_anchors(mask, num_anchors=quota, seed=seed, step=step, sample_id=i)
            got = (blocks.anchors.numpy() - starts)[ids == i]
            assert sorted(got.tolist()) == want.tolist()


def test_the_cap_binds_at_the_reference_proportions():
    """512 anchors of blocks of 16 would hold far more slots than the budget; the cap holds."""
    cfg = DFlashTrainConfig(steps=1, grad_accum=1, max_tokens=1024, max_len=512,
                            block_size=16, num_anchors=512, max_slots=2048, warmup=0)
    samples = _samples(np.full(8, 256), 0, 1.0)
    uncapped, capped = [], []
    for rows, batch in _micro_batches("stratified", samples, cfg):
        kw = dict(step=0, seed=0, num_anchors=512, block_size=16, gamma=7.0)
        uncapped.append(make_blocks(batch, rows, **kw).slots)
        capped.append(make_blocks(batch, rows, **kw, max_slots=2048, max_tokens=1024).slots)
    assert max(uncapped) > 2048 >= max(capped) > 0


def test_a_micro_batch_over_the_token_budget_is_refused():
    samples = _samples(np.array([30, 30]), 0, 1.0)
    from lengthwise.pytorch.collate import PadCollator

    batch = PadCollator(pad_token_id=0)(samples)
    with pytest.raises(DataError, match="max_tokens=40"):
        make_blocks(batch, [[0], [1]], step=0, seed=0, num_anchors=4, block_size=4, gamma=1.0,
                    max_slots=64, max_tokens=40)


@pytest.mark.parametrize("value", [0, 3, 2.5])
def test_a_max_slots_that_holds_no_block_is_named(value):
    with pytest.raises(ConfigError, match="max_slots"):
        DFlashTrainConfig(block_size=4, max_slots=value)


def test_the_default_slot_budget_is_what_a_micro_batch_can_hold():
    assert DFlashTrainConfig(block_size=4, max_tokens=512).slot_budget == 4 * 512
