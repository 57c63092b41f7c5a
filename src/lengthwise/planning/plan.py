"""Epoch plans: every rank's micro-batches for one epoch, a pure function of its inputs.

``plan_epoch(lengths, config)`` returns the same plan on every rank given the same
lengths, configuration, seed and epoch, so ranks agree with no communication.
Random streams come from ``numpy.random.default_rng([seed, epoch, stream])``
(:mod:`~lengthwise.planning.streams`). The padded layout is planned by
:mod:`~lengthwise.planning.padded`, the packed one by :mod:`~lengthwise.planning.packed`.

Example::

    >>> import numpy as np
    >>> lens = np.random.default_rng(0).integers(1, 2000, 10_000)
    >>> plan = plan_epoch(lens, max_tokens=8192, world_size=4, grad_accum=2)
    >>> [len(plan.rank_batches(r)) for r in range(4)] == [plan.num_batches] * 4
    True
    >>> plan.stats["padding_efficiency"] > 0.9
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning.batching import whole_number
from lengthwise.planning.config import PlanConfig, plan_config
from lengthwise.planning.lengths import open_lengths
from lengthwise.planning.packed import plan_packed_epoch
from lengthwise.planning.padded import plan_padded_epoch
from lengthwise.planning.schedule import EpochPlan
from lengthwise.planning.windowed import WindowedPlan, resolve_window

__all__ = ["plan_epoch"]


def plan_epoch(
    lengths,
    config: PlanConfig | None = None,
    *,
    seed: int = 0,
    epoch: int = 0,
    indices: np.ndarray | None = None,
    window: int | str | None = None,
    **plan_options: Any,
) -> EpochPlan | WindowedPlan:
    """Plan one epoch of micro-batches for ``config.world_size`` ranks.

    ``config`` (:class:`~lengthwise.planning.config.PlanConfig`), or its fields given as
    keywords instead (``max_tokens=8192, world_size=4``...), holds every option: the batch
    rule, the order, what happens to samples over the budget or ``max_len`` (every sample
    is planned exactly once unless ``even_out`` says otherwise; ``stats`` counts what
    happened). ``seed`` and ``epoch`` pick the random
    streams. ``indices`` restricts the plan to those sample ids (for example the
    samples an interrupted epoch has not trained yet).

    ``window=N`` plans the epoch as a ``(seed, epoch)`` shuffle cut into windows of
    ``N`` samples, each planned when reached, and returns a
    :class:`~lengthwise.planning.windowed.WindowedPlan` (``.npy`` lengths are then
    memory-mapped, not loaded); ``window="auto"`` does so above 16,777,216 samples.
    A window that holds every sample plans the whole epoch as without it.

    Example::

        >>> plan = plan_epoch([5, 3, 8, 2, 7, 1], batch_size=2, order="sorted")
        >>> [b.tolist() for b in plan.rank_batches(0)]
        [[5, 3], [1, 0], [4, 2]]
        >>> plan_epoch([5, 3], PlanConfig(batch_size=2)).num_batches
        1
    """
    seed = whole_number("seed", seed, minimum=0)
    epoch = whole_number("epoch", epoch, minimum=0)
    config = plan_config(config, plan_options, plan_epoch)
    if window is not None:
        if indices is not None:
            raise ConfigError("indices and window cannot be combined: a windowed plan covers the "
                              "whole data set (resume inside a window with the sampler's state)")
        lengths = open_lengths(lengths)
        size = resolve_window(window, int(lengths.shape[0]))
        if size is not None:
            return WindowedPlan(lengths, config, window=size, seed=seed, epoch=epoch)
    planner = plan_packed_epoch if config.layout == "pack" else plan_padded_epoch
    return planner(lengths, config, seed=seed, epoch=epoch, indices=indices)
