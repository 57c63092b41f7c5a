"""Acceptance figures of real speculative decoding, per prompt set (NumPy, torch-free).

- :func:`acceptance_interval`: the acceptance length (tokens per verifying target
  forward) as the mean over prompts of each prompt's own, with a 95 % Student-t
  interval over prompts (prompts are the unit that varies between sets; the steps of
  one prompt are not independent of each other);
- :func:`conditional_acceptance`: per block position ``k``, the share of verifications
  that kept proposal ``k`` among those that kept proposal ``k - 1`` (position 0, the
  anchor, is always kept);
- :func:`expected_acceptance`: ``1 + sum_k prod_{j<=k} alpha_j`` from per-position
  acceptance rates ``alpha_j`` (``1 - TV(p_draft, p_target)`` from a teacher-forced pass,
  or the conditional acceptance above).

Example::

    >>> conditional_acceptance([0, 1, 3, 3], block_size=4)
    [0.75, 0.6666666666666666, 1.0]
    >>> conditional_acceptance([0, 1], block_size=4)
    [0.5, 0.0, None]
    >>> expected_acceptance([0.5, 0.5, 0.0])
    1.75
    >>> iv = acceptance_interval([2.0, 3.0, 4.0])
    >>> iv["mean"], round(iv["lo"], 3), round(iv["hi"], 3), iv["n"]
    (3.0, 0.516, 5.484, 3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lengthwise.dflash.objective import simulated_acceptance_length

__all__ = ["INTERVAL", "acceptance_interval", "conditional_acceptance", "expected_acceptance"]

#: how :func:`acceptance_interval` is computed (named in every report)
INTERVAL = "95% Student-t over prompts"


def acceptance_interval(per_prompt: Sequence[float]) -> dict[str, Any]:
    """Mean of the prompts' acceptance lengths, its 95 % t-interval (``lo``, ``hi``) and ``n``.

    Prompts without a verifying forward (``nan``: the first token ended them) are left
    out of the mean and of ``n``; one prompt gives no interval (``lo``/``hi`` ``None``),
    no prompt no mean (``nan``).
    """
    from lengthwise.demo.intervals import t_interval

    iv = t_interval([float(x) for x in per_prompt])
    if iv["n"] == 0:
        return {"mean": math.nan, "lo": None, "hi": None, "n": 0}
    if iv["n"] == 1:
        return {"mean": iv["mean"], "lo": None, "hi": None, "n": 1}
    return {"mean": iv["mean"], "lo": iv["lo"], "hi": iv["hi"], "n": iv["n"]}


def conditional_acceptance(drafted: Sequence[int], *, block_size: int) -> list[float | None]:
    """Per block position ``k = 1 .. block_size - 1``: P(proposal ``k`` kept | ``k - 1`` kept).

    ``drafted``: proposed tokens each verification kept (before a stop token or the
    token limit cut the output), pooled over the prompts of a set. ``None`` where no
    verification reached position ``k - 1``.
    """
    d = np.asarray(drafted, dtype=np.int64)
    if d.size and (d.min() < 0 or d.max() > block_size - 1):
        raise ValueError(f"kept proposals must lie in [0, {block_size - 1}], got "
                        f"[{d.min()}, {d.max()}]")
    reached = [int((d >= k).sum()) for k in range(block_size)]
    return [reached[k] / reached[k - 1] if reached[k - 1] else None
            for k in range(1, block_size)]


def expected_acceptance(alpha: Sequence[float | None]) -> float:
    """``1 + sum_k prod_{j<=k} alpha_j``: tokens per target forward if position ``j`` is kept
    with probability ``alpha_j`` once the positions before it were (``None``, ``nan``: 0)."""
    return simulated_acceptance_length(
        np.array([math.nan if a is None else a for a in alpha], dtype=np.float64))
