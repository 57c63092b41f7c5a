"""The field's acceptance figures: the interval over prompts, per-position conditional
acceptance from real decoding, and the expected acceptance from 1 - TV(p_draft, p_target)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _dflash_tiny import tiny_draft, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@settings(max_examples=40, deadline=None)
@given(drafted=st.lists(st.integers(0, 5), max_size=60))
def test_conditional_acceptance_multiplies_back_to_the_share_that_reached_each_position(
        drafted):
    from lengthwise.dflash.evaluate import conditional_acceptance, expected_acceptance

    cond = conditional_acceptance(drafted, block_size=6)
    assert len(cond) == 5
    d = np.array(drafted)
    for k in range(1, 6):
        if None in cond[:k]:  # no verification reached position k - 1: none reached k
            assert not (d >= k - 1).any()
            continue
        assert math.isclose(float(np.prod(cond[:k])), float((d >= k).mean()), abs_tol=1e-12)
    if drafted:  # the chain of conditionals gives back the mean tokens per verification
        assert math.isclose(expected_acceptance(cond), 1 + d.mean(), rel_tol=1e-12)
    with pytest.raises(ValueError, match=r"kept proposals must lie in \[0, 5\]"):
        conditional_acceptance([*drafted, 6], block_size=6)


def test_the_interval_is_students_t_over_prompts_and_leaves_out_prompts_never_verified():
    from lengthwise.dflash.evaluate import acceptance_interval

    iv = acceptance_interval([2.0, float("nan"), 4.0, 3.0])
    assert iv["n"] == 3 and iv["mean"] == 3.0
    assert iv["hi"] - iv["mean"] == pytest.approx(4.303 / math.sqrt(3))  # t(0.975, 2 df)
    one = acceptance_interval([2.5])
    assert one["mean"] == 2.5 and one["lo"] is None and one["n"] == 1


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), chunk=st.integers(1, 10), temperature=st.sampled_from([0.0, 0.5, 1.0]),
       seed=st.integers(0, 99))
def test_agreement_is_one_minus_total_variation_in_any_chunks(n, chunk, temperature, seed):
    from lengthwise.dflash.head import chunked_agreement

    g = torch.Generator().manual_seed(seed)
    hd, ht, w = (torch.randn(n, 6, generator=g), torch.randn(n, 6, generator=g),
                 torch.randn(13, 6, generator=g) * 3)
    got = chunked_agreement(hd, ht, w, None, temperature=temperature, chunk=chunk)
    ld, lt = hd @ w.T, ht @ w.T
    if temperature == 0:
        want = (ld.argmax(-1) == lt.argmax(-1)).float()
    else:
        p, q = torch.softmax(lt / temperature, -1), torch.softmax(ld / temperature, -1)
        want = torch.minimum(p, q).sum(-1)  # the chance speculative sampling keeps a draw
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.equal(chunked_agreement(ht, ht, w, None, temperature=temperature),
                       torch.ones(n))


def _constant_pair(scale: float):
    """A target whose next-token law is the same after any text (every embedding row the
    same), and a draft whose proposals are (nearly) the same law at every step: real
    decoding keeps position k with probability alpha_k, whatever came before."""
    from lengthwise.dflash.target import Target

    cfg = transformers.LlamaConfig(vocab_size=12, hidden_size=32, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, max_position_embeddings=512,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:] = model.model.embed_tokens.weight[0].clone()
        model.lm_head.weight.mul_(scale)
    target = Target(model, layers=[1, 2])
    return target, tiny_draft(target, block_size=4, mask_token_id=11).eval()


def test_expected_acceptance_at_temperature_one_predicts_real_decoding():
    from lengthwise.dflash.evaluate import acceptance_interval, conditional_acceptance
    from lengthwise.dflash.speculative import speculative_batch
    from lengthwise.dflash.teacher_forced import teacher_forced

    target, draft = _constant_pair(scale=3.0)
    prompts = [[1, 2, 3]] * 200
    gens = speculative_batch(draft, target, prompts, max_new_tokens=40, temperature=1.0,
                             seed=0)
    ev = teacher_forced(draft, target, prompts[:50], [g.tokens for g in gens[:50]],
                        temperature=1.0)
    assert 0.5 < min(ev.alpha) and max(ev.alpha) < 0.95  # proposals kept and rejected
    # real decoding: tokens per verification before the token limit cut the last one
    real = acceptance_interval([1 + np.mean(g.drafted) for g in gens])
    assert real["lo"] <= ev.expected_acceptance <= real["hi"]
    cond = conditional_acceptance([k for g in gens for k in g.drafted], block_size=4)
    assert cond == pytest.approx(ev.alpha, abs=0.03)


def test_at_temperature_zero_agreement_on_greedy_outputs_is_the_top1_accuracy():
    """On the target's own greedy text the label at a + k is the target's top-1 there:
    alpha at T = 0 is the slot accuracy, to the count."""
    from lengthwise.dflash.speculative import speculative_batch
    from lengthwise.dflash.teacher_forced import teacher_forced

    target = tiny_target(seed=3)
    target.model.double()
    draft = tiny_draft(target, block_size=4).double().eval()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    outs = [g.tokens for g in speculative_batch(draft, target, prompts, max_new_tokens=12)]
    ev = teacher_forced(draft, target, prompts, outs, temperature=0.0)
    assert ev.alpha == pytest.approx(ev.slot_accuracy, abs=1e-12)
    assert ev.expected_acceptance == pytest.approx(ev.simulated_acceptance_length, abs=1e-12)


def test_prompt_lookup_is_lossless_greedy_and_counts_the_targets_forwards():
    from lengthwise.dflash.lookup import prompt_lookup, target_generate

    target = tiny_target(seed=3)
    calls = []
    hook = target.model.register_forward_pre_hook(lambda *a: calls.append(1))
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6], [7, 7, 7, 7]]
    try:
        for p in prompts:
            calls.clear()
            run = prompt_lookup(target, p, max_new_tokens=20, num_tokens=3)
            assert len(calls) == run.forwards  # every forward, not only the first
            assert run.tokens == target.greedy(p, 20) == target_generate(target, p, 20)
            assert run.acceptance_length == len(run.tokens) / run.forwards
    finally:
        hook.remove()
    # this target's greedy text falls into a loop that the lookup finds in it
    looped = prompt_lookup(target, prompts[0], max_new_tokens=20, num_tokens=3)
    assert looped.acceptance_length > 1.5
    sampled = prompt_lookup(target, prompts[0], max_new_tokens=20, num_tokens=3,
                            temperature=1.0, seed=4)
    assert len(sampled.tokens) == 20 and sampled.forwards >= 20 / 4


def test_the_eval_stage_reports_prompt_lookup_beside_the_draft(models_for_eval):
    from lengthwise.dflash.evaluate import evaluate_set

    target, draft = models_for_eval
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6], [7, 7, 7, 7], [4, 5, 6]]
    rows = evaluate_set(draft, target, prompts, name="p", temperatures=[0.0, 1.0],
                        max_new_tokens=12, lookup_tokens=3, accuracy=False)
    for r in rows:
        assert r["baseline"] == "prompt lookup, 3 tokens from 2-grams (transformers generate)"
        assert 1.0 <= r["baseline_acceptance_length"] <= 4.0
        lo, hi = r["baseline_acceptance_interval"]
        assert lo <= r["baseline_acceptance_length"] <= hi
        assert r["vs_baseline"]["mean"] == pytest.approx(
            r["acceptance_length"] - r["baseline_acceptance_length"])
        # the combined proposer, paired by prompt with lookup's runs of the same prompts
        assert r["combined_vs_baseline"]["mean"] == pytest.approx(
            r["combined_acceptance_length"] - r["baseline_acceptance_length"])
        assert r["combined_vs_baseline"]["lo"] <= r["combined_vs_baseline"]["mean"]
    assert rows[0]["baseline_mismatches"] == 0 == rows[0]["mismatches"]
    assert rows[0]["combined_mismatches"] == 0
    assert "baseline_mismatches" not in rows[1]
    bare, = evaluate_set(draft, target, prompts, name="p", temperatures=[0.0],
                         max_new_tokens=12, accuracy=False, check=False)
    assert not any(k.startswith(("baseline", "combined")) for k in bare)


@pytest.fixture(scope="module")
def models_for_eval():
    target = tiny_target(seed=3)
    return target, tiny_draft(target, block_size=4).eval()
