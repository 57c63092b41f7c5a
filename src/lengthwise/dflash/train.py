"""Train a DFlash draft on lengthwise's loop: planned micro-batches, target features on the fly.

:class:`DFlashTask` plugs the DFlash objective into
:class:`~lengthwise.train.loop.TrainLoop`, the loop the causal-LM demo uses too
(``BucketBatchSampler`` with its collator, ``StepLogger``, warm-up then cosine,
asynchronous checkpoints with exact resume, ``SpikeGuard``, DDP under
``torchrun``). Per micro-batch it draws each sample's anchors for the step,
runs the frozen target on the same micro-batch for the context features (or reads
them from a feature cache: :mod:`~lengthwise.dflash.features`), and
returns the weighted cross-entropy *sum* (LM head and cross-entropy in chunks
of ``head_chunk`` supervised slots, never slots x vocabulary); the loop divides
by the slot weight of the whole step over every rank and micro-batch. With
``max_slots`` no micro-batch's blocks hold more draft slots than that
(:func:`~lengthwise.dflash.objective.anchor_quota`). The step record gets
``accuracy`` (unweighted teacher-forced top-1 over the supervised slots,
reduced over ranks), ``acc_slot_k`` per block slot, ``slots`` (draft slots of
the anchors drawn, over the step) and ``slot_efficiency`` (those slots over
the slots the block tensors hold).

Its settings are :class:`~lengthwise.dflash.train_config.DFlashTrainConfig`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lengthwise.dflash.blocks import make_blocks
from lengthwise.dflash.loss import block_hidden, head_loss, target_slot_hidden
from lengthwise.dflash.mask_token import check_mask_token
from lengthwise.dflash.objective import IGNORE, anchor_candidates
from lengthwise.dflash.train_config import DFlashTrainConfig
from lengthwise.errors import ConfigError, DataError
from lengthwise.train.config import PACKED
from lengthwise.train.loop import MicroOut

__all__ = ["DFlashTask", "check_budget", "check_supervised"]


class DFlashTask:
    """The DFlash objective for :class:`~lengthwise.train.loop.TrainLoop` (model = the draft)."""

    def __init__(self, draft: Any, target: Any, cfg: DFlashTrainConfig, *, order: str,
                 amp: Any = None, features: Any = None) -> None:
        from lengthwise.dflash.model import check_target

        d = draft.config
        if cfg.block_size != d.block_size:
            raise ConfigError(f"block_size={cfg.block_size} but the draft was built for blocks "
                              f"of {d.block_size}; build the draft with block_size="
                              f"{cfg.block_size} or train with block_size={d.block_size}")
        if cfg.draft_layers != d.num_layers:
            raise ConfigError(f"draft_layers={cfg.draft_layers} but the draft has "
                              f"{d.num_layers} layers")
        if cfg.num_features is not None and cfg.num_features != d.num_features:
            raise ConfigError(f"num_features={cfg.num_features} but the draft reads "
                              f"{d.num_features} target layers")
        check_target(d, target)
        if cfg.labels == "target_kl" and (features is None or not features.cache.has_last):
            raise ConfigError("labels=target_kl needs --features: a feature cache holding the "
                              "target's last hidden state (`dflash features` without "
                              "--no-last-hidden)")
        self.model = draft
        self.target = target
        self.cfg = cfg
        self.amp = amp
        self.features = features  # CachedRows: the target's features read, not computed
        self.gamma = float(cfg.gamma if cfg.gamma is not None else d.gamma)
        self.capacity = cfg.max_len if order == PACKED else None

        rows = int(target.embed.weight.shape[0])
        check_mask_token(draft.config.mask_token_id, rows)
        draft.config.target_vocab_size = rows  # the embedding that embeds the mask token

    def checkpoint_files(self) -> dict[str, str]:
        """``draft_config.json`` in every checkpoint: what export and serving need."""
        from lengthwise.dflash.model import DRAFT_CONFIG, draft_config_json

        return {DRAFT_CONFIG: draft_config_json(self.model.config)}

    def check_data(self, sample: Callable[[int], Any], size: int) -> None:
        """Refuse a data set that trains nothing (see :func:`check_supervised`)."""
        check_supervised(sample, size)

    def blocks(self, batch: dict[str, Any], rows: list[list[int]], step: int) -> Any:
        """The draft blocks of a collated micro-batch at ``step``, without the target's
        features: the anchors it draws and the slots it trains (what its step costs)."""

        cfg = self.cfg
        return make_blocks(batch, rows, step=step, seed=cfg.seed, num_anchors=cfg.num_anchors,
                           block_size=cfg.block_size, gamma=self.gamma, capacity=self.capacity,
                           max_slots=cfg.slot_budget, max_tokens=cfg.max_tokens)

    def prepare(self, batch: dict[str, Any], rows: list[list[int]], step: int) -> Any:
        blocks = self.blocks(batch, rows, step)
        if self.features is not None:
            dtype = self.target.embed.weight.dtype
            feats, last = self.features(batch, rows, capacity=self.capacity,
                                        last=self.cfg.labels == "target_kl")
            blocks.features = feats.to(dtype)
            blocks.target_last = None if last is None else last.to(dtype)
        return blocks

    def normaliser(self, blocks: Any) -> float:
        return blocks.weight_sum

    def forward(self, net: Any, blocks: Any) -> MicroOut:
        b = blocks.to(self.target.device)
        hidden = block_hidden(self.model, self.target, b, net=net, amp=self.amp,
                              flex=self.cfg.flex_attention, feats=b.features)
        soft = None if b.target_last is None else target_slot_hidden(b, b.target_last)
        s = head_loss(hidden, self.target.lm_head, b.labels, b.weights,
                      chunk=self.cfg.head_chunk, amp=self.amp, soft=soft)
        stats = {"correct": s.correct, "count": s.count, "slots": blocks.slots,
                 "slot_capacity": blocks.slot_capacity}
        for k in range(1, self.model.config.block_size):
            stats[f"slot{k:02d}_correct"] = int(s.slot_correct[k])
            stats[f"slot{k:02d}_count"] = int(s.slot_count[k])
        means, weights = _sample_losses(s.block_ce, b)
        return MicroOut(loss=s.weighted, norm=s.weight, stats=stats, sample_losses=means,
                        sample_weights=weights)

    def step_fields(self, stats: dict[str, float]) -> dict[str, Any]:
        count = stats.get("count", 0.0)
        out: dict[str, Any] = {"accuracy": stats["correct"] / count if count else None}
        held = stats.get("slot_capacity", 0.0)
        out["slots"] = int(stats.get("slots", 0))
        out["slot_efficiency"] = stats.get("slots", 0.0) / held if held else None
        for k in range(1, self.model.config.block_size):
            n = stats.get(f"slot{k:02d}_count", 0.0)
            out[f"acc_slot_{k}"] = stats[f"slot{k:02d}_correct"] / n if n else None
        return out


def check_supervised(sample: Callable[[int], Any], size: int) -> None:
    """Raise a :class:`~lengthwise.errors.DataError` unless some sample can be trained on.

    A DFlash block needs an anchor: two consecutive supervised tokens (labels not
    ``-100``). Samples are read in order until one has them (the first, in usable
    data); a data set with none would give every step a zero loss weight.

    Example::

        >>> rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, -100]}]
        >>> check_supervised(rows.__getitem__, 1)
        Traceback (most recent call last):
        ...
        lengthwise.errors.DataError: none of the 1 samples has two consecutive supervised \
tokens (labels other than -100): DFlash draws its blocks at such pairs, so nothing would be \
trained; check the loss mask (assistant tokens) of the data
    """
    for i in range(size):
        if _first_anchor(sample(i)) is not None:
            return
    raise DataError(f"none of the {size} samples has two consecutive supervised tokens (labels "
                    "other than -100): DFlash draws its blocks at such pairs, so nothing would "
                    "be trained; check the loss mask (assistant tokens) of the data")


def _first_anchor(sample: Any) -> int | None:
    """Where the first two consecutive supervised tokens of ``sample`` start, or ``None``."""

    found = anchor_candidates(np.asarray(sample["labels"]) != IGNORE)
    return int(found[0]) if found.size else None


def check_budget(cut: Callable[[int], Any], full: Callable[[int], Any], size: int,
                 cfg: DFlashTrainConfig) -> None:
    """Refuse a ``max_len`` (``max_tokens`` by default) that cuts every sample before an anchor.

    ``cut(i)`` is sample ``i`` as trained (cut to ``cfg.max_len`` tokens), ``full(i)`` as
    prepared. When no cut sample keeps two consecutive supervised tokens but some full
    one does, the budget is the cause: the :class:`~lengthwise.errors.ConfigError` names
    the option and the least value that keeps one sample trainable.

    Example::

        >>> rows = [{"input_ids": list(range(6)), "labels": [-100] * 3 + [3, 4, 5]}]
        >>> cfg = DFlashTrainConfig(max_tokens=2, max_len=2, steps=1, block_size=2)
        >>> check_budget(lambda i: {k: v[:2] for k, v in rows[i].items()}, rows.__getitem__,
        ...              1, cfg)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: --max-tokens 2 is too small for two supervised tokens: ...
    """
    if any(_first_anchor(cut(i)) is not None for i in range(size)):
        return
    starts = [a for a in (_first_anchor(full(i)) for i in range(size)) if a is not None]
    if not starts:
        return  # the data has none at all: check_supervised says so
    need = min(starts) + 2
    option, value = (("--max-tokens", cfg.max_tokens) if cfg.max_len == cfg.max_tokens
                     else ("--max-len", cfg.max_len))
    raise ConfigError(f"{option} {value} is too small for two supervised tokens: every sample "
                      f"is cut to {cfg.max_len} tokens before two consecutive supervised "
                      f"(assistant) tokens, so nothing would be trained; the shortest sample "
                      f"that keeps two needs {need} tokens: give {option} {need} or more")


def _sample_losses(block_ce: Any, blocks: Any) -> tuple[list[float], list[float]]:
    """Weighted mean loss of each sample's blocks, and each sample's total weight."""
    ids = blocks.sample_ids.cpu().numpy().reshape(-1)
    ce = block_ce.float().cpu().numpy().reshape(-1)
    w = blocks.weights.sum(dim=-1).float().cpu().numpy().reshape(-1)
    keep = (ids >= 0) & (w > 0)
    if not keep.any():
        return [], []
    uniq, inv = np.unique(ids[keep], return_inverse=True)
    sums = np.bincount(inv, weights=ce[keep])
    weights = np.bincount(inv, weights=w[keep])
    return (sums / weights).tolist(), weights.tolist()
