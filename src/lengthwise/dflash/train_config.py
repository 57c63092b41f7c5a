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
from dataclasses import MISSING, dataclass

from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_field
from lengthwise.planning.vocabulary import ORDERS
from lengthwise.train.config import PACKED, LoopConfig, check_finite, check_positive

__all__ = ["INITS", "LABELS", "DFlashTrainConfig", "RunSettings"]

#: how the draft's weights start: ``target`` (copied from the target's top), ``random`` (seeded)
INITS = ("target", "random")
#: what block slots learn: ``data`` (the next tokens), ``target_kl`` (the target's distribution)
LABELS = ("data", "target_kl")


@dataclass
class DFlashTrainConfig(LoopConfig):
    """Loop settings plus the draft's: block size, layers, anchors per sample.

    The defaults follow DFlash training runs: AdamW without weight decay, linear
    warm-up over ``warmup_ratio`` of the steps, then cosine; gradient clipping 1.0.
    """

    lr: float = flag_field(6e-4, "peak learning rate")
    schedule: str = flag_field("cosine", "learning-rate schedule after warm-up",
                               choices=("cosine", "constant"))
    weight_decay: float = flag_field(0.0, "AdamW weight decay")
    warmup_ratio: float = flag_field(0.04, "warm-up share of the steps")
    spike_guard: bool = True
    block_size: int = flag_field(16, "draft block size")
    draft_layers: int = flag_field(1, "draft decoder layers")
    num_features: int | None = flag_field(None, "target layers feeding the draft",
                                          none="draft_layers", type=int)
    num_anchors: int = flag_field(512, "anchors drawn per sample and step")
    gamma: float | None = flag_field(None, "loss decay over block slots",
                                     none="7 for block 16, 5 for 10, 4 for 8", type=float)
    max_slots: int | None = flag_field(None, "draft slots (anchors x block size) per "
                                             "micro-batch", none="block_size x max_tokens",
                                       type=int)
    head_chunk: int = flag_field(1024, "supervised slots per LM-head and cross-entropy chunk")
    flex_attention: bool | None = None  # block-sparse flex mask (None: on CUDA), else dense
    init: str = flag_field(
        "target", "the draft's starting weights: target (layer i copies the target's decoder "
        "layer from the top, the final norm the target's, fc the identity on the deepest "
        "feature), or random (seeded)", choices=INITS)
    zero_init_output: bool = flag_field(
        False, "start o_proj and down_proj of the draft's layers at zero (each layer starts as "
        "the identity)")
    standardize_features: bool = flag_field(
        False, "divide each feature dimension by its root mean square over the first training "
        "tokens before fc (folded into fc at export)")
    labels: str = flag_field(
        "data", "what block slots learn: data (cross-entropy on the next tokens) or target_kl "
        "(KL to the target's distribution; needs --features with the last hidden state)",
        choices=LABELS)

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


@dataclass
class RunSettings:
    """What a training run needs besides :class:`DFlashTrainConfig`."""

    target: str = flag_field(MISSING, "local Hugging Face causal LM folder", metavar="PATH")
    data: str = flag_field(MISSING, "folder written by `dflash prepare`", metavar="FOLDER")
    out: str = flag_field("dflash_run", "run folder", metavar="FOLDER")
    order: str = flag_field("stratified", "batching order of the sampler, or packed")
    epochs: float | None = flag_field(None, "passes over the training samples (sets --steps "
                                            "from the plan)", type=float)
    eval_samples: int = flag_field(64, "prepared samples held out for evaluation")
    eval_every: int | None = flag_field(None, "steps between held-out evaluations (0: none)",
                                        none="a tenth of the run", type=int)
    eval_anchors: int | None = flag_field(None, "anchors per held-out sample",
                                          none="num_anchors", type=int)
    wandb: bool = flag_field(False, "also log to Weights & Biases")
    wandb_project: str | None = flag_field(None, "W&B project (with --wandb)", type=str)
    tensorboard: str | None = flag_field(None, "also log to TensorBoard event files in this "
                                               "folder", type=str)
    overwrite: bool = flag_field(False, "remove an earlier run's checkpoints and final draft "
                                        "from --out first (without it, or --resume, such a "
                                        "folder is refused)")
    features: str | None = flag_field(None, "a feature cache of --data from `dflash features`: "
                                            "the target's features are read from it, not "
                                            "computed each step", type=str)
    split_seed: int | None = None  # seed of the held-out draw (default: the run's seed)
    train_samples: int | None = flag_field(None, "train on a seeded draw of this many training "
                                                 "samples (a smaller draw lies inside a larger "
                                                 "one)", none="all", type=int)

    def __post_init__(self) -> None:
        if self.order not in (*ORDERS, PACKED):
            raise ConfigError(f"order must be one of {', '.join((*ORDERS, PACKED))}, "
                              f"got {self.order!r}")
        for name in ("eval_samples", "eval_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        if self.epochs is not None:
            check_finite(self, "epochs", positive=True)
        for name in ("eval_anchors", "train_samples"):
            if getattr(self, name) is not None:
                check_positive(self, name)
