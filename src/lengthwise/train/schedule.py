"""Learning-rate schedule of a training run: linear warm-up, then constant or cosine.

Example::

    >>> lr_factor(0, steps=100, warmup=10, schedule="cosine")
    0.1
    >>> lr_factor(10, steps=100, warmup=10, schedule="cosine")
    1.0
    >>> round(lr_factor(100, steps=100, warmup=10, schedule="cosine"), 3)
    0.1
"""

from __future__ import annotations

import math

from lengthwise.errors import ConfigError

__all__ = ["lr_factor"]


def lr_factor(step: int, *, steps: int, warmup: int, schedule: str = "cosine",
              floor: float = 0.1) -> float:
    """Multiplier of the peak learning rate after ``step`` updates.

    Warm-up rises linearly to 1 over ``warmup`` steps; then ``"constant"`` stays
    at 1 and ``"cosine"`` falls to ``floor`` at ``steps``.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ConfigError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
