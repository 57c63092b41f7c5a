"""Settings of the demo's training runs; the command line takes its defaults from here.

:class:`DemoConfig` adds the causal-LM task's model and data settings to the
training loop's :class:`~lengthwise.train.config.LoopConfig` (re-exported here), and
:class:`DFlashDemoConfig` the DFlash task's target and evaluation settings to a DFlash
training run's. Nothing here loads torch, so ``lengthwise demo --help`` is quick.

The demo trains every order on the same samples for ``epochs`` epochs; each order's
optimizer steps are its own plan's for those epochs (:func:`lengthwise.demo.runner.order_steps`),
so the loop's ``steps`` is set per order, not by hand.

Example::

    >>> cfg = DemoConfig()
    >>> cfg.epochs, cfg.max_tokens, cfg.max_len
    (1, 512, 256)
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthwise.dflash.train_config import DFlashTrainConfig
from lengthwise.errors import ConfigError
from lengthwise.planning.vocabulary import ORDERS
from lengthwise.train.config import DTYPES, PACKED, LoopConfig, check_positive

__all__ = ["DEFAULT_ORDERS", "DTYPES", "PACKED", "DFlashDemoConfig", "DemoConfig", "LoopConfig",
           "available_orders", "check_positive", "parse_orders"]


def available_orders() -> tuple[str, ...]:
    """The orders the demo trains: the planner's orders, then ``packed``.

    Example::

        >>> available_orders()[-1]
        'packed'
    """

    return (*ORDERS, PACKED)


def parse_orders(text: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Validate an order list (``"all"``, a comma-separated string, or a list).

    Example::

        >>> parse_orders("random, stratified")
        ['random', 'stratified']
    """
    known = available_orders()
    if text is None or text == "all":
        return list(known)
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    items = [t for t in items if t]
    bad = [t for t in items if t not in known]
    if bad:
        raise ConfigError(f"unknown order(s) {bad}; choose from {', '.join(known)}")
    if not items:
        raise ConfigError("no orders given")
    return list(dict.fromkeys(items))


#: orders trained by default, in this sequence
DEFAULT_ORDERS: tuple[str, ...] = available_orders()


@dataclass
class DemoConfig(LoopConfig):
    """The causal-LM demo: a small Llama-style model trained from scratch per order.

    The defaults are the run whose figures README.md and docs/demo.md show. ``epochs`` is
    the run length: every order trains every sample once per epoch.
    """

    epochs: int = 1
    model_size: str = "tiny"
    eval_samples: int = 256
    max_samples: int | None = None
    attn_implementation: str | None = None  # transformers' default (sdpa) when None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "eval_samples", "epochs")


@dataclass
class DFlashDemoConfig(DFlashTrainConfig):
    """DFlash training sized for two CPU cores, plus the target and evaluation settings."""

    steps: int = 50  # the run whose figures docs/dflash.md shows
    grad_accum: int = 4
    max_tokens: int = 512
    max_len: int = 192
    lr: float = 3e-3
    warmup_ratio: float = 0.1
    block_size: int = 8
    num_anchors: int = 12
    num_features: int | None = 2
    eval_samples: int = 48
    max_samples: int | None = None
    target_size: str = "small"
    target_steps: int = 150
    texts: int = 2000  # corpus texts turned into prompts (before the held-out split)
    prompt_len: int = 48
    response_len: int = 128
    temperature: float = 0.0  # 0: the target's greedy continuation
    eval_prompts: int = 12
    max_new_tokens: int = 48
    eval_anchors: int | None = None  # anchors per held-out sample (default: num_anchors)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prompt_len + self.response_len > self.max_len:
            need = self.prompt_len + self.response_len
            raise ConfigError(f"max_len ({self.max_len}) must hold a prompt and the target's "
                              f"response: prompt_len + response_len = {self.prompt_len} + "
                              f"{self.response_len} = {need} (use --max-len {need} or more)")
        check_positive(self, "eval_samples", "eval_prompts", "max_new_tokens", "texts")
        if self.eval_prompts > self.eval_samples:
            raise ConfigError(f"eval_prompts ({self.eval_prompts}) must not exceed "
                              f"eval_samples ({self.eval_samples})")
