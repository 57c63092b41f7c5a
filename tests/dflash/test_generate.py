"""The target's decode loop (:mod:`lengthwise.dflash.generate`) against HF ``generate``."""

from __future__ import annotations

import numpy as np
import pytest
from _dflash_tiny import float64_llama

from lengthwise.dflash.generate import generate_responses
from lengthwise.dflash.prompt_batches import batch_offsets

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STOPS = [3]


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama in float64 (no argmax ties) whose rows stop at different steps."""
    return float64_llama(max_position_embeddings=128)


def _prompts(n: int = 9) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(6, 12, size=int(k)) for k in rng.integers(1, 20, size=n)]


def _hf(model, prompt: np.ndarray, cap: int) -> list[int]:
    """``model.generate``'s greedy continuation of one prompt, cut after its first stop."""
    with torch.no_grad():
        seq = model.generate(torch.from_numpy(prompt)[None], max_new_tokens=cap, do_sample=False,
                             eos_token_id=STOPS, pad_token_id=STOPS[0])
    new = seq[0, prompt.size:].tolist()
    ends = [i for i, t in enumerate(new) if t in STOPS]
    return new[: ends[0] + 1] if ends else new


def test_greedy_responses_are_those_of_hf_generate(model):
    prompts, cap = _prompts(), 12
    want = [_hf(model, p, cap) for p in prompts]
    lengths = {len(w) for w in want}
    assert len(lengths) > 2 and cap in lengths  # rows finish at different steps, some cut
    for batch_size, max_tokens in ((1, None), (4, None), (64, 60), (64, None)):
        got = generate_responses(model, prompts, max_new_tokens=cap, eos=STOPS,
                                 temperature=0.0, seed=0, batch_size=batch_size,
                                 max_tokens=max_tokens)
        assert [g.tolist() for g in got] == want, (batch_size, max_tokens)


def test_sampled_responses_follow_the_seed(model):
    prompts = _prompts(5)

    def run(seed):
        return [o.tolist() for o in generate_responses(
            model, prompts, max_new_tokens=8, eos=STOPS, temperature=1.5, seed=seed,
            batch_size=2)]

    first = run(1)
    assert run(1) == first and run(2) != first
    assert all(1 <= len(o) <= 8 and not set(o[:-1]) & set(STOPS) for o in first)


def test_batches_hold_the_row_cap_and_the_token_budget():
    lens = np.array([2, 3, 3, 5, 9, 30])
    cuts = batch_offsets(lens, batch_size=2, max_tokens=40, max_new_tokens=4)
    assert cuts.tolist() == [0, 2, 4, 5, 6]  # 4 rows of 9 fit 40 but the cap is 2; 34 alone
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        assert b - a <= 2 and ((b - a) * (lens[b - 1] + 4) <= 40 or b - a == 1)
    assert batch_offsets(lens, batch_size=4, max_tokens=None, max_new_tokens=4).tolist() == [
        0, 4, 6]
    assert batch_offsets(np.zeros(0, np.int64), batch_size=4, max_tokens=8,
                         max_new_tokens=4).tolist() == [0]
