"""The chunked LM head + cross-entropy: the dense path's loss and gradients, in bounded memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from _dflash_tiny import tiny_draft, tiny_target  # noqa: E402

from lengthwise.dflash.blocks import make_blocks  # noqa: E402
from lengthwise.dflash.head import BUFFERS, chunk_bound_bytes, chunked_cross_entropy  # noqa: E402
from lengthwise.dflash.loss import block_hidden, block_logits, block_loss, head_loss  # noqa: E402
from lengthwise.errors import ConfigError  # noqa: E402
from lengthwise.pytorch.collate import PadCollator  # noqa: E402

HERE = Path(__file__).resolve().parent


def _blocks(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for n in (21, 13, 9, 4):
        ids = torch.randint(1, 40, (n,), generator=g).tolist()
        samples.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    mb = PadCollator(pad_token_id=0, pad_multiple=1)(samples)
    return make_blocks(mb, [[0], [1], [2], [3]], step=0, seed=seed, num_anchors=5,
                       block_size=4, gamma=1.8)


def _grads(model):
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_loss_and_gradients_equal_the_dense_path(chunk):
    target = tiny_target()
    target.model.double()
    draft = tiny_draft(target).double()
    blocks = _blocks()
    dense = block_loss(block_logits(draft, target, blocks), blocks.labels, blocks.weights)
    dense.weighted.backward()
    want = _grads(draft)
    draft.zero_grad()
    got = head_loss(block_hidden(draft, target, blocks), target.lm_head, blocks.labels,
                    blocks.weights, chunk=chunk)
    got.weighted.backward()
    assert got.count == dense.count > 0 and got.correct == dense.correct
    assert float(got.weighted) == pytest.approx(float(dense.weighted), rel=1e-6, abs=1e-6)
    assert got.weight == pytest.approx(dense.weight)
    assert (got.slot_correct == dense.slot_correct).all()
    assert (got.slot_count == dense.slot_count).all()
    assert torch.allclose(got.block_ce.double(), dense.block_ce.double(), atol=1e-6)
    grads = _grads(draft)
    assert len(grads) == len(want) > 0
    for a, b in zip(grads, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), hidden=st.integers(1, 6), vocab=st.integers(2, 30),
       chunk=st.integers(1, 50), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_chunks_of_any_size_give_the_dense_loss_and_every_gradient(n, hidden, vocab, chunk,
                                                                   bias, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(vocab, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    labels = torch.randint(0, vocab, (n,), generator=g)
    weights = torch.rand(n, generator=g, dtype=torch.float64)
    logits = torch.nn.functional.linear(h, w, b)
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    dense = (ce * weights).sum()
    want = torch.autograd.grad(dense, [x for x in (h, w, b) if x is not None])
    loss, got_ce, hit = chunked_cross_entropy(h, w, b, labels, weights, chunk=chunk)
    got = torch.autograd.grad(loss, [x for x in (h, w, b) if x is not None])
    assert float(loss) == pytest.approx(float(dense), rel=1e-9, abs=1e-9)
    assert torch.allclose(got_ce.double(), ce.detach(), atol=1e-5)
    assert torch.equal(hit, logits.argmax(dim=-1) == labels)
    for a, c in zip(got, want, strict=True):
        assert torch.allclose(a, c, rtol=1e-9, atol=1e-9)


def test_a_chunk_that_is_not_a_positive_integer_is_named():
    h, w = torch.randn(2, 3), torch.randn(5, 3)
    for chunk in (0, 2.5, True):
        with pytest.raises(ConfigError, match="chunk"):
            chunked_cross_entropy(h, w, None, torch.tensor([1, 2]), torch.ones(2), chunk=chunk)


def _can_measure() -> bool:
    return sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)


def _measure(*args: object) -> dict:
    src = str(HERE.parents[1] / "src")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "_head_memory.py"), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not _can_measure(), reason="needs Linux /proc/self/clear_refs")
def test_peak_memory_at_a_151936_token_vocabulary_stays_within_the_chunk_bound():
    """Forward and backward of 1,024 slots hold a few chunks' logits, never slots x vocab."""
    rows, anchors, block, chunk, vocab, hidden = 4, 16, 16, 64, 151_936, 64
    got = _measure("head", rows, anchors, block, chunk, vocab, hidden)
    assert got["grad_finite"] and got["supervised"] > 0
    # the meter sees a known allocation of one chunk's fp32 logits
    assert got["probe_seen"] >= 0.95 * got["probe"]
    # the bound: BUFFERS fp32 chunk x vocab buffers, plus slot-sized tensors (hidden copies and
    # gradients, per-slot CE, labels, weights, indices): 8 values of 8 bytes per slot and feature
    slots = got["slots"]
    bound = chunk_bound_bytes(chunk, vocab) + 8 * 8 * slots * (hidden + 1)
    dense = slots * vocab * 4  # one fp32 copy of the dense logits alone
    assert BUFFERS * chunk * vocab * 4 == chunk_bound_bytes(chunk, vocab)
    assert got["peak"] <= bound, (got, bound)
    assert bound < dense / 5


@pytest.mark.slow
@pytest.mark.skipif(not _can_measure(), reason="needs Linux /proc/self/clear_refs")
def test_a_micro_batchs_memory_grows_with_the_vocabulary_by_at_most_the_chunk_bound():
    """A whole DFlash micro-batch (target features, draft, head, loss, backward) of 1,024 slots.

    Everything but the vocabulary is the same in both runs, so the difference of their peaks
    is what the vocabulary costs per micro-batch: at most the chunk bound, where the dense
    logits alone would take ``slots x vocabulary x 4`` bytes.
    """
    chunk, vocab = 64, 151_936
    small, big = _measure("objective", chunk, 512), _measure("objective", chunk, vocab)
    assert small["loss_finite"] and big["loss_finite"]
    assert small["slots"] == big["slots"] == 1024 and big["supervised"] > 0
    extra = big["peak"] - small["peak"]
    assert extra <= chunk_bound_bytes(chunk, vocab), (small, big)
    assert chunk_bound_bytes(chunk, vocab) < big["slots"] * vocab * 4 / 5
