"""How a new draft's weights start: copied from the target's top layers, or outputs at zero.

:func:`warm_start` (``init=target``) copies into draft layer ``i`` the target's
decoder layer ``L - n + i`` (``L`` target layers, ``n`` draft layers: the top
``n``): attention projections, MLP, input and post-attention norms, and the
q/k norms where the target has them (a Llama target has none: they stay ones,
so each head's queries and keys reach the attention at unit root mean square).
The final ``norm`` is the target's final norm. ``fc`` maps the deepest fed
target layer's slice of the features by the identity (undoing
``feature_scale`` when the draft has one) and the others by zero, and
``context_norm`` takes the first copied layer's input norm: the context keys and
values of draft layer 0 are then the ones that target layer would compute from
that hidden state. Every size must match the target's (a one-line
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
    >>> warm_start(draft, target)
    [2, 3]
    >>> bool((draft.layers[1].mlp.up_proj.weight == target.base.layers[3].mlp.up_proj.weight
    ...       ).all())
    True
"""

from __future__ import annotations

from typing import Any

import torch

from lengthwise.errors import ConfigError

__all__ = ["copied_layers", "warm_start", "zero_output"]

#: the parts of a target decoder layer a draft layer copies (q/k norms where they exist)
_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


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


@torch.no_grad()
def warm_start(draft: Any, target: Any) -> list[int]:
    """Copy the target's top layers, final norm and deepest feature into ``draft``.

    ``target``: a :class:`~lengthwise.dflash.target.Target`. Returns the target layers
    copied (see the module).
    """
    cfg = draft.config
    base = target.base
    _check_sizes(cfg, target.model.config)
    ids = copied_layers(len(base.layers), cfg.num_layers)
    for mine, i in zip(draft.layers, ids, strict=True):
        state = base.layers[i].state_dict()
        missing, unexpected = mine.load_state_dict(state, strict=False)
        if unexpected or set(missing) - set(_NORMS):
            raise ConfigError(f"init=target: target layer {i} does not fit a draft layer "
                              f"(missing {sorted(set(missing) - set(_NORMS))[:3]}, "
                              f"unexpected {sorted(unexpected)[:3]})")
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
