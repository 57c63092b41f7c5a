"""Speculative decoding with a DFlash draft, and the draft's teacher-forced evaluation.

:func:`speculative_generate`: the target's prefill gives the first token; then
every cycle the draft proposes ``B - 1`` tokens in one forward from the last
token (the anchor) and the target's features of everything before it, the
target scores anchor and proposal in one forward, and the longest prefix of
the proposal that matches the target's own greedy choices is kept, plus one
token of the target's. The output is therefore exactly the target's greedy
output, and the tokens kept per verifying forward is the *acceptance length*.
(No KV cache: every forward reruns the whole sequence, which changes the cost,
not the tokens.)

:func:`evaluate_blocks`: teacher-forced top-1 accuracy of every block slot on
held-out samples, the weighted loss, and the acceptance length those
accuracies imply (:func:`~lengthwise.dflash.objective.simulated_acceptance_length`).

Example::

    >>> import torch, transformers
    >>> from lengthwise.dflash import DFlashConfig, DFlashDraft, Target
    >>> cfg = transformers.LlamaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> target = Target(transformers.LlamaForCausalLM(cfg), layers=[0, 1])
    >>> draft = DFlashDraft(DFlashConfig.from_target(cfg, block_size=4, target_layers=[0, 1],
    ...                                                   mask_token_id=29))
    >>> out = speculative_generate(draft, target, [1, 2, 3], max_new_tokens=12)
    >>> out.tokens == target.greedy([1, 2, 3], 12), 1.0 <= out.acceptance_length <= 4
    (True, True)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from lengthwise.dflash.blocks import Blocks, block_attention_mask, make_blocks
from lengthwise.dflash.head import chunked_agreement
from lengthwise.dflash.loss import (
    HEAD_CHUNK,
    block_hidden,
    block_inputs,
    head_loss,
    supervised_slots,
)
from lengthwise.dflash.model import check_target
from lengthwise.dflash.objective import simulated_acceptance_length
from lengthwise.dflash.target import stop_set
from lengthwise.errors import ConfigError

__all__ = ["BlockEval", "Generation", "acceptance", "check_decoding", "evaluate_blocks",
           "slot_agreement", "speculative_generate"]


@dataclass
class Generation:
    """Tokens generated after the prompt, and what the verification kept per target forward."""

    tokens: list[int]
    target_forwards: int
    accepted: list[int] = field(default_factory=list)  # tokens kept by each verifying forward
    #: proposed tokens each verification kept, before a stop token or the limit cut them
    drafted: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per verifying target forward (``nan`` when there was none)."""
        return float(np.mean(self.accepted)) if self.accepted else float("nan")


@torch.no_grad()
def _propose(draft: Any, target: Any, seq: list[int], feats: torch.Tensor) -> list[int]:
    b = draft.config.block_size
    a = len(seq) - 1
    device = target.device
    ids = torch.tensor([seq], device=device)
    anchors = torch.tensor([[a]], device=device)
    positions = torch.cat([torch.arange(a, device=device),
                           a + torch.arange(b, device=device)]).unsqueeze(0)
    mask = block_attention_mask(anchors, torch.zeros_like(anchors), a, b)
    hidden = draft(feats[:, :a], block_inputs(draft, target, ids, anchors, b), positions, mask)
    logits = target.lm_head(hidden.to(target.lm_head.weight.dtype))
    return logits[0, 1:].argmax(dim=-1).tolist()


def check_decoding(draft: Any, target: Any, prompt: Any, max_new_tokens: Any) -> None:
    """Refuse decoding parameters that cannot work, naming them (a ``ConfigError``).

    Example::

        >>> check_decoding(None, None, [], 8)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: prompt is empty: give at least one token id
    """
    if prompt is None or len(prompt) == 0:
        raise ConfigError("prompt is empty: give at least one token id")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 1):
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if draft is None:
        return
    check_target(draft.config, target)
    vocab = target.vocab_size
    bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, (int, np.integer))
           or not 0 <= t < vocab]
    if bad:
        raise ConfigError(f"prompt token {bad[0]!r} is not a token id of the target's "
                          f"vocabulary [0, {vocab})")


@torch.no_grad()
def speculative_generate(draft: Any, target: Any, prompt: list[int], *, max_new_tokens: int,
                         eos: int | Collection[int] | None = None) -> Generation:
    """Generate up to ``max_new_tokens`` greedily, drafting with ``draft`` (see the module doc).

    ``eos``: a stop token id, or several; generation ends after the first one.
    """
    check_decoding(draft, target, prompt, max_new_tokens)
    stops = stop_set(eos)
    device = target.device
    logits, feats = target.forward(torch.tensor([list(prompt)], device=device))
    seq = [*prompt, int(logits[0, -1].argmax())]
    out = Generation(tokens=[seq[-1]], target_forwards=1)
    while len(out.tokens) < max_new_tokens and seq[-1] not in stops:
        a = len(seq) - 1
        proposal = _propose(draft, target, seq, feats)
        logits, feats = target.forward(torch.tensor([seq + proposal], device=device))
        out.target_forwards += 1
        greedy = logits[0, a:].argmax(dim=-1).tolist()  # the target's token after a, a+1, ...
        n = 0
        while n < len(proposal) and proposal[n] == greedy[n]:
            n += 1
        out.drafted.append(n)
        new = proposal[:n] + [greedy[n]]
        ends = [i for i, t in enumerate(new) if t in stops]
        if ends:
            new = new[:ends[0] + 1]
        new = new[:max_new_tokens - len(out.tokens)]
        out.accepted.append(len(new))
        out.tokens.extend(new)
        seq.extend(new)
    return out


def acceptance(draft: Any, target: Any, prompts: list[list[int]], *, max_new_tokens: int,
               eos: int | Collection[int] | None = None, check: bool = True,
               ) -> dict[str, Any]:
    """Acceptance length over ``prompts`` and whether every output equals the target's greedy one.

    ``acceptance_length`` pools the verifying forwards of every prompt (tokens kept
    / forwards); ``lossless`` is ``None`` when ``check`` is off.
    """
    for prompt in prompts:
        check_decoding(draft, target, prompt, max_new_tokens)
    kept, forwards, same = 0, 0, True
    was = draft.training
    draft.eval()
    try:
        for prompt in prompts:
            gen = speculative_generate(draft, target, prompt, max_new_tokens=max_new_tokens,
                                       eos=eos)
            kept += sum(gen.accepted)
            forwards += len(gen.accepted)
            if check:
                same = same and gen.tokens == target.greedy(prompt, max_new_tokens, eos)
    finally:
        draft.train(was)
    return {"acceptance_length": kept / forwards if forwards else float("nan"),
            "verify_forwards": forwards, "prompts": len(prompts),
            "lossless": same if check else None}


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
