"""Settings of the demo's training runs; the command line takes its defaults from here.

:class:`DemoConfig` adds the causal-LM task's model and data settings to the
training loop's :class:`~lengthwise.train.config.LoopConfig` (re-exported here).

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

from lengthwise.errors import ConfigError
from lengthwise.train.config import DTYPES, PACKED, LoopConfig, check_positive

__all__ = ["DEFAULT_ORDERS", "DTYPES", "PACKED", "DemoConfig", "LoopConfig", "available_orders",
           "check_positive", "parse_orders"]


def available_orders() -> tuple[str, ...]:
    """The orders the demo trains: the planner's orders, then ``packed``.

    Example::

        >>> available_orders()[-1]
        'packed'
    """
    from lengthwise.planning.vocabulary import ORDERS

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
