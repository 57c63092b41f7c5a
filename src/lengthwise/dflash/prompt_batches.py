"""The batches regeneration cuts its prompts into, sorted by length.

Read by regeneration itself (:class:`~lengthwise.dflash.regenerate.TurnGenerator`,
:func:`~lengthwise.dflash.generate.generate_responses`) and by its time estimate
(:mod:`~lengthwise.dflash.cost.timing`), so both cut alike.
"""

from __future__ import annotations

import numpy as np

from lengthwise.planning.batching import greedy_batches, row_limit

__all__ = ["batch_offsets"]


def batch_offsets(lengths: np.ndarray, *, batch_size: int, max_tokens: int | None,
                  max_new_tokens: int) -> np.ndarray:
    """Boundaries of the batches regeneration cuts prompts of ``lengths`` (ascending) into:
    consecutive runs of at most ``batch_size`` prompts whose rows, each padded to the
    longest prompt and given ``max_new_tokens`` more, hold at most ``max_tokens`` tokens
    (None: no limit; a prompt over it alone). The planner's greedy cut
    (:func:`lengthwise.planning.batching.greedy_batches`).

    Example::

        >>> batch_offsets(np.array([3, 4, 6, 8]), batch_size=3, max_tokens=30,
        ...               max_new_tokens=4).tolist()
        [0, 3, 4]
    """

    n = int(np.asarray(lengths).size)
    cuts = [0, n]
    if max_tokens is not None and n:
        cuts = greedy_batches(np.arange(n), np.asarray(lengths, dtype=np.int64) + max_new_tokens,
                              row_limit(max_tokens=max_tokens))[1].tolist()
    starts = [s for a, b in zip(cuts[:-1], cuts[1:], strict=True) for s in range(a, b, batch_size)]
    return np.asarray(starts + [n], dtype=np.int64)
