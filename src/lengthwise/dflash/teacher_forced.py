"""The draft's teacher-forced evaluation: held-out blocks scored against the target's tokens.

:func:`evaluate_blocks` scores a draft on collated ``(batch, rows)`` pairs: the weighted
loss, top-1 accuracy overall and per block slot, the acceptance length those accuracies
imply (:func:`~lengthwise.dflash.objective.simulated_acceptance_length`) and, at a
temperature, the expected acceptance from the draft's and the target's distributions
(:func:`slot_agreement`). :func:`held_out_batches` collates held-out samples as training
collates its own; :func:`teacher_forced` scores ``prompt + output`` texts within training's
budgets. Real decoding is :mod:`~lengthwise.dflash.speculative`.

Example::

    >>> import numpy as np, torch, transformers
    >>> from lengthwise.dflash import DFlashConfig, DFlashDraft, Target
    >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> target = Target(transformers.LlamaForCausalLM(cfg), layers=[0, 1])
    >>> draft = DFlashDraft(DFlashConfig.from_target(cfg, block_size=4, target_layers=[0, 1],
    ...                                                   mask_token_id=29))
    >>> ev = teacher_forced(draft, target, [[1, 2, 3]], [[4, 5, 6, 7]])
    >>> ev.count > 0, 0.0 <= ev.accuracy <= 1.0, len(ev.slot_accuracy)
    (True, True, 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from lengthwise.dflash.blocks import Blocks, make_blocks
from lengthwise.dflash.head import chunked_agreement
from lengthwise.dflash.loss import HEAD_CHUNK, block_hidden, head_loss, supervised_slots
from lengthwise.dflash.model import check_target
from lengthwise.dflash.objective import simulated_acceptance_length
from lengthwise.errors import ConfigError
from lengthwise.progress import progress as bar
from lengthwise.pytorch.collate import PadCollator

__all__ = ["HELD_OUT_FIRST_ID", "SLOTS_PER_FORWARD", "BlockEval", "check_budgets",
           "evaluate_blocks", "held_out_batches", "slot_agreement", "teacher_forced"]

#: block slots per draft forward of the teacher-forced pass (bounds its attention's size)
SLOTS_PER_FORWARD = 4096


@dataclass
class BlockEval:
    """Teacher-forced figures of a draft on held-out blocks."""

    loss: float
    accuracy: float
    slot_accuracy: list[float]
    simulated_acceptance_length: float
    count: int = 0  # supervised slots scored (the accuracy's denominator)
    weight: float = 0.0  # their summed weight (the loss's denominator)
    #: per block slot 1..B-1, mean ``1 - TV(p_draft, p_target)`` at ``temperature``
    alpha: list[float] | None = None
    expected_acceptance: float | None = None  # 1 + sum_k prod_{j<=k} alpha_j
    temperature: float | None = None


def _anchor_chunks(blocks: Blocks, slots: int | None) -> Iterator[Blocks]:
    """``blocks`` split along the anchors into parts of at most ``slots`` block slots.

    Blocks never see each other, so each part's hidden states are those of the whole.
    """
    r, a, b = blocks.labels.shape
    per = a if slots is None else max(1, slots // (r * b))
    if per >= a:
        yield blocks
        return
    for lo in range(0, a, per):
        part = slice(lo, lo + per)
        yield replace(blocks, anchors=blocks.anchors[:, part], starts=blocks.starts[:, part],
                      labels=blocks.labels[:, part], weights=blocks.weights[:, part],
                      sample_ids=blocks.sample_ids[:, part])


@torch.no_grad()
def evaluate_blocks(draft: Any, target: Any,
                    batches: Iterable[tuple[dict[str, Any], list[list[int]]]],
                    *, num_anchors: int, seed: int = 0, amp: Any = None,
                    head_chunk: int = HEAD_CHUNK, max_slots: int | None = None,
                    max_tokens: int | None = None,
                    slots_per_forward: int | None = None,
                    temperature: float | None = None, features: Any = None) -> BlockEval:
    """Loss, accuracy and per-slot accuracy over collated ``(batch, rows)`` pairs.

    ``max_slots``/``max_tokens``: the draft slots budget of training (see
    :func:`~lengthwise.dflash.blocks.make_blocks`); ``head_chunk``: slots per LM-head chunk;
    ``slots_per_forward``: at most this many block slots per draft forward (the target's
    features computed once per batch), which bounds the attention's time and memory when
    every position is an anchor, and changes no figure. ``temperature``: also the expected
    acceptance at that temperature (:func:`slot_agreement`: ``alpha`` per slot and
    ``1 + sum_k prod_{j<=k} alpha_j``), from the target's distributions at the same
    positions, through the LM head in ``head_chunk`` slots at a time. ``features``: a
    :class:`~lengthwise.dflash.features.CachedRows` that reads the target's features (and
    last hidden states, when cached) instead of running the target.
    """
    cfg = draft.config
    check_target(cfg, target)
    weighted, weight, correct, count = 0.0, 0.0, 0, 0
    slot_c = np.zeros(cfg.block_size, dtype=np.int64)
    slot_n = np.zeros(cfg.block_size, dtype=np.int64)
    slot_alpha = np.zeros(cfg.block_size, dtype=np.float64)
    was = draft.training
    draft.eval()
    try:
        for batch, rows in batches:
            blocks = make_blocks(batch, rows, step=0, seed=seed, num_anchors=num_anchors,
                                 block_size=cfg.block_size, gamma=cfg.gamma,
                                 max_slots=max_slots, max_tokens=max_tokens).to(target.device)
            feats = last = None
            if features is not None:
                feats, last = features(batch, rows, last=temperature is not None)
                dtype = target.embed.weight.dtype
                feats = feats.to(target.device, dtype)
                last = None if last is None else last.to(target.device, dtype)
            if feats is None or (temperature is not None and last is None):
                computed, last = target.features_and_output(
                    blocks.input_ids, attention_mask=blocks.attention_mask,
                    position_ids=blocks.position_ids)
                feats = computed if feats is None else feats
            for part in _anchor_chunks(blocks, slots_per_forward):
                hidden = block_hidden(draft, target, part, amp=amp, feats=feats)
                s = head_loss(hidden, target.lm_head, part.labels, part.weights,
                              chunk=head_chunk, amp=amp)
                if temperature is not None:
                    slot_alpha += slot_agreement(hidden, last, target.lm_head, part,
                                                 temperature=temperature, chunk=head_chunk,
                                                 amp=amp)
                weighted += float(s.weighted)
                weight += s.weight
                correct += s.correct
                count += s.count
                slot_c += s.slot_correct
                slot_n += s.slot_count
    finally:
        draft.train(was)
    acc = np.where(slot_n > 0, slot_c / np.maximum(slot_n, 1), np.nan)[1:]
    out = BlockEval(loss=weighted / weight if weight else float("nan"),
                    accuracy=correct / count if count else float("nan"),
                    slot_accuracy=[float(x) for x in acc],
                    simulated_acceptance_length=simulated_acceptance_length(acc),
                    count=int(count), weight=float(weight))
    if temperature is not None:
        alpha = np.where(slot_n > 0, slot_alpha / np.maximum(slot_n, 1), np.nan)[1:]
        out.alpha = [float(x) for x in alpha]
        out.expected_acceptance = simulated_acceptance_length(alpha)
        out.temperature = float(temperature)
    return out


def slot_agreement(hidden: torch.Tensor, last: torch.Tensor, lm_head: Any, blocks: Blocks, *,
                   temperature: float, chunk: int = HEAD_CHUNK, amp: Any = None) -> np.ndarray:
    """Per block slot, the summed ``1 - TV(p_draft, p_target)`` over the supervised slots.

    ``hidden``: ``(R, A*B, H)`` draft hidden states of ``blocks``; ``last``: ``(R, T, H)``
    the target's final hidden states of ``blocks.input_ids``. Slot ``k`` of the block at
    anchor ``a`` predicts the token at ``a + k``, which the target predicts from position
    ``a + k - 1``; only supervised slots go through the head (:func:`chunked_agreement`).
    """
    b = blocks.labels.shape[-1]
    idx, row, pos, k = supervised_slots(blocks)
    head_w = lm_head.weight
    agree = chunked_agreement(
        hidden.reshape(-1, hidden.shape[-1]).index_select(0, idx).to(head_w.dtype),
        last[row, pos].to(head_w.dtype), head_w, getattr(lm_head, "bias", None),
        temperature=temperature, chunk=chunk, dtype=amp if amp is not None else head_w.dtype)
    sums = torch.zeros(b, dtype=torch.float64, device=agree.device)
    sums.index_add_(0, k, agree.double())
    return sums.cpu().numpy()


#: the sample id of the first held-out sample in its batches (training ids stay below it)
HELD_OUT_FIRST_ID = 10**9


def held_out_batches(samples: list[dict[str, Any]], *, batch_size: int = 8,
                     max_tokens: int | None = None, first_id: int = HELD_OUT_FIRST_ID,
                     ) -> list[tuple[dict[str, Any], list[list[int]]]]:
    """Held-out samples collated by similar length into ``(batch, rows)`` pairs.

    A batch holds at most ``batch_size`` samples and, with ``max_tokens``, at most that
    many padded tokens (the training budget, which the slots budget assumes). ``rows``
    gives each sample an id from ``first_id`` on (anchors are drawn per id).

    Example::
        >>> import numpy as np
        >>> s = [{"input_ids": np.arange(n), "labels": np.arange(n)} for n in (5, 3, 4)]
        >>> [b["input_ids"].shape for b, _ in held_out_batches(s, batch_size=2)]
        [torch.Size([2, 4]), torch.Size([1, 5])]
        >>> [b["input_ids"].shape for b, _ in held_out_batches(s, max_tokens=8)]
        [torch.Size([2, 4]), torch.Size([1, 5])]
    """
    collate = PadCollator(pad_token_id=0, pad_multiple=1)
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["input_ids"]))
    groups: list[list[int]] = []
    for i in order:
        n = len(samples[i]["input_ids"])
        last = groups[-1] if groups else None
        if (last is not None and len(last) < batch_size
                and (max_tokens is None or (len(last) + 1) * n <= max_tokens)):
            last.append(i)
        else:
            groups.append([i])
    return [(collate([samples[i] for i in g]), [[first_id + i] for i in g]) for g in groups]




def teacher_forced(draft: Any, target: Any, prompts: Sequence[list[int]],
                   outputs: Sequence[list[int]], *, batch_size: int = 8,
                   max_tokens: int | None = None, max_slots: int | None = None,
                   head_chunk: int = HEAD_CHUNK,
                   slots_per_forward: int | None = SLOTS_PER_FORWARD,
                   progress: bool = False, temperature: float | None = None) -> Any:
    """:class:`BlockEval` of the draft on ``prompt + output`` texts.

    The outputs are supervised, the prompts are not; every possible anchor is used. The
    budgets are training's: the texts are batched as its held-out samples are
    (:func:`held_out_batches`: by similar length, at most
    ``batch_size`` texts and ``max_tokens`` padded tokens a batch; a longer text is cut to
    ``max_tokens``, as training cuts samples at ``max_len``), and a draft forward holds at
    most ``max_slots`` (and ``slots_per_forward``) block slots, at least one block: a
    batch holds at most that many over ``block_size`` texts, and its anchors are split
    over forwards. Within the budgets the figures are those of one forward per batch.
    ``temperature``: also ``alpha`` and the expected acceptance at that temperature.
    """

    block = draft.config.block_size
    check_budgets(max_tokens, max_slots, block)
    bounds = [s for s in (max_slots, slots_per_forward) if s is not None]
    slots = min(bounds) if bounds else None
    if slots is not None:
        batch_size = min(batch_size, max(1, slots // block))
    samples = []
    for p, o in zip(prompts, outputs, strict=True):
        ids = np.asarray(list(p) + list(o), dtype=np.int64)[:max_tokens]
        labels = ids.copy()
        labels[: len(p)] = -100
        samples.append({"input_ids": ids, "labels": labels})
    batches = held_out_batches(samples, batch_size=batch_size, max_tokens=max_tokens)
    longest = max(s["input_ids"].size for s in samples)
    return evaluate_blocks(draft, target,
                           bar(batches, desc="draft accuracy", unit="batch", enable=progress),
                           num_anchors=longest, head_chunk=head_chunk, slots_per_forward=slots,
                           temperature=temperature)




def check_budgets(max_tokens: int | None, max_slots: int | None, block: int) -> None:
    """Refuse a token budget below one token and a slot budget below one block."""
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
    if max_slots is not None and max_slots < block:
        raise ConfigError(f"max_slots={max_slots} holds no block of block_size={block}; give "
                          "max_slots >= block_size")
