"""Batched speculative decoding with a KV cache: lossless greedy, the target's law sampled."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _dflash_tiny import qwen3_pair, tiny_draft, tiny_target

from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")
stats = pytest.importorskip("scipy.stats")

PROMPTS = [[1, 2, 3], [4, 0, 2, 2, 1, 3, 0], [5], [2, 2]]


@pytest.mark.parametrize("make", ["qwen3", "llama"])
def test_batched_greedy_equals_the_targets_greedy_and_the_uncached_decoder(make):
    from _uncached_decoder import uncached_decode

    from lengthwise.dflash.speculative import speculative_batch

    if make == "qwen3":
        target, draft = qwen3_pair(vocab=6, seed=2, block_size=5)
    else:
        target = tiny_target(seed=1)
        draft = tiny_draft(target, block_size=4)
    gens = speculative_batch(draft, target, PROMPTS, max_new_tokens=17)
    accepted = []
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        one = uncached_decode(draft, target, prompt, max_new_tokens=17)
        assert gen.tokens == target.greedy(prompt, 17) == one.tokens
        assert gen.accepted == one.accepted and gen.target_forwards == one.target_forwards
        accepted += gen.accepted
    if make == "qwen3":
        assert max(accepted) > 1  # drafted tokens were kept, not only the target's own


def test_stop_tokens_end_each_row_on_its_own():
    from lengthwise.dflash.speculative import speculative_batch

    target, draft = qwen3_pair(vocab=6, seed=2, block_size=5)
    free = target.greedy(PROMPTS[1], 12)
    eos = free[4]
    gens = speculative_batch(draft, target, PROMPTS, max_new_tokens=12, eos=eos)
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        assert gen.tokens == target.greedy(prompt, 12, eos)
    assert gens[1].tokens[-1] == eos and len(gens[1].tokens) <= 5


def _target_law(target, prompt, n, vocab):
    """Exact probability of every continuation of ``n`` tokens (sampling at temperature 1)."""
    law = {}
    for seq in itertools.product(range(vocab), repeat=n):
        ids = torch.tensor([prompt + list(seq)])
        with torch.no_grad():
            p = torch.softmax(target.model(input_ids=ids).logits[0].double(), dim=-1)
        prob = 1.0
        for i, t in enumerate(seq):
            prob *= float(p[len(prompt) - 1 + i, t])
        law[seq] = prob
    return law


def _p_value(samples, law):
    counts = {k: 0 for k in law}
    for s in samples:
        counts[tuple(s)] += 1
    n = len(samples)
    big = [k for k in law if law[k] * n >= 5]
    small = [k for k in law if k not in big]
    obs = [counts[k] for k in big] + ([sum(counts[k] for k in small)] if small else [])
    exp = [law[k] * n for k in big] + ([sum(law[k] for k in small) * n] if small else [])
    exp = np.array(exp) * (n / sum(exp))  # the law sums to 1 up to rounding
    return stats.chisquare(obs, exp).pvalue


def test_sampling_keeps_the_targets_distribution(monkeypatch):
    import lengthwise.dflash.speculative as spec

    target, draft = qwen3_pair(vocab=5, seed=3, block_size=4)
    for p in target.model.parameters():  # sharpen the target so the draft differs from it
        p.mul_(1.5)
    prompt, n = [1, 2], 3
    law = _target_law(target, prompt, n, 5)
    gens = spec.speculative_batch(draft, target, [prompt] * 3000, max_new_tokens=n,
                                  temperature=1.0, seed=0)
    kept = [k for g in gens for k in g.accepted]
    assert 1.0 < np.mean(kept) and min(kept) == 1  # proposals both kept and rejected
    assert _p_value([g.tokens for g in gens], law) > 1e-3

    # the test has power: keeping every proposal gives the draft's law, and it is refused
    def accept_all(proposal, logits, q, temperature, gen):
        m = proposal.shape[1]
        return [(m, int(torch.multinomial(torch.softmax(logits[r, m], -1), 1, generator=gen)))
                for r in range(proposal.shape[0])]

    monkeypatch.setattr(spec, "_verify", accept_all)
    wrong = spec.speculative_batch(draft, target, [prompt] * 3000, max_new_tokens=n,
                                   temperature=1.0, seed=0)
    assert _p_value([g.tokens for g in wrong], law) < 1e-6


def test_bad_decoding_parameters_are_named():
    from lengthwise.dflash.speculative import speculative_batch

    target, draft = qwen3_pair()
    with pytest.raises(ConfigError, match="prompt is empty"):
        speculative_batch(draft, target, [[1], []], max_new_tokens=3)
    with pytest.raises(ConfigError, match="at least one prompt"):
        speculative_batch(draft, target, [], max_new_tokens=3)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        speculative_batch(draft, target, [[1]], max_new_tokens=0)
    with pytest.raises(ConfigError, match="temperature"):
        speculative_batch(draft, target, [[1]], max_new_tokens=2, temperature=-1.0)


@pytest.mark.parametrize("seed", [8, 18, 25])
def test_the_greedy_reference_stops_only_where_told(seed):
    """The model's own eos id (2 for Llama configs) does not cut the reference short."""
    transformers = pytest.importorskip("transformers")
    from lengthwise.dflash import Target
    from lengthwise.dflash.evaluate import greedy_reference

    cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(seed)
    target = Target(transformers.LlamaForCausalLM(cfg), layers=[0, 1])
    for prompt in ([1, 2, 3], [4, 5]):
        free = target.greedy(prompt, 8)
        assert greedy_reference(target, prompt, 8) == free
        assert greedy_reference(target, prompt, 8, eos=free[2]) == target.greedy(prompt, 8,
                                                                                 free[2])
    assert target.model.generation_config.eos_token_id == 2  # left as it was


def _logit_rows(target, run):
    """Rows (positions) of every LM-head output of the target while ``run()`` runs."""
    rows = []
    hook = target.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: rows.append(int(out.numel() // out.shape[-1])))
    try:
        run()
    finally:
        hook.remove()
    return rows


@pytest.mark.parametrize("width", [4, 120])
def test_the_target_computes_logits_only_where_tokens_are_chosen(width):
    """The prefill scores each prompt's last position only, and a verification its block:
    no forward holds more than rows x block logits, however long the prompts."""
    from lengthwise.dflash.speculative import speculative_batch

    target, draft = qwen3_pair(vocab=6, seed=2, block_size=5)
    prompts = [[1 + i % 4] * width for i in range(3)]
    gens = []
    rows = _logit_rows(target, lambda: gens.extend(
        speculative_batch(draft, target, prompts, max_new_tokens=9)))
    assert rows and max(rows) <= len(prompts) * 5
    assert rows[0] == len(prompts)  # the prefill: one position a prompt
    assert [g.tokens for g in gens] == [target.greedy(p, 9) for p in prompts]


def test_rejected_proposals_leave_the_cache_and_change_no_token(monkeypatch):
    """A draft whose proposals are mostly rejected: the cache stays within about twice the
    longest row instead of growing by a block every verification; greedy output is the
    target's, and sampled output (float64) the same draws as with every column kept."""
    import lengthwise.dflash.speculative as spec

    target, draft = qwen3_pair(vocab=64, seed=2, block_size=5)
    target.model.double()
    draft.double()
    prompts = [[1, 2, 3], [4] * 9, [5, 6]]
    widths = []
    hook = target.model.register_forward_pre_hook(
        lambda m, a, kw: widths.append(kw["attention_mask"].shape[1]), with_kwargs=True)
    try:
        gens = spec.speculative_batch(draft, target, prompts, max_new_tokens=40)
    finally:
        hook.remove()
    longest = max(len(p) + len(g.tokens) for p, g in zip(prompts, gens, strict=True))
    verifications = max(len(g.accepted) for g in gens)
    assert verifications * 5 > 3 * longest  # every column kept would be this much wider
    assert max(widths) <= 2 * longest + 2 * 5
    assert [g.tokens for g in gens] == [target.greedy(p, 40) for p in prompts]
    sampled = spec.speculative_batch(draft, target, prompts, max_new_tokens=40,
                                     temperature=1.0, seed=3)
    monkeypatch.setattr(spec, "_compact", lambda cache, valid: valid)
    kept_all = spec.speculative_batch(draft, target, prompts, max_new_tokens=40,
                                      temperature=1.0, seed=3)
    assert [g.tokens for g in sampled] == [g.tokens for g in kept_all]
    assert [g.accepted for g in sampled] == [g.accepted for g in kept_all]


def test_lookup_candidates_follow_transformers_prompt_lookup():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from lengthwise.dflash.lookup import lookup_candidates

    rng = np.random.default_rng(0)
    for _ in range(300):
        seq = rng.integers(0, 4, int(rng.integers(1, 15))).tolist()
        k = int(rng.integers(1, 5))
        ref = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=2,
                                             max_length=10**6)
        ids, _ = ref.get_candidates(torch.tensor([seq]))
        assert lookup_candidates(seq, k) == ids[0, len(seq):].tolist()


def test_the_combined_proposer_is_lossless_and_keeps_the_targets_law():
    from lengthwise.dflash.speculative import speculative_batch

    target, draft = qwen3_pair(vocab=6, seed=2, block_size=5)
    prompts = [[1, 2, 1, 2, 1, 2], [4, 0, 2, 2, 1, 3, 0], [5, 5, 5], [2, 2]]
    both = speculative_batch(draft, target, prompts, max_new_tokens=17, lookup_ngram=2)
    alone = speculative_batch(draft, target, prompts, max_new_tokens=17)
    for prompt, b, a in zip(prompts, both, alone, strict=True):
        assert b.tokens == a.tokens == target.greedy(prompt, 17)
    # the repetitive text's candidates differ from the draft's: the proposer changed something
    assert [b.accepted for b in both] != [a.accepted for a in alone]

    target, draft = qwen3_pair(vocab=5, seed=3, block_size=4)
    for p in target.model.parameters():
        p.mul_(1.5)
    prompt, n = [1, 2, 1, 2], 3
    law = _target_law(target, prompt, n, 5)
    gens = speculative_batch(draft, target, [prompt] * 3000, max_new_tokens=n,
                             temperature=1.0, seed=0, lookup_ngram=2)
    assert _p_value([g.tokens for g in gens], law) > 1e-3


def test_the_drafts_cached_context_gives_the_blocks_of_a_full_forward():
    from lengthwise.dflash.blocks import block_attention_mask

    target, draft = qwen3_pair(vocab=6, seed=2, block_size=5)
    torch.manual_seed(0)
    n, length, b = 2, 9, draft.config.block_size
    feats = torch.randn(n, length, draft.fc.in_features)
    lens = torch.tensor([[9], [4]])  # the second row's context is its first 4 positions
    embeds = torch.randn(n, b, draft.config.hidden_size)
    block_pos = lens + torch.arange(b)
    mask = block_attention_mask(lens, torch.zeros_like(lens), length, b)
    positions = torch.cat([torch.arange(length).expand(n, -1), block_pos], dim=1)
    full = draft(feats, embeds, positions, mask)
    kv = draft.context_keys_values(feats, torch.arange(length).expand(n, -1))
    cached = draft(None, embeds, block_pos, mask, context_kv=kv)
    assert torch.allclose(cached, full, atol=1e-5)
    half = draft.context_keys_values(feats[:, 4:], torch.arange(4, length).expand(n, -1))
    first = draft.context_keys_values(feats[:, :4], torch.arange(4).expand(n, -1))
    joined = [(torch.cat([a[0], c[0]], 2), torch.cat([a[1], c[1]], 2))
              for a, c in zip(first, half, strict=True)]
    assert torch.allclose(draft(None, embeds, block_pos, mask, context_kv=joined), full,
                          atol=1e-5)  # computed in two pieces, as decoding does


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_draft_is_skipped_when_prompt_lookup_fills_every_block(monkeypatch, temperature):
    from lengthwise.dflash import speculative
    from lengthwise.dflash.speculative import speculative_batch

    target, draft = qwen3_pair(vocab=6, seed=2, block_size=5)
    calls = []
    monkeypatch.setattr(draft, "forward", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(speculative, "lookup_candidates", lambda seq, k, n=2: [1] * k)
    gens = speculative_batch(draft, target, PROMPTS, max_new_tokens=9, lookup_ngram=2,
                             temperature=temperature, seed=0)
    assert calls == [] and all(len(g.tokens) == 9 for g in gens)
    if temperature == 0:
        assert [g.tokens for g in gens] == [target.greedy(p, 9) for p in PROMPTS]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_output_equals_greedy_and_every_verification_is_counted(seed):
    from lengthwise.dflash.speculative import speculative_batch

    target = tiny_target(seed=seed)
    draft = tiny_draft(target, seed=seed + 10, block_size=3 + seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 40, (n,), generator=g).tolist() for n in (1, 4, 9)]
    for prompt, out in zip(prompts, speculative_batch(draft, target, prompts,
                                                      max_new_tokens=20), strict=True):
        assert out.tokens == target.greedy(prompt, 20)
        assert len(out.tokens) == 20 == 1 + sum(out.accepted)
        assert out.target_forwards == 1 + len(out.accepted)
        assert all(1 <= k <= draft.config.block_size for k in out.accepted)


def test_a_perfect_proposer_keeps_whole_blocks_and_acceptance_pools_them():
    """The oracle's counting (a proposer that is always right keeps B tokens a verification),
    then :func:`acceptance` on the real draft: lossless, pooled over forwards."""
    from _uncached_decoder import uncached_decode

    from lengthwise.dflash.speculative import acceptance

    target = tiny_target(seed=5)
    draft = tiny_draft(target, block_size=4)
    out = uncached_decode(draft, target, [3, 4, 5], max_new_tokens=13,
                          propose=lambda d, t, seq, f: t.greedy(seq, d.config.block_size - 1))
    assert out.accepted == [4, 4, 4] and out.tokens == target.greedy([3, 4, 5], 13)
    res = acceptance(draft, target, [[3, 4, 5], [6, 7]], max_new_tokens=13)
    assert res["lossless"] and res["prompts"] == 2 and 1.0 <= res["acceptance_length"] < 4.0
    assert res["verify_forwards"] >= 2 * 3  # 12 tokens a prompt, at most 4 a verification
