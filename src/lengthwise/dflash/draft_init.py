"""How a new draft's weights start: copied from the target's top layers, or outputs at zero.

:func:`warm_start` (``init=target``) copies into draft layer ``i`` the target's
decoder layer ``L - n + i`` (``L`` target layers, ``n`` draft layers: the top
``n``): attention projections, MLP, input and post-attention norms, and the
q/k norms where the target has them. A target without q/k norms (Llama) feeds
its queries and keys to the attention at their own size, while the draft's
norms bring every head's query and key to unit root mean square: with norm
weights of one, SmolLM2-135M's top layers would reach the softmax at a quarter
of their logits' size. The draft's norm weight is one vector shared by every
head, so a head's own size cannot be kept; the weights are set to one constant
each (:func:`attention_scale`), measured on the target's hidden states at the
copied layer's input over training tokens: the draft's logits then have the
root mean square of the target's over every head and causal pair of them.

The final ``norm`` is the target's final norm. ``fc`` maps the deepest fed
target layer's slice of the features by the identity (undoing
``feature_scale`` when the draft has one) and the others by zero, and
``context_norm`` takes the first copied layer's input norm: when the deepest
feature is the first copied layer's input (a 2-layer draft on the default
layers), the context keys and values of draft layer 0 are the ones that target
layer computes. Every size must match the target's (a one-line
:class:`~lengthwise.errors.ConfigError` names the first that does not).

:func:`zero_output` (``zero_init_output``) sets ``o_proj`` and ``down_proj`` of every
draft layer to zero: each layer starts as the identity, and the draft's output is
the final norm of the embedded block.

Example::

    >>> import transformers
    >>> from lengthwise.dflash.model import DFlashConfig, DFlashDraft
    >>> from lengthwise.dflash.target import Target
    >>> t = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=4,
    ...                              num_attention_heads=2, intermediate_size=32)
    >>> target = Target(transformers.LlamaForCausalLM(t), layers=[1, 2])
    >>> draft = DFlashDraft(DFlashConfig.from_target(t, num_layers=2, target_layers=[1, 2],
    ...                                              mask_token_id=39))
    >>> warm_start(draft, target, [torch.arange(30) % 40])
    [2, 3]
    >>> bool((draft.layers[1].mlp.up_proj.weight == target.base.layers[3].mlp.up_proj.weight
    ...       ).all())
    True
    >>> bool(draft.layers[1].self_attn.q_norm.weight[0] < 1)  # a random target's small queries
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb, repeat_kv

from lengthwise.errors import ConfigError, DataError

__all__ = ["CALIBRATION_TOKENS", "attention_scale", "causal_logit_squares", "copied_layers",
           "warm_start", "zero_output"]

#: the parts of a target decoder layer a draft layer copies (q/k norms where they exist)
_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
#: training tokens the copied layers' query and key sizes are measured on (a target
#: without q/k norms)
CALIBRATION_TOKENS = 1024


def copied_layers(num_target_layers: int, draft_layers: int) -> list[int]:
    """The target layers the draft's layers copy: the top ``draft_layers``, in order.

    Example::

        >>> copied_layers(30, 2)
        [28, 29]
    """
    if draft_layers > num_target_layers:
        raise ConfigError(f"init=target: a {draft_layers}-layer draft cannot copy the top "
                          f"layers of a {num_target_layers}-layer target")
    return list(range(num_target_layers - draft_layers, num_target_layers))


def _check_sizes(cfg: Any, tcfg: Any) -> None:
    """Refuse a draft whose layer sizes differ from the target's (naming the first)."""
    heads = tcfg.num_attention_heads
    theirs = {"hidden_size": tcfg.hidden_size, "num_heads": heads,
              "num_kv_heads": getattr(tcfg, "num_key_value_heads", None) or heads,
              "head_dim": getattr(tcfg, "head_dim", None) or tcfg.hidden_size // heads,
              "intermediate_size": tcfg.intermediate_size}
    for name, value in theirs.items():
        if getattr(cfg, name) != value:
            raise ConfigError(f"init=target: the draft's {name} {getattr(cfg, name)} differs "
                              f"from the target's {value}; build the draft with the "
                              "target's sizes or use init=random")


def causal_logit_squares(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, ...]
                         ) -> torch.Tensor:
    """The sum of squared attention logits over every head and causal pair ``(j <= i)``.

    ``q``: ``(1, T, heads, d)`` queries, ``k``: ``(1, T, kv_heads, d)`` keys before
    RoPE; ``rope``: their ``(cos, sin)``. Logits are ``q . k / sqrt(d)`` after RoPE,
    as the draft's attention computes them.

    Example::

        >>> q, k = torch.ones(1, 2, 2, 4), torch.ones(1, 2, 1, 4)
        >>> rope = (torch.ones(1, 2, 4), torch.zeros(1, 2, 4))
        >>> float(causal_logit_squares(q, k, rope))  # 2 heads x 3 pairs of logit 2
        24.0
    """
    q, k = q.transpose(1, 2).float(), k.transpose(1, 2).float()
    q, k = apply_rotary_pos_emb(q, k, rope[0].float(), rope[1].float())
    logits = q @ repeat_kv(k, q.shape[1] // k.shape[1]).transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = q.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    return logits[..., causal].double().pow(2).sum()


@torch.no_grad()
def attention_scale(layer: Any, inputs: Iterable[torch.Tensor], rotary: Any
                    ) -> tuple[float, float]:
    """The q and k norm weights (one constant each) that give ``layer`` the target's logit size.

    ``layer``: a draft layer holding a target layer's weights; ``inputs``: that
    target layer's input hidden states ``(T, H)`` of some texts; ``rotary``: the
    draft's RoPE. With weights ``a`` and ``b`` the draft's logits are ``a * b``
    times those of unit queries and keys, so ``a * b`` is the ratio of the root
    mean squares of the target's logits and of the unit ones, over every head and
    causal pair; ``a`` is the root mean square of the target's queries. The
    layer's q/k norm weights are left at one.

    Example (queries three times as large: ``a`` triples, ``b`` stays)::

        >>> from lengthwise.dflash.model import DFlashConfig, DFlashDraft
        >>> d = DFlashDraft(DFlashConfig(hidden_size=16, num_heads=2, num_kv_heads=1,
        ...                              num_features=1, mask_token_id=0))
        >>> x = [torch.randn(6, 16)]
        >>> a, b = attention_scale(d.layers[0], x, d.rotary)
        >>> _ = d.layers[0].self_attn.q_proj.weight.data.mul_(3)
        >>> a3, b3 = attention_scale(d.layers[0], x, d.rotary)
        >>> round(a3 / a, 4), round(b3 / b, 4)
        (3.0, 1.0)
    """
    attn = layer.self_attn
    attn.q_norm.weight.fill_(1.0)
    attn.k_norm.weight.fill_(1.0)
    dtype = attn.q_proj.weight.dtype
    target, unit, queries, count = 0.0, 0.0, 0.0, 0
    for x in inputs:
        x = layer.input_layernorm(x[None].to(dtype))
        n = x.shape[1]
        q = attn.q_proj(x).view(1, n, attn.heads, attn.head_dim)
        k = attn.k_proj(x).view(1, n, attn.kv_heads, attn.head_dim)
        rope = rotary(x, torch.arange(n, device=x.device)[None])
        target += float(causal_logit_squares(q, k, rope))
        unit += float(causal_logit_squares(attn.q_norm(q), attn.k_norm(k), rope))
        queries += float(q.double().pow(2).sum())
        count += q.numel()
    if count == 0 or unit == 0.0:
        raise DataError("init=target: no training tokens to measure the target's query and "
                        "key sizes on")
    a = math.sqrt(queries / count)
    return a, math.sqrt(target / unit) / a


@torch.no_grad()
def _layer_inputs(target: Any, layers: list[int], samples: Iterable[Any]
                  ) -> dict[int, list[torch.Tensor]]:
    """The input hidden states of target ``layers`` on up to :data:`CALIBRATION_TOKENS`
    tokens of ``samples`` (token-id sequences, each run alone)."""
    out: dict[int, list[torch.Tensor]] = {i: [] for i in layers}
    seen = 0
    for sample in samples:
        ids = torch.as_tensor(sample).reshape(-1)[: CALIBRATION_TOKENS - seen].long()
        if ids.numel():
            hidden = target.base(input_ids=ids[None].to(target.device),
                                 output_hidden_states=True).hidden_states
            for i in layers:  # hidden_states[i]: the input of layer i
                out[i].append(hidden[i][0])
            seen += int(ids.numel())
        if seen >= CALIBRATION_TOKENS:
            break
    return out


@torch.no_grad()
def warm_start(draft: Any, target: Any, samples: Iterable[Any] = ()) -> list[int]:
    """Copy the target's top layers, final norm and deepest feature into ``draft``.

    ``target``: a :class:`~lengthwise.dflash.target.Target`; ``samples``: token-id
    sequences of training text, read up to :data:`CALIBRATION_TOKENS` tokens when the
    target has no q/k norms (a :class:`~lengthwise.errors.DataError` when they hold
    none). Returns the target layers copied (see the module).
    """
    cfg = draft.config
    base = target.base
    _check_sizes(cfg, target.model.config)
    ids = copied_layers(len(base.layers), cfg.num_layers)
    measure = []
    for mine, i in zip(draft.layers, ids, strict=True):
        state = base.layers[i].state_dict()
        missing, unexpected = mine.load_state_dict(state, strict=False)
        if unexpected or set(missing) - set(_NORMS):
            raise ConfigError(f"init=target: target layer {i} does not fit a draft layer "
                              f"(missing {sorted(set(missing) - set(_NORMS))[:3]}, "
                              f"unexpected {sorted(unexpected)[:3]})")
        if missing:
            measure.append((mine, i))
    if measure:
        inputs = _layer_inputs(target, [i for _, i in measure], samples)
        for mine, i in measure:
            a, b = attention_scale(mine, inputs[i], draft.rotary)
            mine.self_attn.q_norm.weight.fill_(a)
            mine.self_attn.k_norm.weight.fill_(b)
    draft.norm.weight.copy_(base.norm.weight)
    draft.context_norm.weight.copy_(base.layers[ids[0]].input_layernorm.weight)
    h = cfg.hidden_size
    deepest = max(range(len(cfg.target_layers)), key=lambda j: cfg.target_layers[j])
    cols = slice(deepest * h, (deepest + 1) * h)
    draft.fc.weight.zero_()
    scale = getattr(draft, "feature_scale", None)
    undo = (torch.ones(h, dtype=draft.fc.weight.dtype, device=draft.fc.weight.device)
            if scale is None else 1.0 / scale[cols].to(draft.fc.weight.dtype))
    draft.fc.weight[:, cols] = torch.diag(undo)
    return ids


@torch.no_grad()
def zero_output(draft: Any) -> None:
    """Set ``o_proj`` and ``down_proj`` of every draft layer to zero (see the module)."""
    for layer in draft.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
