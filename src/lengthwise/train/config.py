"""Settings of a training loop: steps, micro-batches, budget, optimizer, schedule, checkpoints.

:class:`LoopConfig` holds what every :class:`~lengthwise.train.loop.TrainLoop`
needs, whatever it trains; a recipe's config (the causal-LM demo's, DFlash's)
adds its own fields.

Example::

    >>> cfg = LoopConfig(steps=10)
    >>> cfg.warmup_steps, cfg.max_tokens, cfg.max_len
    (1, 512, 256)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from lengthwise.errors import ConfigError
from lengthwise.flag_field import flag_field

__all__ = ["DTYPES", "PACKED", "LoopConfig", "check_finite", "check_positive"]

#: the autocast dtypes a run may name (``None``: bf16 on CUDA, fp32 on CPU)
DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
#: name of the padding-free strategy (the planner's ``layout="pack"``)
PACKED = "packed"


@dataclass
class LoopConfig:
    """What one training loop needs, whatever it trains."""

    steps: int = flag_field(200, "optimizer steps")
    grad_accum: int = flag_field(8, "micro-batches per optimizer step and rank")
    max_tokens: int = flag_field(512, "token budget of a micro-batch")
    max_len: int = flag_field(256, "longest sample; longer ones are truncated",
                              none="the data's longest, at most max_tokens")
    lr: float = 3e-3
    warmup: int | None = flag_field(None, "warm-up steps", none="a share of the steps",
                                    type=int)
    schedule: str = "constant"  # or "cosine"
    weight_decay: float = 0.1
    clip: float = flag_field(1.0, "gradient-norm clipping, > 0 (inf: no clipping)")
    seed: int = flag_field(0, "seed of the model's initialisation, the sampler and the run's "
                              "random draws")
    buckets: int | str = flag_field("auto", "length buckets of the sampler (auto: chosen from "
                                            "the lengths)", type=int)
    pad_multiple: int | None = None  # 8 on CUDA, 1 on CPU
    device: str = flag_field("cpu", "cpu, cuda or cuda:N")
    dtype: str | None = flag_field(
        None, "dtype of autocast and of a frozen model's weights: bf16, fp16 or fp32",
        none="fp32 on CPU; on CUDA bf16 autocast and the checkpoint's weights", type=str)
    checkpoint_every: int = flag_field(0, "steps between checkpoints (0: none)")
    keep_checkpoints: int = flag_field(2, "checkpoints kept")
    resume: bool = flag_field(False, "continue from the newest checkpoint")
    spike_guard: bool = False  # skip updates whose loss is an outlier (SpikeGuard)
    timing_warmup: int = 3  # first steps left out of tokens_per_second
    progress: bool = flag_field(True, "a progress bar")
    deterministic: bool = True
    threads: int | None = flag_field(1, "torch intra-op threads per process on CPU",
                                     none="torch's default", type=int)

    def __post_init__(self) -> None:
        if self.pad_multiple is None:
            self.pad_multiple = 8 if self.device.startswith("cuda") else 1
        check_positive(self, "steps", "grad_accum", "max_tokens", "max_len", "pad_multiple",
                       "keep_checkpoints")
        if self.max_len > self.max_tokens:
            raise ConfigError(f"max_len ({self.max_len}) must not exceed max_tokens "
                              f"({self.max_tokens}): one row must fit the micro-batch budget")
        if self.schedule not in ("constant", "cosine"):
            raise ConfigError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        check_finite(self, "lr", positive=True)
        check_finite(self, "weight_decay")
        if not self.clip > 0:  # a norm <= 0 flips or zeroes every update; nan compares false
            raise ConfigError(f"clip must be > 0 (the largest gradient norm kept; inf: no "
                              f"clipping), got {self.clip}")
        if self.warmup is not None and not 0 <= self.warmup < self.steps:
            raise ConfigError(f"warmup must lie in [0, steps={self.steps}), got {self.warmup}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        self._check_runtime()

    def _check_runtime(self) -> None:
        """Seed, device, dtype, threads and buckets, checked before any data is read."""
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of fp32, bf16, fp16, got {self.dtype!r}")
        if self.threads is not None:
            check_positive(self, "threads")
        if self.buckets != "auto":
            if isinstance(self.buckets, str):
                raise ConfigError(f"buckets must be a count or 'auto', got {self.buckets!r}")
            check_positive(self, "buckets")

    @property
    def warmup_steps(self) -> int:
        """Learning-rate warm-up length in optimizer steps."""
        return self.warmup if self.warmup is not None else max(1, self.steps // 10)


def check_positive(cfg: object, *names: str) -> None:
    """Raise a ``ConfigError`` naming the first field of ``cfg`` that is not an integer >= 1.

    Example::

        >>> check_positive(LoopConfig(), "steps", "grad_accum")
        >>> check_positive(LoopConfig(steps=3), "timing_warmup", "clip")
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: clip must be a positive integer, got 1.0
    """
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def check_finite(cfg: object, name: str, *, positive: bool = False) -> None:
    """Raise a ``ConfigError`` naming field ``name`` of ``cfg`` unless it is a finite number
    ``>= 0`` (``> 0`` with ``positive``): NaN and infinity are refused like a negative value.

    Example::

        >>> check_finite(LoopConfig(), "weight_decay")
        >>> cfg = LoopConfig()
        >>> cfg.lr = float("inf")
        >>> check_finite(cfg, "lr", positive=True)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: lr must be a finite number > 0, got inf
    """
    value = getattr(cfg, name)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise ConfigError(f"{name} must be a finite number {'>' if positive else '>='} 0, "
                          f"got {value!r}")
