"""Train a DFlash draft on lengthwise's loop: planned micro-batches, target features on the fly.

:class:`DFlashTask` plugs the DFlash objective into
:class:`~lengthwise.train.loop.TrainLoop`, the loop the causal-LM demo uses too
(``BucketBatchSampler`` with its collator, ``StepLogger``, warm-up then cosine,
asynchronous checkpoints with exact resume, ``SpikeGuard``, DDP under
``torchrun``). Per micro-batch it draws each sample's anchors for the step,
runs the frozen target on the same micro-batch for the context features, and
returns the weighted cross-entropy *sum*; the loop divides by the slot weight
of the whole step over every rank and micro-batch. The step record gets
``accuracy`` (unweighted teacher-forced top-1 over the supervised slots,
reduced over ranks) and ``acc_slot_k`` per block slot.

Example::

    >>> cfg = DFlashTrainConfig(steps=100)
    >>> cfg.warmup_steps, cfg.schedule, cfg.weight_decay
    (4, 'cosine', 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.train.config import PACKED, LoopConfig, check_positive
from lengthwise.train.loop import MicroOut

__all__ = ["DFlashTask", "DFlashTrainConfig"]


@dataclass
class DFlashTrainConfig(LoopConfig):
    """Loop settings plus the draft's: block size, layers, anchors per sample.

    The defaults follow DFlash training runs: AdamW without weight decay, linear
    warm-up over ``warmup_ratio`` of the steps, then cosine; gradient clipping 1.0.
    """

    lr: float = 6e-4
    schedule: str = "cosine"
    weight_decay: float = 0.0
    warmup_ratio: float = 0.04
    spike_guard: bool = True
    block_size: int = 16
    draft_layers: int = 1
    num_features: int | None = None  # target layers feeding the draft (default: draft_layers)
    num_anchors: int = 512
    gamma: float | None = None  # default: 7 for blocks of 16, 5 for 10, 4 for 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"warmup_ratio must lie in [0, 1), got {self.warmup_ratio}")
        check_positive(self, "block_size", "draft_layers", "num_anchors")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")

    @property
    def warmup_steps(self) -> int:
        """``warmup`` when given, else ``warmup_ratio`` of the steps (at least 1)."""
        if self.warmup is not None:
            return self.warmup
        return max(1, round(self.warmup_ratio * self.steps))


class DFlashTask:
    """The DFlash objective for :class:`~lengthwise.train.loop.TrainLoop` (model = the draft)."""

    def __init__(self, draft: Any, target: Any, cfg: DFlashTrainConfig, *, order: str,
                 amp: Any = None) -> None:
        self.model = draft
        self.target = target
        self.cfg = cfg
        self.amp = amp
        self.capacity = cfg.max_len if order == PACKED else None

    def prepare(self, batch: dict[str, Any], rows: list[list[int]], step: int) -> Any:
        from lengthwise.dflash.blocks import make_blocks

        d = self.model.config
        return make_blocks(batch, rows, step=step, seed=self.cfg.seed,
                           num_anchors=self.cfg.num_anchors, block_size=d.block_size,
                           gamma=d.gamma, capacity=self.capacity)

    def normaliser(self, blocks: Any) -> float:
        return blocks.weight_sum

    def forward(self, net: Any, blocks: Any) -> MicroOut:
        from lengthwise.dflash.loss import block_logits, block_loss

        b = blocks.to(self.target.device)
        s = block_loss(block_logits(self.model, self.target, b, net=net, amp=self.amp),
                       b.labels, b.weights)
        stats = {"correct": s.correct, "count": s.count}
        for k in range(1, self.model.config.block_size):
            stats[f"slot{k:02d}_correct"] = int(s.slot_correct[k])
            stats[f"slot{k:02d}_count"] = int(s.slot_count[k])
        means, weights = _sample_losses(s.block_ce, b)
        return MicroOut(loss=s.weighted, norm=s.weight, stats=stats, sample_losses=means,
                        sample_weights=weights)

    def step_fields(self, stats: dict[str, float]) -> dict[str, Any]:
        count = stats.get("count", 0.0)
        out: dict[str, Any] = {"accuracy": stats["correct"] / count if count else None}
        for k in range(1, self.model.config.block_size):
            n = stats.get(f"slot{k:02d}_count", 0.0)
            out[f"acc_slot_{k}"] = stats[f"slot{k:02d}_correct"] / n if n else None
        return out


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
