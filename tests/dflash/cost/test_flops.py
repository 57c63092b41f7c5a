"""The DFlash step's FLOPs per micro-batch, read from its modules, and its cost model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.cost.flops import StepFlops, anchor_counts, batch_flops
from lengthwise.dflash.objective import IGNORE, anchor_quota, sample_anchors

REF = StepFlops.reference()


def test_the_reference_shape_counts_a_qwen3_8b_target_and_a_five_layer_draft():
    """The units read from the modules are the weights a Qwen3 layer's formula gives."""
    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288  # attention, SwiGLU
    assert layer == 192_937_984
    fc = 5 * 4096 * 4096
    assert 1.04e9 < 5 * layer + fc < 1.06e9  # the draft's ~1.05 B trainable parameters
    assert REF.target_token == 2 * 36 * layer  # a forward only: the target is frozen
    assert REF.slot == 3 * 2 * 5 * layer  # forward and backward
    assert REF.head == 3 * 2 * 4096 * 151936
    assert REF.target_pair == 4 * 4096 * 36 and REF.block_size == 16


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 3000), share=st.floats(0.0, 1.0), seed=st.integers(0, 2**16),
       max_slots=st.sampled_from([None, 32768, 4096]))
def test_anchor_counts_are_the_anchors_a_step_draws(n, share, seed, max_slots):
    rng = np.random.default_rng(seed)
    mask = rng.random(n) < share
    pairs = int(np.count_nonzero(mask[:-1] & mask[1:]))
    quota = anchor_quota(n, num_anchors=512, block_size=16, max_slots=max_slots,
                         max_tokens=16384)
    drawn = sample_anchors(mask, num_anchors=quota, seed=seed, step=3, sample_id=7).size
    counted = anchor_counts(np.array([n]), num_anchors=512, block_size=16,
                            max_slots=max_slots, max_tokens=16384, pairs=np.array([pairs]))
    assert counted.tolist() == [drawn]
    if share == 1.0:  # every token supervised: the default pairs
        assert anchor_counts(np.array([n]), num_anchors=512, block_size=16,
                             max_slots=max_slots, max_tokens=16384).tolist() == [drawn]


def test_batch_flops_adds_every_term_of_the_formula():
    f = StepFlops(target_token=1.0, target_pair=2.0, context_token=3.0, slot=5.0,
                  slot_key=7.0, head=11.0, block_size=2)
    lens = np.array([4, 2, 6])
    anchors = np.array([3, 1, 0])
    got = batch_flops(f, lens, np.array([0, 1, 2]), np.array([0, 2, 3]), anchors,
                      pad_multiple=4)
    # batch 0: 2 rows padded to 4, widest row 3 anchors; batch 1: 1 row of 8 (6 rounded up)
    keys = 3 * 2 * (4 / 2 + 2) + 1 * 2 * (2 / 2 + 2)
    first = 2 * 4 * (1 + 3) + 2 * 4 * 5 / 2 * 2 + 2 * 3 * 2 * 5 + keys * 7 + (3 + 1) * 1 * 11
    second = 8 * 4 + 8 * 9 / 2 * 2
    assert got.tolist() == pytest.approx([first, second])


def test_the_cost_model_prices_a_row_as_the_formula_does_but_the_draft_attention():
    model = REF.cost_model(num_anchors=512, max_slots=32768, max_tokens=16384)
    for n in (800, 4096, 9000):
        a = anchor_counts(np.array([n]), num_anchors=512, block_size=16, max_slots=32768,
                          max_tokens=16384)
        one = batch_flops(REF, np.array([n]), np.array([0]), np.array([0, 1]), a)[0]
        keys = a[0] * 16 * (n / 2 + 16)
        # the model counts (B-1)/B of the slots as supervised, the formula A*(B-1): equal
        assert model.row_cost(n) == pytest.approx(one - keys * REF.slot_key, rel=1e-12)
    assert model.cap == 4096
    no_limit = REF.cost_model(num_anchors=512, max_slots=None, max_tokens=16384)
    assert no_limit.cap == 512 and no_limit.d == pytest.approx(16 * model.d / 2)


def test_the_flops_module_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, lengthwise.dflash.cost.flops; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    assert IGNORE == -100
