"""The draft's rotary embedding equals the target's, on every transformers version admitted.

Run this file on the lowest version pyproject admits too (see docs/dflash.md).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=32, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512)


def _target(kind: str, theta: float, scaling: dict | None):
    rope: dict = {"rope_theta": theta}
    if scaling is not None:
        rope["rope_scaling"] = dict(scaling)
    if "rope_parameters" in transformers.Qwen3Config().to_dict():  # transformers >= 5
        rope = {"rope_parameters": {"rope_type": "default", **(scaling or {}),
                                    "rope_theta": theta}}
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=8, **SIZES,
                                                                      **rope))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES, **rope))


@pytest.mark.parametrize(("kind", "theta", "scaling"), [
    ("qwen3", 1e6, None),
    ("llama", 5e5, None),
    ("qwen3", 1e6, {"rope_type": "linear", "factor": 2.0}),
    ("llama", 5e5, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
])
def test_draft_rotary_equals_the_targets(kind, theta, scaling, tmp_path):
    from lengthwise.dflash.model import (
        DFlashConfig,
        DFlashDraft,
        draft_config_json,
        read_draft_config,
    )

    model = _target(kind, theta, scaling)
    cfg = DFlashConfig.from_target(model.config, block_size=4, num_features=2,
                                   mask_token_id=31)
    assert cfg.rope_theta == theta
    (tmp_path / "draft_config.json").write_text(draft_config_json(cfg))
    for c in (cfg, read_draft_config(tmp_path)):  # also as saved with a checkpoint
        draft = DFlashDraft(c)
        x = torch.zeros(1, 300, 8)
        pos = torch.arange(300).unsqueeze(0)
        ours = draft.rotary(x, pos)
        theirs = model.model.rotary_emb(x, pos)
        assert draft.rotary.inv_freq.tolist() == model.model.rotary_emb.inv_freq.tolist()
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_config_without_a_rotary_base_is_named():
    from types import SimpleNamespace

    from lengthwise.dflash.rope import rope_settings
    from lengthwise.errors import ConfigError

    with pytest.raises(ConfigError, match="neither rope_theta nor rope_parameters"):
        rope_settings(SimpleNamespace(hidden_size=8))
