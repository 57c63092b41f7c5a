"""The target's own ``generate``: greedy reference, and prompt-lookup decoding as a baseline.

Prompt-lookup (n-gram) speculative decoding needs no draft: the candidates are the
tokens that followed the last ``max_ngram`` tokens where that n-gram occurred earlier
in the text, and the target verifies them in one forward. :func:`prompt_lookup` runs
it as ``transformers`` implements it (``generate(..., prompt_lookup_num_tokens=...)``)
and counts the target's forwards; tokens per forward is its acceptance length, the
figure a trained draft must beat to be worth serving. Greedy, its output is the
target's greedy output; sampled, each token is the target's own draw.

Example::

    >>> import torch, transformers
    >>> from lengthwise.dflash import Target
    >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> _ = torch.manual_seed(0)
    >>> target = Target(transformers.LlamaForCausalLM(cfg), layers=[0, 1])
    >>> out = prompt_lookup(target, [1, 2, 3, 1, 2], max_new_tokens=8, num_tokens=3)
    >>> out.tokens == target_generate(target, [1, 2, 3, 1, 2], 8), out.forwards <= 8
    (True, True)
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from lengthwise.dflash.target import stop_set
from lengthwise.errors import ConfigError

__all__ = ["LOOKUP_NGRAM", "LookupRun", "lookup_candidates", "prompt_lookup",
           "target_generate"]

#: longest n-gram prompt lookup matches (``max_matching_ngram_size``, transformers' default)
LOOKUP_NGRAM = 2


@dataclass
class LookupRun:
    """Tokens after the prompt and the target forwards that made them."""

    tokens: list[int]
    forwards: int

    @property
    def acceptance_length(self) -> float:
        """Tokens per target forward (every forward verifies candidates)."""
        return len(self.tokens) / self.forwards if self.forwards else float("nan")


def target_generate(target: Any, prompt: list[int], max_new_tokens: int,
                    eos: int | Collection[int] | None = None, *, temperature: float = 0.0,
                    **options: Any) -> list[int]:
    """The target's continuation by Hugging Face ``generate`` (KV cache), greedy or sampled.

    Sampling draws from the plain softmax at ``temperature`` (no top-k or top-p);
    ``options`` go to the ``GenerationConfig`` (e.g. ``prompt_lookup_num_tokens``).
    """
    import transformers


    stops = sorted(stop_set(eos))
    sampling = ({"do_sample": True, "temperature": float(temperature), "top_k": 0,
                 "top_p": 1.0} if temperature > 0 else {"do_sample": False})
    config = transformers.GenerationConfig(
        max_new_tokens=max_new_tokens, eos_token_id=stops or None,
        pad_token_id=stops[0] if stops else 0, use_cache=True, **sampling, **options)
    ids = torch.tensor([prompt], device=target.device)
    model = target.model
    # generate fills what a config leaves unset (the stop ids) from the model's own
    saved, model.generation_config = model.generation_config, config
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 generation_config=config)
    finally:
        model.generation_config = saved
    return out[0, len(prompt):].tolist()


def lookup_candidates(seq: list[int], num_tokens: int, max_ngram: int = LOOKUP_NGRAM,
                      ) -> list[int]:
    """Prompt lookup's candidates after ``seq``: up to ``num_tokens`` tokens that followed the
    first earlier occurrence of its last ``k``-gram, ``k`` from ``max_ngram`` down to 1.

    The rule of transformers' ``PromptLookupCandidateGenerator``; ``[]`` without a match.

    Example::

        >>> lookup_candidates([5, 6, 7, 8, 5, 6], 3)
        [7, 8, 5]
        >>> lookup_candidates([1, 2, 3], 3)
        []
    """
    n = len(seq)
    for k in range(min(max_ngram, n - 1), 0, -1):
        tail = seq[n - k:]
        for i in range(n - k):
            if seq[i:i + k] == tail:
                return list(seq[i + k:i + k + num_tokens])
    return []


def prompt_lookup(target: Any, prompt: list[int], *, max_new_tokens: int, num_tokens: int,
                  max_ngram: int = LOOKUP_NGRAM, eos: int | Collection[int] | None = None,
                  temperature: float = 0.0, seed: int = 0) -> LookupRun:
    """Prompt-lookup decoding of one prompt: ``num_tokens`` candidates from ``max_ngram``-grams.

    ``seed`` seeds torch's global generator before a sampled run (``generate`` draws from it).
    """
    if num_tokens < 1 or max_ngram < 1:
        raise ConfigError(f"prompt lookup needs num_tokens >= 1 and max_ngram >= 1, got "
                          f"{num_tokens} and {max_ngram}")
    calls = [0]

    def count(*_: Any, **__: Any) -> None:
        calls[0] += 1

    hook = target.model.register_forward_pre_hook(count)
    try:
        if temperature > 0:
            torch.manual_seed(int(seed))
        tokens = target_generate(target, prompt, max_new_tokens, eos, temperature=temperature,
                                 prompt_lookup_num_tokens=int(num_tokens),
                                 max_matching_ngram_size=int(max_ngram))
    finally:
        hook.remove()
    return LookupRun(tokens=tokens, forwards=calls[0])
