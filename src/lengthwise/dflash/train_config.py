"""The settings of a DFlash training run: the loop's, plus the draft's block, layers and anchors.

No torch here: the command line reads its defaults and help from this class without
loading torch.

Example::

    >>> cfg = DFlashTrainConfig(steps=100)
    >>> cfg.warmup_steps, cfg.schedule, cfg.weight_decay
    (4, 'cosine', 0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lengthwise.errors import ConfigError
from lengthwise.train.config import LoopConfig, check_positive

__all__ = ["INITS", "LABELS", "DFlashTrainConfig"]

#: how the draft's weights start: ``random`` (seeded), ``target`` (copied from the target's top)
INITS = ("random", "target")
#: what block slots learn: ``data`` (the next tokens), ``target_kl`` (the target's distribution)
LABELS = ("data", "target_kl")


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
    max_slots: int | None = None  # draft slots per micro-batch (None: block_size * max_tokens)
    head_chunk: int = 1024  # supervised slots per LM-head + cross-entropy chunk
    flex_attention: bool | None = None  # block-sparse flex mask (None: on CUDA), else dense
    init: str = field(default="random", metadata={
        "help": "the draft's starting weights: random, or target (layer i copies the target's "
                "decoder layer from the top, the final norm the target's, fc the identity on "
                "the deepest feature)", "choices": INITS})
    zero_init_output: bool = field(default=False, metadata={
        "help": "start o_proj and down_proj of the draft's layers at zero (each layer starts "
                "as the identity)"})
    standardize_features: bool = field(default=False, metadata={
        "help": "divide each feature dimension by its root mean square over the first "
                "training tokens before fc (folded into fc at export)"})
    labels: str = field(default="data", metadata={
        "help": "what block slots learn: data (cross-entropy on the next tokens) or target_kl "
                "(KL to the target's distribution; needs --features with the last hidden "
                "state)", "choices": LABELS})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, allowed in (("init", INITS), ("labels", LABELS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, "
                                  f"got {getattr(self, name)!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"warmup_ratio must lie in [0, 1), got {self.warmup_ratio}")
        check_positive(self, "block_size", "draft_layers", "num_anchors", "head_chunk")
        if self.num_features is not None:
            check_positive(self, "num_features")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        g = self.gamma
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float))
                              or not 0 < g < math.inf):
            raise ConfigError(f"gamma must be a finite number > 0 (or None for the block "
                              f"size's default), got {g!r}")
        if self.max_slots is not None:
            check_positive(self, "max_slots")
            if self.max_slots < self.block_size:
                raise ConfigError(f"max_slots={self.max_slots} holds no block of block_size="
                                  f"{self.block_size}; give max_slots >= block_size")

    @property
    def slot_budget(self) -> int:
        """Most draft slots a micro-batch holds: ``max_slots``, else ``block_size * max_tokens``.

        Without ``max_slots`` a sample of ``n`` tokens has at most ``n - 1`` anchors, so a
        micro-batch of ``max_tokens`` tokens never holds more than the default.

        Example::

            >>> DFlashTrainConfig(max_tokens=16384, max_len=8192, max_slots=32768).slot_budget
            32768
        """
        return self.max_slots or self.block_size * self.max_tokens

    @property
    def warmup_steps(self) -> int:
        """``warmup`` when given, else ``warmup_ratio`` of the steps (at least 1)."""
        if self.warmup is not None:
            return self.warmup
        return max(1, round(self.warmup_ratio * self.steps))
