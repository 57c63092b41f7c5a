"""The block-sparse flex-attention mask gives the dense mask's draft outputs (CPU, unfused)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.nn.attention.flex_attention")

from lengthwise.dflash.attention import block_flex_mask, use_flex  # noqa: E402
from lengthwise.dflash.blocks import block_attention_mask, make_blocks  # noqa: E402
from lengthwise.dflash.loss import block_hidden  # noqa: E402
from lengthwise.pytorch.collate import PackCollator, PadCollator  # noqa: E402


def _samples():
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (19, 11, 6, 3):
        ids = torch.randint(1, 40, (n,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * 2 + ids[2:]})
    return out


def test_the_flex_mask_is_the_dense_mask():
    anchors = torch.tensor([[2, 5, -1], [0, 3, 4]])
    starts = torch.tensor([[0, 0, 0], [0, 3, 3]])
    dense = block_attention_mask(anchors, starts, 7, 3)
    flex = block_flex_mask(anchors, starts, 7, 3)
    b, q, kv = torch.meshgrid(torch.arange(2), torch.arange(9), torch.arange(16), indexing="ij")
    got = flex.mask_mod(b, torch.zeros_like(b), q, kv)
    assert torch.equal(got, dense)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_flex_attention_gives_the_dense_masks_hidden_states(pair, layout):
    target, draft = pair
    samples = _samples()
    if layout == "padded":
        batch, rows, cap = PadCollator(pad_token_id=0)(samples), [[0], [1], [2], [3]], None
    else:
        batch = PackCollator(row_capacity=32, pad_to_capacity=True, pad_token_id=0,
                             return_flash_attn_kwargs=False)([samples[:2], samples[2:]])
        rows, cap = [[0, 1], [2, 3]], 32
    blocks = make_blocks(batch, rows, step=0, seed=0, num_anchors=4, block_size=4, gamma=1.8,
                         capacity=cap)
    assert (blocks.anchors < 0).any()  # unused blocks, whose slots see nothing
    with torch.no_grad(), warnings.catch_warnings():  # CPU flex attention has no backward
        warnings.simplefilter("ignore")  # and warns that it runs unfused
        dense = block_hidden(draft, target, blocks, flex=False)
        flex = block_hidden(draft, target, blocks, flex=True)
    assert torch.allclose(flex, dense, atol=1e-5, rtol=1e-5)
    logits_dense, logits_flex = target.lm_head(dense), target.lm_head(flex)
    assert torch.allclose(logits_flex, logits_dense, atol=1e-5, rtol=1e-5)


def test_flex_is_the_default_on_cuda_only():
    assert not use_flex("cpu")
    assert use_flex("cuda")
