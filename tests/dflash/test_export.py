"""The exported draft loads in the reference ``dflash`` package and behaves exactly like ours."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _dflash_tiny import qwen3_pair
from _reference import reference, reference_decode, reference_decoder

from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_reference_tests_skip_where_the_reference_package_is_not_installed(tmp_path,
                                                                           monkeypatch):
    # hide an installed package: then only this test folder is importable as ``dflash``
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if not (Path(p) / "dflash" / "__init__.py").is_file()])
    before = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "dflash"}
    for k in before:
        del sys.modules[k]
    try:
        with pytest.raises(pytest.skip.Exception, match="not installed"):
            reference(tmp_path)
        with pytest.raises(pytest.skip.Exception, match="not installed"):
            reference_decoder(monkeypatch)
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] == "dflash"]:
            del sys.modules[k]
        sys.modules.update(before)


def test_reference_loads_every_weight_and_reproduces_the_logits(tmp_path):
    from lengthwise.dflash.export import export_draft
    from lengthwise.dflash.loss import block_inputs

    target, draft = qwen3_pair()
    export_draft(draft, tmp_path)
    ref, info = reference(tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    assert ref.block_size == 4 and ref.mask_token_id == 63 and ref.target_layer_ids == [1, 2]
    assert ref.rotary_emb.inv_freq.tolist() == draft.rotary.inv_freq.tolist()

    ids = torch.randint(0, 63, (2, 11), generator=torch.Generator().manual_seed(3))
    _, feats = target.forward(ids)
    a, b = 7, 4  # the anchor: context is positions 0..6, the block 7..10
    anchors = torch.full((2, 1), a)
    embeds = block_inputs(draft, target, ids, anchors, b)
    positions = torch.arange(a + b).expand(2, -1)
    with torch.no_grad():
        ours = draft(feats[:, :a], embeds, positions, torch.ones(2, b, a + b, dtype=torch.bool))
        theirs = ref(position_ids=positions, noise_embedding=embeds, target_hidden=feats[:, :a])
    ours_logits = target.lm_head(ours)
    theirs_logits = ref.compute_logits(theirs, target.lm_head)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-6)
    torch.testing.assert_close(theirs_logits, ours_logits, rtol=0, atol=1e-6)


def test_reference_decoding_gives_our_tokens_and_acceptance(tmp_path, monkeypatch):
    from lengthwise.dflash.export import export_draft
    from lengthwise.dflash.speculative import speculative_batch

    dmodel = reference_decoder(monkeypatch)
    target, draft = qwen3_pair(vocab=6, seed=2, block_size=5)
    export_draft(draft, tmp_path)
    ref, _ = reference(tmp_path)
    accepted = []
    for prompt in ([1, 2, 3], [4, 0, 2, 2, 1, 3, 0]):
        ours = speculative_batch(draft, target, [prompt], max_new_tokens=24)[0]
        assert reference_decode(dmodel, ref, target.model, prompt, 24) == (ours.tokens,
                                                                            ours.accepted)
        accepted += ours.accepted
    assert max(accepted) > 1  # the check covers accepted draft tokens, not only rejections


def test_export_config_and_bad_drafts(tmp_path):
    from lengthwise.dflash.export import export_draft, exported_config

    target, draft = qwen3_pair()
    out = export_draft(draft, tmp_path / "bf16", dtype="bfloat16")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": 63, "target_layer_ids": [1, 2],
                                    "block_size": 4}
    assert (cfg["block_size"], cfg["num_target_layers"], cfg["num_hidden_layers"]) == (4, 4, 2)
    assert cfg["rope_theta"] == 1e6 and cfg["vocab_size"] == 64 and cfg["dtype"] == "bfloat16"
    ref, info = reference(out)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    draft.config.mask_token_id = 64
    with pytest.raises(ConfigError, match="mask_token_id 64 is outside the target's vocab"):
        exported_config(draft.config)
    draft.config.mask_token_id = 63
    draft.config.block_size = 2.5
    with pytest.raises(ConfigError, match="block_size 2.5"):
        exported_config(draft.config)
    draft.config.block_size = 1000
    with pytest.raises(ConfigError, match="exceeds max_position_embeddings"):
        exported_config(draft.config)
    with pytest.raises(ConfigError, match="dtype"):
        export_draft(draft, tmp_path / "x", dtype="int8")


def test_every_checkpoint_carries_the_draft_config_and_exports(tmp_path):
    from _dflash_run import config, train

    from lengthwise.dflash.export import export_checkpoint
    from lengthwise.dflash.load import load_draft_checkpoint
    from lengthwise.dflash.model import read_draft_config

    train(config(steps=2, checkpoint_every=1, keep_checkpoints=3), tmp_path / "run")
    for step in (1, 2):
        cfg = read_draft_config(tmp_path / "run" / "checkpoints" / f"step_{step}")
        assert (cfg.block_size, cfg.mask_token_id, cfg.target_layers) == (4, 39, [1, 2])
        assert cfg.target_vocab_size == 40
    out = export_checkpoint(tmp_path / "run", tmp_path / "out")  # the newest checkpoint
    ref, info = reference(out)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    draft = load_draft_checkpoint(tmp_path / "run" / "checkpoints" / "step_2")
    assert ref.fc.weight.equal(draft.fc.weight)
    assert ref.layers[0].mlp.down_proj.weight.equal(draft.layers[0].mlp.down_proj.weight)


def test_checkpoints_without_a_servable_config_are_refused(tmp_path):
    from lengthwise.dflash.load import load_draft_checkpoint
    from lengthwise.dflash.model import read_draft_config

    with pytest.raises(ConfigError, match="no draft_config.json"):
        read_draft_config(tmp_path)
    with pytest.raises(ConfigError, match="no such run"):
        load_draft_checkpoint(tmp_path / "missing")
    with pytest.raises(ConfigError, match="neither a complete checkpoint"):
        load_draft_checkpoint(tmp_path)
    (tmp_path / "draft_config.json").write_text('{"format": "other"}')
    with pytest.raises(ConfigError, match="not a lengthwise-dflash-draft file"):
        read_draft_config(tmp_path)
    _, draft = qwen3_pair()
    old = {**draft.state_dict(), "mask_embedding": torch.zeros(32)}  # a learned mask vector
    with pytest.raises(ConfigError, match="learned mask vector"):
        draft.load_state_dict(old)
