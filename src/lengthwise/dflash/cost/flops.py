"""The compute of a DFlash training step per micro-batch, in FLOPs, and its cost model for the plan.

A rank's micro-batch of ``R`` padded rows of ``P`` tokens, whose sample ``i`` of ``L_i``
tokens draws ``A_i`` anchors of blocks of ``B`` slots (:func:`anchor_counts`), costs

``F = R*P*(t + x) + R*P*(P+1)/2 * t_att + R*W*B*s + sum_i A_i*B*(L_i/2 + B) * s_att
+ sum_i A_i*(B-1) * h``

- ``t``, ``t_att``: the frozen target's forward per token and its attention per query-key
  pair; ``x``: the draft's context work per token (``fc`` and the layers' key/value
  projections), forward and backward;
- ``s``: the draft's layers per block slot, forward and backward, over the ``W = max_i A_i``
  blocks of a row; ``s_att``: its attention per slot and key it sees (half the sample on
  average, and its own block);
- ``h``: the frozen LM head per supervised slot (forward, recomputed forward, input gradient).

:func:`step_flops` reads them from the run's own modules, built under fake tensors as
``dflash train`` builds them. :meth:`StepFlops.cost_model` is the step as a plan's
:class:`~lengthwise.planning.cost.CostModel` of a row's padded length (without the draft's
attention, about 5 % of a 4,096-token row's step).

Example::

    >>> f = StepFlops.reference()
    >>> round(f.target_token / 1e9, 2), round(f.slot / 1e9, 2), round(f.head / 1e9, 2)
    (13.89, 5.79, 3.73)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthwise.dflash.objective import target_layer_ids
from lengthwise.dflash.train_config import DFlashTrainConfig
from lengthwise.planning.cost import CostModel, round_up

__all__ = ["StepFlops", "anchor_counts", "batch_flops", "step_flops"]


@dataclass(frozen=True)
class StepFlops:
    """FLOPs per unit of a DFlash step: target token, pair, context token, slot, key, head."""

    target_token: float
    target_pair: float
    context_token: float
    slot: float
    slot_key: float
    head: float
    block_size: int

    @classmethod
    def reference(cls) -> StepFlops:
        """Qwen3-8B (36 layers, hidden 4,096, 32 x 128 query and 8 x 128 key/value heads,
        MLP 12,288, vocabulary 151,936), a 5-layer draft of 5 features, blocks of 16."""
        import transformers

        target = transformers.Qwen3Config(
            vocab_size=151936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, intermediate_size=12288)
        return step_flops(target, DFlashTrainConfig(draft_layers=5, block_size=16))

    def cost_model(self, *, num_anchors: int, max_slots: int | None,
                   max_tokens: int) -> CostModel:
        """The step as a row cost ``a*P + b*P**2 + d*min(P, cap)`` of a padded row of ``P``.

            >>> m = StepFlops.reference().cost_model(num_anchors=512, max_slots=32768,
            ...                                      max_tokens=16384)
            >>> m.cap, round(m.d / m.a, 2)
            (4096.0, 1.27)
        """
        b = self.block_size
        # slots a token of the row brings below the cap (no max_slots: a whole block each)
        per_token = (max_slots or b * max_tokens) / max_tokens
        return CostModel(a=self.target_token + self.context_token + self.target_pair / 2,
                         b=self.target_pair / 2,
                         d=per_token * (self.slot + self.head * (b - 1) / b),
                         cap=b * num_anchors / per_token)


def anchor_counts(lengths: np.ndarray, *, num_anchors: int, block_size: int,
                  max_slots: int | None, max_tokens: int,
                  pairs: np.ndarray | None = None) -> np.ndarray:
    """Anchors each sample draws: ``min(num_anchors, L * max_slots // (B * max_tokens))``, at
    most its ``pairs`` (positions with two consecutive supervised tokens; default ``L - 1``).

        >>> anchor_counts(np.array([10, 100, 9000]), num_anchors=512, block_size=16,
        ...               max_slots=32768, max_tokens=16384).tolist()
        [1, 12, 512]
    """
    lens = np.asarray(lengths, dtype=np.int64)
    quota = (np.minimum(num_anchors, lens * max_slots // (block_size * max_tokens))
             if max_slots is not None else np.full(lens.shape, num_anchors, dtype=np.int64))
    have = np.maximum(lens - 1, 0) if pairs is None else np.asarray(pairs, dtype=np.int64)
    return np.minimum(quota, have)


def batch_flops(flops: StepFlops, lengths: np.ndarray, indices: np.ndarray,
                offsets: np.ndarray, anchors: np.ndarray, pad_multiple: int = 1) -> np.ndarray:
    """FLOPs of each padded micro-batch (``indices``/``offsets`` as in a plan; ``anchors`` per
    sample id).

        >>> f = StepFlops(1.0, 0.0, 0.0, 10.0, 0.0, 0.0, block_size=2)
        >>> batch_flops(f, np.array([4, 2]), np.array([0, 1]), np.array([0, 2]),
        ...             np.array([3, 1])).tolist()
        [128.0]
    """
    ids = np.asarray(indices)
    starts = np.asarray(offsets, dtype=np.int64)[:-1]
    lens = np.asarray(lengths, dtype=np.int64)[ids]
    a = np.asarray(anchors, dtype=np.int64)[ids].astype(np.float64)
    rows = np.diff(np.asarray(offsets, dtype=np.int64)).astype(np.float64)
    p = np.asarray(round_up(np.maximum.reduceat(lens, starts), pad_multiple), dtype=np.float64)
    width = np.maximum.reduceat(a, starts)
    b = flops.block_size
    keys = np.add.reduceat(a * b * (lens / 2.0 + b), starts)
    supervised = np.add.reduceat(a * (b - 1), starts)
    return (rows * p * (flops.target_token + flops.context_token)
            + rows * p * (p + 1) / 2 * flops.target_pair
            + rows * width * b * flops.slot + keys * flops.slot_key + supervised * flops.head)


def step_flops(target_config: Any, cfg: Any) -> StepFlops:
    """The :class:`StepFlops` of a target (its ``transformers`` config) and a run's draft
    (``cfg``: a ``DFlashTrainConfig``), read from the modules' weights.

        >>> import transformers
        >>> from lengthwise.dflash.train_config import DFlashTrainConfig
        >>> t = transformers.Qwen3Config(vocab_size=100, hidden_size=16, num_hidden_layers=4,
        ...                              num_attention_heads=2, num_key_value_heads=1,
        ...                              head_dim=8, intermediate_size=32)
        >>> f = step_flops(t, DFlashTrainConfig(draft_layers=1, block_size=4))
        >>> f.target_token == 2 * 4 * (16 * 32 + 16 * 16 + 3 * 16 * 32), f.head == 6 * 16 * 100
        (True, True)
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lengthwise.dflash.cost.memory import fake_causal_lm, fake_draft

    def weights(module: Any) -> int:
        return sum(m.weight.numel() for m in module.modules()
                   if isinstance(m, torch.nn.Linear))

    depth = int(target_config.num_hidden_layers)
    layers = target_layer_ids(depth, cfg.num_features or cfg.draft_layers)
    k = len(layers)
    with FakeTensorMode():
        model = fake_causal_lm(target_config, k, torch.float32)
        draft = fake_draft(target_config, cfg, layers)
    head = model.get_output_embeddings().weight.numel()
    layer = (weights(model) - head) // k  # a target decoder layer's, the draft's alike
    attn = draft.layers[0].self_attn
    q_dim, kv = attn.q_proj.out_features, attn.k_proj.weight.numel() + attn.v_proj.weight.numel()
    n = cfg.draft_layers
    return StepFlops(target_token=2.0 * depth * layer, target_pair=4.0 * q_dim * depth,
                     context_token=3 * 2.0 * (draft.fc.weight.numel() + n * kv),
                     slot=3 * 2.0 * weights(draft.layers), slot_key=3 * 4.0 * q_dim * n,
                     head=3 * 2.0 * head, block_size=int(cfg.block_size))
