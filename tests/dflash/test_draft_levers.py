"""The draft's training levers: warm start, zero output, feature scale, target KL labels."""

from __future__ import annotations

import json

import pytest
from _dflash_tiny import qwen3_pair, tiny_target

from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")


def _draft(target, layers=2, **kw):
    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    cfg = DFlashConfig.from_target(target.model.config, num_layers=layers, block_size=4,
                                   target_layers=target.layers,
                                   mask_token_id=target.vocab_size - 1, **kw)
    torch.manual_seed(3)
    return DFlashDraft(cfg)


def _inputs(draft, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = draft.config.hidden_size
    feats = torch.randn(2, 6, draft.config.num_features * h, generator=g)
    block = torch.randn(2, 4, h, generator=g)
    pos = torch.arange(10).expand(2, 10)
    return feats, block, pos, torch.ones(2, 4, 10, dtype=torch.bool)


def test_warm_start_copies_the_targets_top_layers_norm_and_deepest_feature():
    from lengthwise.dflash.draft_init import warm_start

    target = tiny_target()  # 4 layers, features of layers 1 and 2
    draft = _draft(target)
    assert warm_start(draft, target, _texts()) == [2, 3]
    base = target.base
    for mine, i in zip(draft.layers, (2, 3), strict=True):
        theirs = base.layers[i].state_dict()
        for name, value in mine.state_dict().items():
            if name in theirs:
                assert torch.equal(value, theirs[name]), name
        q_norm = mine.self_attn.q_norm.weight.detach()  # Llama has none: one measured constant
        assert torch.equal(q_norm, q_norm[:1].expand(8)) and float(q_norm[0]) != 1.0
    assert torch.equal(draft.norm.weight, base.norm.weight)
    assert torch.equal(draft.context_norm.weight, base.layers[2].input_layernorm.weight)
    w = draft.fc.weight
    assert torch.equal(w[:, 32:], torch.eye(32)) and not w[:, :32].any()  # layer 2: deepest


def _texts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 40, (n,), generator=g) for n in (24, 17)]


def _causal_logits(q, k, cos, sin):
    """Attention logits ``(heads, causal pairs)`` of ``(T, heads, d)`` queries and keys."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    q, k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    k = repeat_kv(k, q.shape[1] // k.shape[1])
    logits = (q @ k.transpose(-1, -2))[0] / q.shape[-1] ** 0.5
    return logits[:, torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()]


def _layer_logits(target, draft, text):
    """Per copied layer: the target layer's logits and the draft layer's on the target's input."""
    base = target.base
    hidden = base(input_ids=text[None], output_hidden_states=True).hidden_states
    pos = torch.arange(len(text))[None]
    out = []
    for mine, i in zip(draft.layers, (2, 3), strict=True):
        theirs = base.layers[i].self_attn
        x = base.layers[i].input_layernorm(hidden[i][0])
        q, k = theirs.q_proj(x).view(len(text), 4, 8), theirs.k_proj(x).view(len(text), 2, 8)
        cos, sin = base.rotary_emb(x[None], pos)
        a = mine.self_attn
        y = mine.input_layernorm(hidden[i][0])
        dq = a.q_norm(a.q_proj(y).view(len(text), 4, 8))
        dk = a.k_norm(a.k_proj(y).view(len(text), 2, 8))
        dcos, dsin = draft.rotary(y[None], pos)
        out.append((_causal_logits(q, k, cos, sin), _causal_logits(dq, dk, dcos, dsin)))
    return out


def _rms(parts):
    return float(torch.cat([p.reshape(-1) for p in parts]).pow(2).mean().sqrt())


@torch.no_grad()
def test_warm_start_gives_the_draft_layers_the_targets_attention_logit_size():
    from lengthwise.dflash.draft_init import warm_start

    target = tiny_target()
    texts = _texts()
    unit = _draft(target)
    warm_start(unit, target, texts)
    for layer in unit.layers:  # the same draft with the norms at one
        layer.self_attn.q_norm.weight.fill_(1.0)
        layer.self_attn.k_norm.weight.fill_(1.0)
    draft = _draft(target)
    warm_start(draft, target, texts)
    for text in [*texts, *_texts(seed=1)]:  # measured on texts; held on others too
        warm, plain = _layer_logits(target, draft, text), _layer_logits(target, unit, text)
        for (theirs, mine), (_, ones) in zip(warm, plain, strict=True):
            ratio = _rms([mine]) / _rms([theirs])
            assert 0.8 < ratio < 1.25, ratio
            assert _rms([ones]) / _rms([theirs]) > 3  # unit queries and keys: far too large
            # the attention each query pays follows the target's more closely
            p = torch.softmax(_dense(theirs, len(text)), -1)
            gap = [float((p * (p.log() - torch.log_softmax(_dense(d, len(text)), -1))
                          ).nan_to_num().sum(-1).mean()) for d in (mine, ones)]
            assert gap[0] < gap[1] / 2, gap
    # on the texts it was measured on, the logits' root mean square is the target's
    for i in range(2):
        pairs = [_layer_logits(target, draft, t)[i] for t in texts]
        torch.testing.assert_close(_rms([m for _, m in pairs]), _rms([t for t, _ in pairs]),
                                   rtol=1e-4, atol=0)


def _dense(logits, n):
    """``(heads, pairs)`` causal logits back to ``(heads, n, n)`` with minus infinity above."""
    out = torch.full((logits.shape[0], n, n), float("-inf"))
    out[:, torch.ones(n, n, dtype=torch.bool).tril()] = logits
    return out


def test_warm_start_of_a_target_without_q_k_norms_needs_training_text():
    from lengthwise.dflash.draft_init import warm_start
    from lengthwise.errors import DataError

    target = tiny_target()
    with pytest.raises(DataError, match="no training tokens to measure") as err:
        warm_start(_draft(target), target, [torch.zeros(0, dtype=torch.long)])
    assert "\n" not in str(err.value)


def test_warm_start_copies_qwen3_q_and_k_norms():
    from lengthwise.dflash.draft_init import warm_start

    target, draft = qwen3_pair()
    with torch.no_grad():
        target.base.layers[3].self_attn.q_norm.weight.fill_(0.5)
    warm_start(draft, target)
    assert torch.equal(draft.layers[1].self_attn.q_norm.weight, torch.full((8,), 0.5))


def test_warm_start_refuses_other_sizes_in_one_line():
    from lengthwise.dflash.draft_init import warm_start

    target = tiny_target()
    draft = _draft(target, intermediate_size=48)
    with pytest.raises(ConfigError, match=r"intermediate_size 48 differs from the target's 64"
                       ) as err:
        warm_start(draft, target)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="cannot copy the top layers"):
        warm_start(_draft(target, layers=5), target)


def test_zero_output_starts_as_the_final_norm_of_the_block_embeddings():
    from lengthwise.dflash.draft_init import zero_output

    draft = _draft(tiny_target())
    zero_output(draft)
    feats, block, pos, mask = _inputs(draft)
    with torch.no_grad():
        torch.testing.assert_close(draft(feats, block, pos, mask), draft.norm(block))


def test_new_draft_applies_the_config_levers():
    from lengthwise.dflash.recipe import new_draft
    from lengthwise.dflash.train_config import DFlashTrainConfig

    target = tiny_target()
    cfg = DFlashTrainConfig(steps=2, block_size=4, draft_layers=2, num_features=2,
                            init="target", zero_init_output=True, standardize_features=True)
    scale = torch.linspace(0.5, 2.0, 64)
    texts = [t.numpy().astype("int32") for t in _texts()]  # token ids as data sets hold them
    draft = new_draft(target, cfg, mask_token_id=39, feature_scale=scale, samples=texts)
    assert torch.equal(draft.feature_scale, scale)
    assert not draft.layers[0].self_attn.o_proj.weight.any()
    assert torch.equal(draft.layers[1].mlp.up_proj.weight, target.base.layers[3].mlp.up_proj.weight)
    # fc undoes the scale on the deepest feature: fc(x * scale) is that feature
    x = torch.randn(3, 64)
    torch.testing.assert_close(draft.fc(x * scale), x[:, 32:])
    plain = new_draft(target, DFlashTrainConfig(steps=2, block_size=4, draft_layers=2,
                                                init="random"), mask_token_id=39)
    assert plain.layers[0].self_attn.o_proj.weight.any() and not hasattr(plain, "feature_scale")
    with pytest.raises(ConfigError, match="init must be one of target, random"):
        DFlashTrainConfig(init="copy")


def test_feature_scale_is_one_over_each_dimensions_root_mean_square():
    from lengthwise.dflash.model import feature_scale
    from lengthwise.errors import DataError

    rows = [torch.tensor([[3.0, 0.0, 1.0]]), torch.tensor([[-3.0, 4.0, 1.0], [0.0, 0.0, 1.0]])]
    expect = 1 / torch.tensor([(18 / 3) ** 0.5, (16 / 3) ** 0.5, 1.0])
    torch.testing.assert_close(feature_scale(rows), expect)
    with pytest.raises(DataError, match="no training tokens"):
        feature_scale([])


def test_standardized_draft_exports_with_the_scale_folded_into_fc(tmp_path):
    from lengthwise.dflash.export import export_draft
    from lengthwise.dflash.load import load_exported

    draft = _draft(tiny_target(), standardize_features=True).eval()
    with torch.no_grad():
        draft.feature_scale.copy_(torch.logspace(-2, 1, 64))
    folder = export_draft(draft, tmp_path / "out")
    names = json.loads((folder / "config.json").read_text())
    assert "standardize_features" not in json.dumps(names)
    served = load_exported(folder)
    assert not hasattr(served, "feature_scale")
    feats, block, pos, mask = _inputs(draft)
    with torch.no_grad():
        torch.testing.assert_close(served(feats, block, pos, mask), draft(feats, block, pos, mask),
                                   rtol=1e-5, atol=1e-5)


def test_target_kl_loss_and_gradient_equal_a_hand_computation():
    from lengthwise.dflash.head import chunked_cross_entropy

    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 8, generator=g, requires_grad=True)
    t = torch.randn(5, 8, generator=g)
    w = torch.randn(11, 8, generator=g)
    labels, weights = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([1.0, 0.5, 0.25, 1.0, 2.0])
    loss, per, hit = chunked_cross_entropy(h, w, None, labels, weights, chunk=2, soft=t)
    p = torch.softmax(t @ w.T, -1)
    q = torch.softmax(h @ w.T, -1)
    kl = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(per, kl.detach())
    torch.testing.assert_close(loss, (weights * kl).sum())
    assert torch.equal(hit, (h @ w.T).argmax(-1) == labels)
    (grad,) = torch.autograd.grad(loss, h)
    (dense,) = torch.autograd.grad((weights * kl).sum(), h)
    torch.testing.assert_close(grad, dense)
    same, _, _ = chunked_cross_entropy(t, w, None, labels, weights, soft=t)
    assert abs(float(same)) < 1e-5  # no divergence from itself


def test_target_kl_needs_a_cache_with_the_last_hidden_state():
    from lengthwise.dflash.train import DFlashTask
    from lengthwise.dflash.train_config import DFlashTrainConfig

    target = tiny_target()
    cfg = DFlashTrainConfig(steps=2, block_size=4, draft_layers=2, labels="target_kl")
    with pytest.raises(ConfigError, match="labels=target_kl needs --features") as err:
        DFlashTask(_draft(target), target, cfg, order="stratified")
    assert "\n" not in str(err.value)


def test_a_run_trains_with_every_lever_on_from_a_cache(tiny_prepared, tmp_path):
    from lengthwise.dflash.features import FeaturesConfig, write_features
    from lengthwise.dflash.load import trained_draft
    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings

    target, prepared = tiny_prepared
    cache = tmp_path / "cache"
    write_features(prepared, target, cache, FeaturesConfig(num_features=2, shard_mib=1,
                                                           progress=False))
    cfg = DFlashTrainConfig(steps=2, max_tokens=256, max_len=200, block_size=4, num_anchors=4,
                            draft_layers=2, lr=1e-3, progress=False, threads=1,
                            checkpoint_every=0, init="target", zero_init_output=True,
                            standardize_features=True, labels="target_kl")
    run = RunSettings(target=str(target), data=str(prepared), out=str(tmp_path / "run"),
                      eval_samples=4, eval_every=2, features=str(cache), split_seed=5)
    summary = train_draft(cfg, run, progress=False)
    rows = [json.loads(line) for line in open(summary["log"]) if '"loss"' in line]
    assert len(rows) == 2 and all(r["loss"] >= 0 for r in rows)
    draft, _ = trained_draft(summary["final"])
    assert draft.config.standardize_features and not torch.equal(
        draft.feature_scale, torch.ones_like(draft.feature_scale))


def test_train_flags_come_from_the_config():
    import argparse

    from lengthwise.cli.dflash.train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "--init", "target", "--standardize-features",
                              "--labels", "target_kl"])
    assert (args.init, args.standardize_features, args.labels) == ("target", True, "target_kl")
    assert not hasattr(parser.parse_args(["train"]), "zero_init_output")  # YAML keeps its own


def test_train_samples_draws_nested_subsets_and_refuses_more_than_there_are(tiny_prepared):
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import _split
    from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings

    target, prepared = tiny_prepared
    data = open_prepared(prepared)
    cfg = DFlashTrainConfig(steps=1, max_tokens=256, max_len=200, block_size=4)

    def train_ids(n: int | None) -> set[int]:
        run = RunSettings(target=str(target), data=str(prepared), eval_samples=2,
                          train_samples=n, split_seed=3)
        return set(_split(data, cfg, run).train_idx.tolist())

    every = train_ids(None)
    small, larger = train_ids(2), train_ids(4)
    assert len(small) == 2 and len(larger) == 4 and small <= larger <= every
    with pytest.raises(ConfigError, match=f"only {len(every)} training samples"):
        train_ids(len(every) + 1)
    with pytest.raises(ConfigError, match="train_samples must be a positive integer"):
        RunSettings(target="t", data="d", train_samples=0)
