"""Lengths made ready for a planner: validated, over-long samples handled, ids chosen.

Example::

    >>> from lengthwise.planning.config import PlanConfig
    >>> lens, ids, counts = prepare_lengths([4, 0, 9], PlanConfig(batch_size=2, max_len=8))
    >>> lens.tolist(), ids.tolist(), counts["truncated"], counts["dropped_empty"]
    ([4, 0, 8], [0, 2], 1, 1)
"""

from __future__ import annotations

import numpy as np

from lengthwise.planning.config import PlanConfig
from lengthwise.planning.lengths import apply_overflow, load_lengths, validate_lengths

__all__ = ["index_dtype", "prepare_lengths"]


def index_dtype(n: int) -> type:
    """The smallest integer type that holds sample ids below ``n``.

    Example::

        >>> index_dtype(1000) is np.int32
        True
    """
    return np.int32 if n < 2**31 else np.int64


def prepare_lengths(lengths, config: PlanConfig, indices: np.ndarray | None = None, *,
                    cap_to_budget: bool = True,
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Validate lengths, apply the overflow policy; return (lengths, planned ids, counts).

    With ``cap_to_budget`` a sample longer than one row of the budget follows
    ``on_overflow`` like one over ``max_len``; the packed layout turns it off to
    split such samples itself (``on_overflow="split"`` truncates only at ``max_len``).
    """
    raw = lengths if isinstance(lengths, np.ndarray) else load_lengths(lengths)
    raw = validate_lengths(raw)
    cap = config.row_limit().max_length() if cap_to_budget else None
    max_len, limit_name = config.max_len, None
    if cap is not None and (max_len is None or cap < max_len):
        max_len, limit_name = cap, f"the {cap} tokens one row of the budget holds"
    policy = "truncate" if config.on_overflow == "split" else config.on_overflow
    lens, keep, counts = apply_overflow(raw, max_len, policy, limit_name=limit_name)
    if indices is not None:
        ids = np.asarray(indices, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= raw.size):
            raise ValueError(f"indices must lie in [0, {raw.size}), got {ids.min()}..{ids.max()}")
        if np.unique(ids).size != ids.size:
            raise ValueError("indices must not repeat a sample id")
        ids = ids[keep[ids]]
    else:
        ids = np.flatnonzero(keep)
    ids = ids.astype(index_dtype(raw.size), copy=False)
    if ids.size == 0:
        raise ValueError("no samples left to plan after dropping empty and over-long ones "
                         f"({counts})")
    return lens, ids, counts
