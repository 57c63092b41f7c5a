"""The mask token: a vocabulary id that fills draft blocks, embedded by the target's embedding.

Serving engines (the reference ``dflash`` package, SGLang, vLLM) fill slots
``1 .. B-1`` of every block with ``mask_token_id`` and embed them with the
target's frozen embedding, so a servable draft trains the same way.
:func:`ensure_mask_token` finds the tokenizer's mask token or adds ``<|MASK|>``
(as the reference drafts for Qwen3 do: id 151669, a padding row of the target's
151,936-row embedding); when the new id lies beyond the target's embedding,
the target's embedding and LM head grow by the rows needed (save that target
with the draft: the engine must embed the id).

Example::

    >>> from tokenizers import Tokenizer, models
    >>> tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    >>> ensure_mask_token(tok)
    MaskToken(id=2, token='<|MASK|>', added=True, resized=False)
    >>> ensure_mask_token(tok).added
    False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lengthwise.errors import ConfigError

__all__ = ["MASK_TOKEN", "MaskToken", "check_mask_token", "ensure_mask_token", "grow_vocabulary"]

#: the token the reference drafts add when a tokenizer has no mask token
MASK_TOKEN = "<|MASK|>"


@dataclass(frozen=True)
class MaskToken:
    """The mask token's id and text; whether it was added to the tokenizer and the target grown."""

    id: int
    token: str
    added: bool
    resized: bool


def ensure_mask_token(tokenizer: Any, model: Any = None) -> MaskToken:
    """The tokenizer's mask token, adding ``<|MASK|>`` as a special token when it has none.

    ``tokenizer``: a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``. With
    ``model`` (the target), an id beyond its embedding grows the embedding and LM
    head (``resize_token_embeddings``) so that the target can embed it.
    """
    if hasattr(tokenizer, "add_special_tokens") and hasattr(tokenizer, "convert_tokens_to_ids"):
        token, tid, added = _hf_mask(tokenizer)
    elif hasattr(tokenizer, "token_to_id"):
        tid = tokenizer.token_to_id(MASK_TOKEN)
        added = tid is None
        if added:
            tokenizer.add_special_tokens([MASK_TOKEN])
            tid = tokenizer.token_to_id(MASK_TOKEN)
        token = MASK_TOKEN
    else:
        raise ConfigError(f"tokenizer: {type(tokenizer).__name__} is neither a transformers "
                          "tokenizer nor a tokenizers.Tokenizer")
    resized = model is not None and grow_vocabulary(model, int(tid) + 1)
    return MaskToken(id=int(tid), token=token, added=added, resized=resized)


def grow_vocabulary(model: Any, rows: int) -> bool:
    """Grow a causal LM's embedding and LM head to ``rows`` rows; ``False`` if it has them.

    New embedding rows are the mean of the old ones; new LM head rows too, so a new
    token's logit is the mean of the others' and greedy decoding never picks it.

    Example::

        >>> import transformers
        >>> m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        ...     vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...     intermediate_size=16))
        >>> grow_vocabulary(m, 12), m.get_input_embeddings().weight.shape[0]
        (True, 12)
    """
    import torch

    old = int(model.get_input_embeddings().weight.shape[0])
    if rows <= old:
        return False
    model.resize_token_embeddings(rows, mean_resizing=False)
    with torch.no_grad():
        for layer in {id(m): m for m in (model.get_input_embeddings(),
                                         model.get_output_embeddings()) if m is not None}.values():
            layer.weight[old:] = layer.weight[:old].mean(dim=0)
            bias = getattr(layer, "bias", None)
            if bias is not None:
                bias[old:] = bias[:old].mean()
    return True


def _hf_mask(tokenizer: Any) -> tuple[str, int, bool]:
    existing = getattr(tokenizer, "mask_token", None)
    if existing is not None and getattr(tokenizer, "mask_token_id", None) is not None:
        return str(existing), int(tokenizer.mask_token_id), False
    vocab = tokenizer.get_vocab()
    if MASK_TOKEN in vocab:
        return MASK_TOKEN, int(vocab[MASK_TOKEN]), False
    tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    return MASK_TOKEN, int(tokenizer.convert_tokens_to_ids(MASK_TOKEN)), True


def check_mask_token(mask_token_id: Any, vocab_size: int, *, where: str = "mask_token_id") -> int:
    """``mask_token_id`` as an int, or a :class:`~lengthwise.errors.ConfigError` naming ``where``.

    It must index a row of the target's embedding (``0 <= id < vocab_size``).

    Example::

        >>> check_mask_token(5, 10)
        5
        >>> check_mask_token(10, 10)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: mask_token_id 10 is outside the target's vocabulary [0, 10)
    """
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise ConfigError(f"{where} must be an integer token id, got {mask_token_id!r}")
    if not 0 <= mask_token_id < vocab_size:
        raise ConfigError(f"{where} {mask_token_id} is outside the target's vocabulary "
                          f"[0, {vocab_size})")
    return int(mask_token_id)
