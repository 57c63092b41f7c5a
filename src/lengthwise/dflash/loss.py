"""Draft forward over a micro-batch's blocks, weighted cross-entropy and accuracy.

``block_hidden`` runs the frozen target once (context features), embeds every
block (its anchor token, then mask tokens) with the target's embedding and runs
the draft under :func:`~lengthwise.dflash.blocks.block_attention_mask`.
``head_loss`` reads the supervised slots (only those) through the target's LM
head in chunks (:mod:`~lengthwise.dflash.head`): slots x vocabulary logits are
never held, and unused or unsupervised slots cost no LM-head work. ``block_logits``
and ``block_loss`` are the dense path (every slot's logits at once), kept as the
reference the chunked one is tested against.

``head_loss`` and ``block_loss`` return *sums*, not means: the weighted cross-entropy
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

from lengthwise.dflash.attention import block_flex_mask, use_flex
from lengthwise.dflash.blocks import Blocks, block_attention_mask
from lengthwise.dflash.head import chunked_cross_entropy
from lengthwise.dflash.objective import IGNORE

__all__ = ["BlockLoss", "block_hidden", "block_inputs", "block_logits", "block_loss",
           "head_loss", "supervised_cross_entropy", "supervised_slots", "target_slot_hidden"]

#: supervised slots per LM-head chunk (about 1.7 GiB of fp32 buffers at vocabulary 151,936)
HEAD_CHUNK = 1024


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


def block_hidden(draft: Any, target: Any, blocks: Blocks, *, net: Any = None,
                 amp: Any = None, flex: bool | None = None,
                 feats: torch.Tensor | None = None) -> torch.Tensor:
    """Draft hidden states ``(R, A*B, H)`` of every block slot (``net``: ``draft`` in DDP).

    ``flex``: attend under the block-sparse flex-attention mask instead of the dense one
    (default: on CUDA, see :mod:`~lengthwise.dflash.attention`); ``feats``: the target's
    features of ``blocks.input_ids`` when already computed.
    """
    b = draft.config.block_size
    if feats is None:
        feats = target.features(blocks.input_ids, attention_mask=blocks.attention_mask,
                                position_ids=blocks.position_ids)
    anchors = blocks.anchors
    base = blocks.position_ids.gather(1, anchors.clamp(min=0))
    slot_pos = (base.unsqueeze(-1) + torch.arange(b, device=base.device)).flatten(1)
    positions = torch.cat([blocks.position_ids, slot_pos], dim=1)
    context_len = blocks.input_ids.shape[1]
    if use_flex(anchors.device) if flex is None else flex:
        mask = block_flex_mask(anchors, blocks.starts, context_len, b)
    else:
        mask = block_attention_mask(anchors, blocks.starts, context_len, b)
    embeds = block_inputs(draft, target, blocks.input_ids, anchors, b)
    device_type = embeds.device.type
    with torch.autocast(device_type, dtype=amp, enabled=amp is not None):
        return (net or draft)(feats, embeds, positions, mask)


def block_logits(draft: Any, target: Any, blocks: Blocks, *, net: Any = None,
                 amp: Any = None) -> torch.Tensor:
    """Dense draft logits ``(R, A*B, V)`` of every block slot (the reference path)."""
    hidden = block_hidden(draft, target, blocks, net=net, amp=amp)
    with torch.autocast(hidden.device.type, dtype=amp, enabled=amp is not None):
        return target.lm_head(hidden.to(target.lm_head.weight.dtype))


def supervised_slots(blocks: Blocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                              torch.Tensor]:
    """``(idx, row, pos, k)`` of the supervised block slots, in flat ``(R*A*B)`` order.

    Slot ``k`` of the block at anchor ``a`` in row ``row`` predicts the token at ``a + k``,
    which the target predicts from its hidden state at ``pos = a + k - 1``.
    """
    r, a, b = blocks.labels.shape
    idx = (blocks.labels.reshape(-1) != IGNORE).nonzero().squeeze(1)
    row, within = idx // (a * b), idx % (a * b)
    k = within % b
    pos = blocks.anchors.clamp(min=0)[row, within // b] + k - 1
    return idx, row, pos, k


def target_slot_hidden(blocks: Blocks, last: torch.Tensor) -> torch.Tensor:
    """The target's last hidden states ``(N, H)`` behind each supervised slot's token.

    ``last``: ``(R, T, H)`` the target's final hidden states of ``blocks.input_ids``;
    row ``i`` of the result belongs to the ``i``-th supervised slot (:func:`supervised_slots`).
    """
    _, row, pos, _ = supervised_slots(blocks)
    return last[row, pos]


def head_loss(hidden: torch.Tensor, lm_head: Any, labels: torch.Tensor, weights: torch.Tensor,
              *, chunk: int = HEAD_CHUNK, amp: Any = None,
              soft: torch.Tensor | None = None) -> BlockLoss:
    """:func:`block_loss` of ``lm_head(hidden)`` computed on supervised slots in chunks.

    ``hidden``: ``(R, A*B, H)`` from :func:`block_hidden`; ``amp``: the autocast dtype the
    head runs in (as in :func:`block_logits`). Equal to the dense path to rounding.
    ``soft``: the target's hidden states behind the supervised slots
    (:func:`target_slot_hidden`): each slot's loss is then ``KL(p_target || p_draft)``.
    """
    r, a, b = labels.shape
    lab = labels.reshape(-1)
    w = weights.reshape(-1).float()
    sup = lab != IGNORE
    idx = sup.nonzero().squeeze(1)
    weighted, ce, hit = supervised_cross_entropy(hidden, lm_head, lab, w, idx, chunk=chunk,
                                                 amp=amp, soft=soft)
    per_slot = torch.zeros(r * a * b, dtype=ce.dtype, device=hidden.device)
    per_slot.index_copy_(0, idx, ce * w.index_select(0, idx))
    hits = torch.zeros(r * a * b, dtype=torch.bool, device=hidden.device)
    hits.index_copy_(0, idx, hit)
    hit3, sup3 = hits.reshape(r, a, b), sup.reshape(r, a, b)
    return BlockLoss(
        weighted=weighted, weight=float(w.sum()), correct=int(hits.sum()), count=int(idx.numel()),
        slot_correct=hit3.sum(dim=(0, 1)).cpu().numpy().astype(np.int64),
        slot_count=sup3.sum(dim=(0, 1)).cpu().numpy().astype(np.int64),
        block_ce=per_slot.reshape(r, a, b).sum(dim=-1))


def supervised_cross_entropy(hidden: torch.Tensor, lm_head: Any, labels: torch.Tensor,
                             weights: torch.Tensor, idx: torch.Tensor, *, chunk: int = HEAD_CHUNK,
                             amp: Any = None, soft: torch.Tensor | None = None,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`~lengthwise.dflash.head.chunked_cross_entropy` of the slots ``idx`` of ``hidden``.

    ``hidden``: ``(R, A*B, H)``; ``labels``, ``weights``: flat ``(R*A*B,)``; ``idx``: the
    flat indices of the supervised slots. Returns the weighted sum, the per-slot CE and
    the top-1 hits of those slots (what :func:`head_loss` turns into its sums).
    """
    head_w = lm_head.weight
    dtype = amp if amp is not None else head_w.dtype
    flat = hidden.reshape(-1, hidden.shape[-1])
    return chunked_cross_entropy(
        flat.index_select(0, idx).to(head_w.dtype), head_w, getattr(lm_head, "bias", None),
        labels.index_select(0, idx), weights.index_select(0, idx), chunk=chunk, dtype=dtype,
        soft=None if soft is None else soft.to(head_w.dtype))


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
