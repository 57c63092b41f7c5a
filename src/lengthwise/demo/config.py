"""Settings of the demo's training runs; the command line takes its defaults from here.

:class:`LoopConfig` holds what every training loop of the demo needs (steps,
micro-batches, budget, optimizer, schedule, checkpoints, device);
:class:`DemoConfig` adds the causal-LM task's model and data settings.

Example::

    >>> cfg = DemoConfig(steps=10)
    >>> cfg.warmup_steps, cfg.max_tokens, cfg.max_len
    (1, 512, 256)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_ORDERS", "PACKED", "DemoConfig", "LoopConfig", "available_orders"]

#: name of the padding-free strategy (the planner's ``layout="pack"``)
PACKED = "packed"


def available_orders() -> tuple[str, ...]:
    """The orders the demo trains: the planner's orders, then ``packed``.

    Example::

        >>> available_orders()[-1]
        'packed'
    """
    from lengthwise.planning.vocabulary import ORDERS

    return (*ORDERS, PACKED)


#: orders trained by default, in this sequence
DEFAULT_ORDERS: tuple[str, ...] = available_orders()


@dataclass
class LoopConfig:
    """What one training loop needs, whatever it trains."""

    steps: int = 200
    grad_accum: int = 8
    max_tokens: int = 512
    max_len: int = 256
    lr: float = 3e-3
    warmup: int | None = None  # steps; default 10 % of steps
    schedule: str = "constant"  # or "cosine"
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    buckets: int | str = "auto"
    pad_multiple: int | None = None  # 8 on CUDA, 1 on CPU
    device: str = "cpu"
    dtype: str | None = None  # "bf16" on CUDA by default
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    resume: bool = False
    spike_guard: bool = False  # skip updates whose loss is an outlier (SpikeGuard)
    timing_warmup: int = 3  # first steps left out of tokens_per_second
    progress: bool = True
    deterministic: bool = True
    threads: int | None = 1  # torch intra-op threads on CPU (None: torch's default)

    def __post_init__(self) -> None:
        if self.pad_multiple is None:
            self.pad_multiple = 8 if self.device.startswith("cuda") else 1
        for name in ("steps", "grad_accum", "max_tokens", "max_len", "pad_multiple",
                     "keep_checkpoints"):
            _positive(self, name)
        if self.max_len > self.max_tokens:
            raise ValueError(f"max_len ({self.max_len}) must not exceed max_tokens "
                             f"({self.max_tokens}): one row must fit the micro-batch budget")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.warmup is not None and not 0 <= self.warmup < self.steps:
            raise ValueError(f"warmup must lie in [0, steps={self.steps}), got {self.warmup}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")

    @property
    def warmup_steps(self) -> int:
        """Learning-rate warm-up length in optimizer steps."""
        return self.warmup if self.warmup is not None else max(1, self.steps // 10)


@dataclass
class DemoConfig(LoopConfig):
    """The causal-LM demo: a small Llama-style model trained from scratch per order."""

    model_size: str = "tiny"
    eval_samples: int = 256
    max_samples: int | None = None
    attn_implementation: str | None = None  # transformers' default (sdpa) when None

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "eval_samples")


def _positive(cfg: object, name: str) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
