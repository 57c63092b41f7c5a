"""Draft forward over a micro-batch's blocks, weighted cross-entropy and accuracy.

``block_logits`` runs the frozen target once (context features), embeds every
block (its anchor token, then mask tokens) with the target's embedding, runs
the draft under :func:`~lengthwise.dflash.blocks.block_attention_mask` and reads
the draft's output through the target's LM head.

``block_loss`` returns *sums*, not means: the weighted cross-entropy
``sum(w * CE)`` and the weight ``sum(w)``, the number of correct top-1
predictions and of supervised slots (accuracy is unweighted), and the same per
slot. The training loop divides the first by the total weight of the whole
optimizer step over every rank and micro-batch, so every token weighs the same
wherever it lands.

Example::

    >>> import torch
    >>> from lengthwise.dflash.objective import IGNORE
    >>> logits = torch.zeros(1, 3, 4); logits[0, 1, 2] = 5.0
    >>> labels = torch.tensor([[[IGNORE, 2, 1]]]); weights = torch.tensor([[[0.0, 1.0, 0.5]]])
    >>> s = block_loss(logits, labels, weights)
    >>> s.correct, s.count, round(s.weight, 2)
    (1, 2, 1.5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from lengthwise.dflash.blocks import Blocks, block_attention_mask
from lengthwise.dflash.objective import IGNORE

__all__ = ["BlockLoss", "block_inputs", "block_logits", "block_loss"]


@dataclass
class BlockLoss:
    """Sums over one micro-batch (see the module docstring)."""

    weighted: torch.Tensor  # sum(w * CE), differentiable
    weight: float
    correct: int
    count: int
    slot_correct: np.ndarray  # (B,)
    slot_count: np.ndarray  # (B,)
    block_ce: torch.Tensor  # (R, A) weighted CE sum per block, detached


def block_inputs(draft: Any, target: Any, input_ids: torch.Tensor, anchors: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Embedded blocks ``(R, A*B, H)``: the anchor token, then ``B - 1`` mask tokens."""
    emb = target.embed
    first = emb(input_ids.gather(1, anchors.clamp(min=0)))  # (R, A, H)
    fill = emb.weight[draft.config.mask_token_id].to(first.dtype)  # the mask token's row
    r, a, h = first.shape
    rest = fill.expand(r, a, block_size - 1, h)
    return torch.cat([first.unsqueeze(2), rest], dim=2).reshape(r, a * block_size, h)


def block_logits(draft: Any, target: Any, blocks: Blocks, *, net: Any = None,
                 amp: Any = None) -> torch.Tensor:
    """Draft logits ``(R, A*B, V)`` of every block slot (``net``: ``draft`` wrapped in DDP)."""
    b = draft.config.block_size
    feats = target.features(blocks.input_ids, attention_mask=blocks.attention_mask,
                            position_ids=blocks.position_ids)
    anchors = blocks.anchors
    base = blocks.position_ids.gather(1, anchors.clamp(min=0))
    slot_pos = (base.unsqueeze(-1) + torch.arange(b, device=base.device)).flatten(1)
    positions = torch.cat([blocks.position_ids, slot_pos], dim=1)
    mask = block_attention_mask(anchors, blocks.starts, blocks.input_ids.shape[1], b)
    embeds = block_inputs(draft, target, blocks.input_ids, anchors, b)
    device_type = embeds.device.type
    with torch.autocast(device_type, dtype=amp, enabled=amp is not None):
        hidden = (net or draft)(feats, embeds, positions, mask)
        return target.lm_head(hidden.to(target.lm_head.weight.dtype))


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> BlockLoss:
    """Weighted cross-entropy sums and unweighted top-1 counts of ``(R, A*B, V)`` logits."""
    r, a, b = labels.shape
    flat = logits.float().reshape(r * a * b, -1)
    lab = labels.reshape(-1)
    ce = F.cross_entropy(flat, lab.clamp(min=0), reduction="none")
    w = weights.reshape(-1).to(ce.dtype)
    sup = lab != IGNORE
    weighted = (ce * w).sum()
    hit = (flat.argmax(dim=-1) == lab) & sup
    hit3, sup3 = hit.reshape(r, a, b), sup.reshape(r, a, b)
    return BlockLoss(
        weighted=weighted, weight=float(w.sum()), correct=int(hit.sum()), count=int(sup.sum()),
        slot_correct=hit3.sum(dim=(0, 1)).cpu().numpy().astype(np.int64),
        slot_count=sup3.sum(dim=(0, 1)).cpu().numpy().astype(np.int64),
        block_ce=(ce * w).detach().reshape(r, a, b).sum(dim=-1))
