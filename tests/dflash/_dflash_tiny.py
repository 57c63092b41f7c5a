"""Tiny random targets and drafts for the DFlash tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_target(seed: int = 0, vocab: int = 40, layers: int = 4):
    """A random 4-layer Llama-style causal LM (hidden 32)."""
    from lengthwise.dflash.target import Target

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, max_position_embeddings=256,
                                   use_cache=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    return Target(model, layers=[1, 2])


def tiny_draft(target, seed: int = 1, block_size: int = 4, mask_token_id=None):
    """A 1-layer draft for ``target`` (mask token: the last vocabulary id unless given)."""
    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    cfg = DFlashConfig.from_target(target.model.config, num_layers=1, block_size=block_size,
                                   target_layers=target.layers,
                                   mask_token_id=(target.vocab_size - 1 if mask_token_id is None
                                                  else mask_token_id))
    torch.manual_seed(seed)
    return DFlashDraft(cfg)


def qwen3_pair(vocab: int = 64, seed: int = 0, block_size: int = 4, draft_layers: int = 2):
    """A tiny random Qwen3 target (rope_theta 1e6) and a draft for it; mask = the last id."""
    from lengthwise.dflash import DFlashConfig, DFlashDraft, Target

    cfg = transformers.Qwen3Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   intermediate_size=64, max_position_embeddings=256,
                                   rope_theta=1e6)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    target = Target(model, layers=[1, 2])
    dcfg = DFlashConfig.from_target(cfg, num_layers=draft_layers, block_size=block_size,
                                    target_layers=[1, 2], mask_token_id=vocab - 1)
    torch.manual_seed(seed + 1)
    return target, DFlashDraft(dcfg).eval()


def tiny_qwen3_config() -> object:
    """A Qwen3 config of 4 layers, hidden 32, 512 tokens (untied LM head)."""
    return transformers.Qwen3Config(vocab_size=512, hidden_size=32, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    intermediate_size=64, tie_word_embeddings=False)


def config_json(folder: Path, **changes: object) -> Path:
    """The config.json of :func:`tiny_qwen3_config` with ``changes`` (``...`` drops a key)."""
    tiny_qwen3_config().save_pretrained(folder)
    file = folder / "config.json"
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps({k: v for k, v in data.items() if v is not ...}))
    return file


def float64_llama(max_position_embeddings: int):
    """A tiny random Llama (vocabulary 12) in float64, so greedy decoding has no argmax ties."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=12, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64,
                                   max_position_embeddings=max_position_embeddings)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).double().eval()

