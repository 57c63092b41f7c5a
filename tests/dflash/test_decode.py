"""Speculative decoding with a DFlash draft is lossless: it returns the target's greedy output."""

from __future__ import annotations

import pytest
from _dflash_tiny import tiny_draft, tiny_target

from lengthwise.dflash.decode import acceptance, speculative_generate

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speculative_output_equals_greedy(seed):
    target = tiny_target(seed=seed)
    draft = tiny_draft(target, seed=seed + 10, block_size=3 + seed)
    g = torch.Generator().manual_seed(seed)
    for n in (1, 4, 9):
        prompt = torch.randint(1, 40, (n,), generator=g).tolist()
        out = speculative_generate(draft, target, prompt, max_new_tokens=20)
        assert out.tokens == target.greedy(prompt, 20)
        assert len(out.tokens) == 20 == 1 + sum(out.accepted)
        assert out.target_forwards == 1 + len(out.accepted)
        assert all(1 <= k <= draft.config.block_size for k in out.accepted)


def test_eos_stops_both_decoders():
    target = tiny_target(seed=4)
    draft = tiny_draft(target, block_size=4)
    prompt = [5, 6, 7]
    free = target.greedy(prompt, 15)
    eos = free[6]  # a token the target will produce
    out = speculative_generate(draft, target, prompt, max_new_tokens=15, eos=eos)
    assert out.tokens == target.greedy(prompt, 15, eos) and out.tokens[-1] == eos


def test_a_perfect_draft_keeps_whole_blocks(monkeypatch):
    import lengthwise.dflash.decode as decode

    target = tiny_target(seed=5)
    draft = tiny_draft(target, block_size=4)

    def oracle(draft, target, seq, feats):  # proposes exactly the target's greedy tokens
        return target.greedy(seq, draft.config.block_size - 1)

    monkeypatch.setattr(decode, "_propose", oracle)
    out = speculative_generate(draft, target, [3, 4, 5], max_new_tokens=13)
    assert out.accepted == [4, 4, 4] and out.tokens == target.greedy([3, 4, 5], 13)
    monkeypatch.undo()
    res = acceptance(draft, target, [[3, 4, 5]], max_new_tokens=13)
    assert res["lossless"] and 1.0 <= res["acceptance_length"] < 4.0
