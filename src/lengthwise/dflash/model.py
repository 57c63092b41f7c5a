"""The DFlash draft: decoder layers whose block queries attend to ``[target context | block]``.

The draft has no embedding and no LM head: block tokens are embedded by the
target's frozen embedding and its hidden states are read out by the target's
frozen LM head. Context comes from the target: the hidden states of a few of
its layers, concatenated, projected by ``fc`` and normalised. In every layer
queries come from the block only; keys and values from the projected context
followed by the block, under a mask built by
:func:`lengthwise.dflash.blocks.block_attention_mask`. Layers are Qwen3-style
(RMSNorm, GQA attention with per-head q/k RMSNorm and RoPE, SwiGLU MLP) from
``transformers`` building blocks.

With ``standardize_features`` the draft multiplies its features by the buffer
``feature_scale``, one over the root mean square of each dimension over the first
training tokens (:func:`feature_scale`; a target's hidden states can carry most of
their squared norm in a few dimensions, SmolLM2-135M: 40-52 % in 2-3 of 576). ``fc``
has no bias, so the features are scaled, not centred: ``fc(x * s) = (W * s) x`` folds
into ``fc`` exactly at export (:func:`folded_state`). :func:`draft_config_json` and
:func:`read_draft_config` write and read ``draft_config.json``, saved with every
checkpoint.

Example::

    >>> import torch
    >>> cfg = DFlashConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
    ...                    intermediate_size=64, num_features=2, block_size=4, mask_token_id=3)
    >>> draft = DFlashDraft(cfg)
    >>> feats, block = torch.randn(1, 6, 64), torch.randn(1, 4, 32)
    >>> pos = torch.arange(10).unsqueeze(0)
    >>> mask = torch.ones(1, 4, 10, dtype=torch.bool)
    >>> draft(feats, block, pos, mask).shape
    torch.Size([1, 4, 32])
"""

from __future__ import annotations

import inspect
import json
import numbers
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from lengthwise.dflash.attention import flex_attend
from lengthwise.dflash.objective import default_gamma, target_layer_ids
from lengthwise.dflash.rope import qwen3_config, rope_settings
from lengthwise.errors import ConfigError, DataError
from lengthwise.train.config import check_positive

__all__ = ["DRAFT_CONFIG", "FORMAT", "SCALE", "DFlashConfig", "DFlashDraft", "check_target",
           "draft_config_json", "feature_scale", "folded_state", "read_draft_config"]

#: file name of the draft's config inside every checkpoint folder
DRAFT_CONFIG = "draft_config.json"
FORMAT = "lengthwise-dflash-draft"
_VERSION = 1
#: the draft's buffer that holds the feature scale (absent from drafts without it)
SCALE = "feature_scale"


def _optional_positive(cfg: object, *names: str) -> None:
    check_positive(cfg, *(n for n in names if getattr(cfg, n) is not None))


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float(
            "inf"):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass
class DFlashConfig:
    """Sizes of a draft model and of its blocks.

    ``hidden_size`` must equal the target's (the draft uses its embedding and
    LM head). ``target_layers`` lists the target layers feeding the context
    (default: ``num_features`` spread by :func:`target_layer_ids`, which needs
    ``num_target_layers``). ``mask_token_id`` is the vocabulary id that fills block
    slots 1..B-1, embedded by the target's frozen embedding (what serving engines
    do; :func:`lengthwise.dflash.mask_token.ensure_mask_token` adds one to a
    tokenizer that has none); a draft cannot be built without it. ``rope_theta``
    and ``rope_scaling`` are the target's rotary settings, ``target_vocab_size`` the
    rows of its embedding (``from_target`` reads them). ``tokenizer`` records the
    tokenizer the draft was trained with (vocabulary size, tokenizer and chat-template
    hashes, from ``prepare.json``), checked against the target's by export and eval;
    ``target_weights`` a record of the weights of the target it was trained on
    (:func:`~lengthwise.dflash.target_match.weights_record`), checked by eval.
    ``standardize_features``: the draft multiplies its features by the buffer
    ``feature_scale`` before ``fc`` (:func:`feature_scale`; export folds it into ``fc``).
    """

    hidden_size: int
    num_layers: int = 1
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int | None = None
    intermediate_size: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 32768
    block_size: int = 16
    gamma: float | None = None
    num_features: int | None = None
    target_layers: list[int] | None = None
    num_target_layers: int | None = None
    mask_token_id: int | None = None
    target_vocab_size: int | None = None
    tokenizer: dict[str, Any] | None = None
    target_weights: dict[str, Any] | None = None
    standardize_features: bool = False  # a per-dimension scale before fc (the buffer feature_scale)

    def __post_init__(self) -> None:
        self._check()
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of "
                                  f"num_heads {self.num_heads}; give head_dim")
            self.head_dim = self.hidden_size // self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads "
                              f"{self.num_kv_heads}")
        if self.intermediate_size is None:
            self.intermediate_size = 3 * self.hidden_size
        if self.gamma is None:
            self.gamma = default_gamma(self.block_size)
        if self.target_layers is None:
            n = self.num_features or self.num_layers
            if self.num_target_layers is not None:
                self.target_layers = target_layer_ids(self.num_target_layers, n)
            else:
                self.num_features = n
        else:
            self.target_layers = [int(i) for i in self.target_layers]
            self.num_features = len(self.target_layers)
        if self.target_layers is not None:
            self.num_features = len(self.target_layers)

    def _check(self) -> None:
        """Refuse a value that cannot build a draft, naming the field (a :class:`ConfigError`)."""
        check_positive(self, "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                       "max_position_embeddings", "block_size")
        _optional_positive(self, "head_dim", "intermediate_size", "num_features",
                           "num_target_layers")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        for name in ("rms_norm_eps", "rope_theta"):
            _positive_number(name, getattr(self, name))
        if self.gamma is not None:
            _positive_number("gamma", self.gamma)
        m = self.mask_token_id
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise ConfigError(f"mask_token_id must be a token id >= 0 or None, got {m!r}")
        if self.target_layers is None:
            return
        layers = list(self.target_layers)
        if not layers:
            raise ConfigError("target_layers is empty: give at least one target layer")
        bad = [i for i in layers
               if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0]
        n = self.num_target_layers
        if n is not None:
            bad += [i for i in layers if i not in bad and i >= n]
        if bad:
            where = f"[0, {n})" if n is not None else "non-negative integers"
            raise ConfigError(f"target_layers {layers}: {bad} not in {where}")

    @classmethod
    def from_target(cls, target_config: Any, **overrides: Any) -> DFlashConfig:
        """Draft sizes matching a Hugging Face target config (heads, widths, RoPE).

        Example::

            >>> import transformers
            >>> t = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=6,
            ...                              num_attention_heads=4, intermediate_size=128)
            >>> DFlashConfig.from_target(t, num_layers=2, block_size=8).target_layers
            [1, 3]
        """
        base = dict(
            hidden_size=target_config.hidden_size,
            num_heads=target_config.num_attention_heads,
            num_kv_heads=getattr(target_config, "num_key_value_heads", None)
            or target_config.num_attention_heads,
            head_dim=getattr(target_config, "head_dim", None),
            intermediate_size=target_config.intermediate_size,
            rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
            **rope_settings(target_config),
            max_position_embeddings=getattr(target_config, "max_position_embeddings", 32768),
            num_target_layers=target_config.num_hidden_layers,
            target_vocab_size=getattr(target_config, "vocab_size", None),
        )
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (saved beside a draft checkpoint)."""
        return asdict(self)

    def qwen3_config(self, vocab_size: int = 1) -> Any:
        """The ``transformers`` ``Qwen3Config`` the draft's building blocks are made from."""
        return qwen3_config(
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            vocab_size=vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings, hidden_act="silu",
            attention_bias=False)


def _autocast_once(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the autocast dtype when autocast would cast it (else as it is).

    Both the key and the value projection read the concatenated context; autocast
    would convert it once per projection and keep both copies for the backward.
    Converting it here gives the same values once.
    """
    kind = x.device.type
    if (torch.is_autocast_enabled(kind) and x.is_floating_point()
            and x.dtype != torch.float64):
        return x.to(torch.get_autocast_dtype(kind))
    return x


class _Attention(nn.Module):
    """Block queries over ``[context | block]`` keys and values, no causal mask."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, cfg.head_dim)
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values ``(b, kv_heads, n, head_dim)`` of the rows ``x``."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def forward(self, x: torch.Tensor, context: torch.Tensor | None,
                rope: tuple[torch.Tensor, ...], bias: torch.Tensor,
                context_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        b, q_len, _ = x.shape
        cos, sin = rope
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.heads, self.head_dim)).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos[:, -q_len:], sin[:, -q_len:])
        if context_kv is None:
            k, v = self.keys_values(_autocast_once(torch.cat([context, x], dim=1)), cos, sin)
        else:  # the context's keys and values computed before (decoding)
            k, v = self.keys_values(x, cos[:, -q_len:], sin[:, -q_len:])
            k, v = torch.cat([context_kv[0], k], dim=2), torch.cat([context_kv[1], v], dim=2)
        groups = self.heads // self.kv_heads
        if isinstance(bias, torch.Tensor):
            out = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups),
                                                 attn_mask=bias)
        else:  # a flex-attention BlockMask (lengthwise.dflash.attention)
            out = flex_attend(q, k, v, bias)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class _Layer(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = _Attention(cfg)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = Qwen3MLP(cfg)

    def forward(self, h: torch.Tensor, context: torch.Tensor | None,
                rope: tuple[torch.Tensor, ...], bias: torch.Tensor, sees: torch.Tensor,
                context_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), context, rope, bias, context_kv) * sees
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    """The draft network: ``forward(features, block_embeds, positions, mask) -> hidden``.

    ``features``: ``(b, L, num_features * H)`` target hidden states of the context;
    ``block_embeds``: ``(b, Q, H)`` embedded block tokens (anchor + mask tokens);
    ``positions``: ``(b, L + Q)`` RoPE positions of context then block slots;
    ``mask``: ``(b, Q, L + Q)`` boolean, which key each block slot may attend to, or the
    same as a flex-attention ``BlockMask`` (:func:`lengthwise.dflash.attention.block_flex_mask`).
    Returns normalised hidden states ``(b, Q, H)`` for the target's LM head. A slot
    whose mask row is all false attends to nothing (its attention output is zero).
    """

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        if cfg.num_features is None:
            raise ConfigError("DFlashConfig needs target_layers, num_features or "
                              "num_target_layers")
        if cfg.mask_token_id is None:
            raise ConfigError("mask_token_id: a draft fills its blocks with a vocabulary mask "
                              "token embedded by the target (give DFlashConfig(mask_token_id=...);"
                              " lengthwise.dflash.mask_token.ensure_mask_token adds one)")
        self.config = cfg
        qcfg = cfg.qwen3_config()
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.num_features * h, h, bias=False)
        if cfg.standardize_features:
            self.register_buffer("feature_scale", torch.ones(cfg.num_features * h))
        self.context_norm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(_Layer(qcfg) for _ in range(cfg.num_layers))
        self.norm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(qcfg)
        self._register_load_state_dict_pre_hook(_refuse_learned_mask)

    def forward(self, features: torch.Tensor | None, block_embeds: torch.Tensor,
                positions: torch.Tensor, mask: torch.Tensor, *,
                context_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                ) -> torch.Tensor:
        """Hidden states of the block slots (class doc).

        ``context_kv``: each layer's keys and values of the context from
        :meth:`context_keys_values` instead of ``features`` (``None``); ``positions`` are
        then the block slots' only, ``(b, Q)``.
        """
        h = block_embeds.to(self.fc.weight.dtype)
        if context_kv is None:
            context = self._context(features)
            h = h.to(context.dtype)
        else:
            context, context_kv = None, list(context_kv)
        rope = self.rotary(h, positions)
        if isinstance(mask, torch.Tensor):
            neg = torch.finfo(h.dtype).min / 2
            bias = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(~mask, neg)
            bias = bias.unsqueeze(1)
            sees = mask.any(dim=-1, keepdim=True).to(h.dtype)  # rows seeing nothing: no attention
        else:  # a BlockMask: flex attention gives rows that see nothing a zero output
            bias, sees = mask, torch.ones((), dtype=h.dtype, device=h.device)
        for i, layer in enumerate(self.layers):
            h = layer(h, context, rope, bias, sees, None if context_kv is None else context_kv[i])
        return self.norm(h)

    def _context(self, features: torch.Tensor) -> torch.Tensor:
        """The context vectors of target features: ``context_norm(fc(features))``."""
        features = features.to(self.fc.weight.dtype)
        if self.config.standardize_features:
            features = features * self.feature_scale.to(features.dtype)
        return self.context_norm(self.fc(features))

    def context_keys_values(self, features: torch.Tensor, positions: torch.Tensor
                            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values ``(b, kv_heads, L, head_dim)`` of context features.

        A context position's keys and values depend on its features and position only,
        so decoding computes them once per position and passes them to :meth:`forward`.

        Example::

            >>> cfg = DFlashConfig(hidden_size=16, num_heads=2, num_kv_heads=1, num_features=1,
            ...                    mask_token_id=0)
            >>> d = DFlashDraft(cfg)
            >>> kv = d.context_keys_values(torch.randn(1, 5, 16), torch.arange(5)[None])
            >>> [tuple(k.shape) for k, _ in kv]
            [(1, 1, 5, 8)]
        """
        context = self._context(features)
        cos, sin = self.rotary(context, positions)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]


def check_target(cfg: DFlashConfig, target: Any) -> None:
    """Refuse a draft config that does not fit ``target`` (a :class:`ConfigError` naming why).

    The draft reads the target's embedding and LM head (same width), its features
    (the same layers), and fills blocks with ``mask_token_id`` (inside the vocabulary).

    Example::

        >>> import transformers
        >>> from lengthwise.dflash.target import Target
        >>> t = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
        ...                              num_attention_heads=2, intermediate_size=32)
        >>> target = Target(transformers.LlamaForCausalLM(t), layers=[0, 1])
        >>> check_target(DFlashConfig(hidden_size=32, target_layers=[0, 1]), target)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: draft hidden_size 32 differs from the target's 16 (the \
draft reads the target's embedding and LM head)
    """
    width = int(target.embed.weight.shape[1])
    if cfg.hidden_size != width:
        raise ConfigError(f"draft hidden_size {cfg.hidden_size} differs from the target's "
                          f"{width} (the draft reads the target's embedding and LM head)")
    n = int(target.model.config.num_hidden_layers)
    if cfg.num_target_layers is not None and cfg.num_target_layers != n:
        raise ConfigError(f"the draft was built for a target of {cfg.num_target_layers} layers;"
                          f" this target has {n}")
    if cfg.target_layers is not None and list(cfg.target_layers) != list(target.layers):
        raise ConfigError(f"the draft reads target layers {cfg.target_layers} but the target "
                          f"gives layers {target.layers}")
    if cfg.num_features != len(target.layers):
        raise ConfigError(f"the draft takes {cfg.num_features} target features but the target "
                          f"gives {len(target.layers)} (layers {target.layers})")
    if cfg.mask_token_id is not None and cfg.mask_token_id >= target.vocab_size:
        raise ConfigError(f"mask_token_id {cfg.mask_token_id} is outside the target's "
                          f"vocabulary of {target.vocab_size} tokens")


def _refuse_learned_mask(state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Refuse weights of a draft that learned its own mask vector (no engine can serve it)."""
    if f"{prefix}mask_embedding" in state_dict:
        raise ConfigError("these draft weights hold a learned mask vector (mask_embedding), "
                          "which serving engines cannot load; drafts now fill blocks with a "
                          "vocabulary mask token id: train the draft again")


def draft_config_json(cfg: DFlashConfig) -> str:
    """The text of ``draft_config.json``: the format, its version and every field of ``cfg``.

    Example::

        >>> c = DFlashConfig(hidden_size=32, num_heads=4, num_kv_heads=2, block_size=4,
        ...                  target_layers=[1], mask_token_id=7)
        >>> json.loads(draft_config_json(c))["draft"]["mask_token_id"]
        7
    """
    return json.dumps({"format": FORMAT, "version": _VERSION, "draft": cfg.to_dict()},
                      indent=2, sort_keys=True) + "\n"


def read_draft_config(path: str | Path) -> DFlashConfig:
    """The :class:`~lengthwise.dflash.model.DFlashConfig` saved in ``path``.

    ``path`` is a ``draft_config.json`` file or the checkpoint folder holding one.
    A folder without one (a checkpoint saved before drafts carried their config)
    or a file in another format raises :class:`~lengthwise.errors.ConfigError`.
    """
    path = Path(path)
    file = path / DRAFT_CONFIG if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{path}: no {DRAFT_CONFIG} (a draft checkpoint saved before drafts "
                          "carried their config cannot be exported; train it again)")
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not readable as JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{file}: not a {FORMAT} file")
    if data.get("version") != _VERSION:
        raise ConfigError(f"{file}: version {data.get('version')!r}; this lengthwise reads "
                          f"version {_VERSION}")
    fields = dict(data["draft"])
    known = set(inspect.signature(DFlashConfig).parameters)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(f"{file}: unknown draft fields {unknown} (written by a newer "
                          "lengthwise?)")
    return DFlashConfig(**fields)


def feature_scale(rows: Iterable[torch.Tensor], *, floor: float = 1e-6) -> torch.Tensor:
    """One over the root mean square of each feature dimension over every row of ``rows``.

    ``rows``: tensors ``(tokens, F)`` of real (not padded) tokens' features; a
    dimension whose root mean square is below ``floor`` keeps the scale ``1 / floor``
    no larger than that (a dimension that is always zero stays zero). No rows is a
    :class:`~lengthwise.errors.DataError`.

    Example::

        >>> rows = [torch.tensor([[3.0, 0.0], [-3.0, 2.0]])]
        >>> feature_scale(rows).tolist()
        [0.3333333432674408, 0.7071067690849304]
    """
    total, count = None, 0
    for r in rows:
        sq = r.double().pow(2).sum(dim=0)
        total = sq if total is None else total + sq
        count += int(r.shape[0])
    if total is None or count == 0:
        raise DataError("standardize_features: no training tokens to measure the features on")
    rms = (total / count).sqrt().clamp(min=floor)
    return (1.0 / rms).float()


def folded_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with ``feature_scale`` folded into ``fc.weight`` and dropped.

    ``fc(x * s) = (W * s) x``: the draft of the folded state, without the scale, gives
    the same output. A state without the scale is returned as it is.

    Example::

        >>> s = {"fc.weight": torch.ones(2, 3), SCALE: torch.tensor([1.0, 2.0, 3.0])}
        >>> folded_state(s)["fc.weight"].tolist(), SCALE in folded_state(s)
        ([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], False)
    """
    if SCALE not in state:
        return state
    out = {k: v for k, v in state.items() if k != SCALE}
    w = state["fc.weight"]
    out["fc.weight"] = (w.double() * state[SCALE].double().to(w.device)[None, :]).to(w.dtype)
    return out
