"""Small, randomly initialised Llama-style language models for the demo.

The model is a real ``transformers.LlamaForCausalLM`` built from a local config
(nothing is downloaded); ``--model-size`` picks its width and depth. ``tiny``
trains at a useful speed on two CPU cores; ``large`` (about 350 million
parameters with a 32 K vocabulary) is the size the GPU benchmark uses.

Example::

    >>> model = build_model("tiny", vocab_size=512, max_len=128, seed=0)
    >>> 0 < count_parameters(model) < 1_000_000
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lengthwise.errors import ConfigError

__all__ = ["MODEL_SIZES", "ModelSize", "build_model", "count_parameters"]


@dataclass(frozen=True)
class ModelSize:
    """Width and depth of one model size."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tie_embeddings: bool = True


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=64, layers=2, heads=4, kv_heads=4, intermediate=176),
    "small": ModelSize(hidden=128, layers=4, heads=4, kv_heads=4, intermediate=352),
    "base": ModelSize(hidden=256, layers=6, heads=8, kv_heads=8, intermediate=704),
    "medium": ModelSize(hidden=512, layers=8, heads=8, kv_heads=8, intermediate=1408),
    "large": ModelSize(hidden=1024, layers=24, heads=16, kv_heads=8, intermediate=2816,
                       tie_embeddings=False),
}


def build_model(size: str | ModelSize, *, vocab_size: int, max_len: int, seed: int = 0,
                attn_implementation: str | None = None, dtype: Any = None,
                device: Any = None) -> Any:
    """A fresh ``LlamaForCausalLM`` of ``size``, initialised from ``seed``.

    The same size, vocabulary and seed give bit-identical weights, so every
    order of the demo starts from the same model. ``device`` builds the weights
    there directly (``"meta"`` builds no storage at all, to count parameters).

    Example::

        >>> a = build_model("tiny", vocab_size=300, max_len=64, seed=1)
        >>> b = build_model("tiny", vocab_size=300, max_len=64, seed=1)
        >>> all((x == y).all() for x, y in zip(a.parameters(), b.parameters()))
        True
    """
    import torch
    import transformers

    if isinstance(size, str):
        if size not in MODEL_SIZES:
            raise ConfigError(f"model size must be one of {sorted(MODEL_SIZES)}, got {size!r}")
        size = MODEL_SIZES[size]
    if vocab_size < 2 or max_len < 2:
        raise ConfigError(f"need vocab_size >= 2 and max_len >= 2, got {vocab_size}, {max_len}")
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads, max_position_embeddings=max_len,
        tie_word_embeddings=size.tie_embeddings, pad_token_id=0, bos_token_id=None,
        eos_token_id=0, use_cache=False,
        **({} if attn_implementation is None else {"attn_implementation": attn_implementation}))
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.device(device if device is not None else "cpu"):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    if dtype is not None:
        model = model.to(dtype)
    return model


def count_parameters(model: Any) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
