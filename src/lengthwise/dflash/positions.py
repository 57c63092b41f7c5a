"""Sequences longer than the target's positions (``max_position_embeddings``), counted and named.

A target attends over at most ``max_position_embeddings`` positions it was trained on;
``dflash prepare`` keeps longer samples whole unless ``--max-len`` cuts them, and ``dflash
eval`` decodes past them if a prompt and its new tokens run that far. Neither is an
error, but both are said: :func:`past_positions` gives the one-line note.

Example::

    >>> limit = max_positions({"max_position_embeddings": 512})
    >>> past_positions([100, 600, 2013], limit, what="samples", advice="give --max-len 512")
    "2 of 3 samples are longer than the target's 512 positions (max_position_embeddings; the \
longest has 2,013 tokens): give --max-len 512"
    >>> past_positions([100], limit, what="samples", advice="") is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["max_positions", "past_positions"]


def max_positions(config: Any) -> int | None:
    """The target's ``max_position_embeddings``: of a config object or ``config.json``'s dict.

    A multimodal config's ``text_config`` is read where the top level has none; ``None``
    where neither says.

    Example::

        >>> max_positions({"text_config": {"max_position_embeddings": 4096}}), max_positions({})
        (4096, None)
    """
    def get(key: str) -> Any:
        return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

    value = get("max_position_embeddings")
    if value is None and get("text_config") is not None:
        return max_positions(get("text_config"))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def past_positions(lengths: Sequence[int] | np.ndarray, limit: int | None, *, what: str,
                   advice: str) -> str | None:
    """A note counting the ``lengths`` over ``limit`` positions, or ``None`` when none is."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if limit is None or lengths.size == 0:
        return None
    over = int((lengths > limit).sum())
    if not over:
        return None
    return (f"{over} of {lengths.size} {what} are longer than the target's {limit} positions "
            f"(max_position_embeddings; the longest has {int(lengths.max()):,} tokens): "
            f"{advice}")
