"""The draft's attention mask: a block sees its own slots and context strictly before its anchor."""

from __future__ import annotations

import pytest

from lengthwise.dflash.blocks import make_blocks
from lengthwise.dflash.loss import block_logits

torch = pytest.importorskip("torch")


def _logits(target, draft, tokens, rows=None):
    from lengthwise.pytorch.collate import PadCollator

    batch = PadCollator(pad_token_id=0, pad_multiple=1)(
        [{"input_ids": t, "labels": [-100, *t[1:]]} for t in tokens])
    blocks = make_blocks(batch, rows or [[i] for i in range(len(tokens))], step=0, seed=0,
                         num_anchors=64, block_size=4, gamma=4.0)
    with torch.no_grad():
        out = block_logits(draft, target, blocks)
    return blocks, out.reshape(len(tokens), blocks.anchors.shape[1], 4, -1)


def test_block_ignores_tokens_at_or_after_its_anchor_and_other_blocks(pair):
    target, draft = pair
    base = list(range(3, 19))  # 16 tokens: anchors at every position 0..14, a block apart or less
    blocks, ref = _logits(target, draft, [base])
    anchors = blocks.anchors[0].tolist()
    i = anchors.index(6)
    changed = base[:7] + [(t * 7 + 5) % 40 for t in base[7:]]  # every token after the anchor
    _, out = _logits(target, draft, [changed])
    torch.testing.assert_close(out[0, i], ref[0, i], rtol=0, atol=0)
    # the blocks whose anchors were changed do move: the test can see a change
    j = anchors.index(9)
    assert not torch.allclose(out[0, j], ref[0, j])


def test_block_depends_on_context_before_its_anchor(pair):
    target, draft = pair
    base = list(range(3, 19))
    blocks, ref = _logits(target, draft, [base])
    i = blocks.anchors[0].tolist().index(6)
    changed = list(base)
    changed[2] = 39
    _, out = _logits(target, draft, [changed])
    assert not torch.allclose(out[0, i], ref[0, i])


def test_features_at_the_anchor_and_later_are_not_seen(pair):
    target, draft = pair
    from lengthwise.dflash.blocks import block_attention_mask
    from lengthwise.dflash.loss import block_inputs

    ids = torch.arange(3, 15).unsqueeze(0)
    anchors, starts = torch.tensor([[4, 5, 9]]), torch.zeros(1, 3, dtype=torch.long)
    _, feats = target.forward(ids)
    pos = torch.cat([torch.arange(12), (anchors[0, :, None] + torch.arange(4)).flatten()])[None]
    mask = block_attention_mask(anchors, starts, 12, 4)
    emb = block_inputs(draft, target, ids, anchors, 4)
    with torch.no_grad():
        ref = draft(feats, emb, pos, mask)
        noisy = feats.clone()
        noisy[:, 4:] += torch.randn_like(noisy[:, 4:])  # features at and after anchor 4
        other = emb.clone()
        other[:, 4:] += 1.0  # the other two blocks' inputs
        out = draft(noisy, other, pos, mask)
        torch.testing.assert_close(out[:, :4], ref[:, :4], rtol=0, atol=0)
        assert not torch.allclose(out[:, 4:8], ref[:, 4:8])
        before = feats.clone()
        before[:, 3] += 1.0
        assert not torch.allclose(draft(before, emb, pos, mask)[:, :4], ref[:, :4])


def test_batch_mates_and_padding_do_not_change_a_sample(pair):
    target, draft = pair
    a, b = list(range(3, 15)), list(range(20, 38))
    _, alone = _logits(target, draft, [a])
    blocks, both = _logits(target, draft, [a, b])
    n = int((blocks.anchors[0] >= 0).sum())
    torch.testing.assert_close(both[0, :n], alone[0, :n], rtol=1e-5, atol=1e-5)


def test_packed_rows_give_the_padded_logits(pair):
    from lengthwise.pytorch.collate import PackCollator

    target, draft = pair
    a, b = list(range(3, 15)), list(range(20, 30))
    _, padded = _logits(target, draft, [a, b])
    batch = PackCollator(row_capacity=24, pad_to_capacity=True, pad_token_id=0,
                         return_flash_attn_kwargs=False)(
        [[{"input_ids": a, "labels": a}, {"input_ids": b, "labels": b}]])
    blocks = make_blocks(batch, [[0, 1]], step=0, seed=0, num_anchors=64, block_size=4,
                         gamma=4.0)
    with torch.no_grad():
        packed = block_logits(draft, target, blocks).reshape(1, -1, 4, 40)
    n_a = 10  # sample a: anchors 1..10 (the first token of a sample is unsupervised)
    torch.testing.assert_close(packed[0, :n_a], padded[0, :n_a], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(packed[0, n_a:n_a + 8], padded[1, :8], rtol=1e-4, atol=1e-4)
