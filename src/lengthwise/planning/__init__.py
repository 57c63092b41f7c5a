"""The NumPy core: lengths in, plans out. Nothing here imports torch.

Modules, in the order a plan is built:

* :mod:`~lengthwise.planning.vocabulary`: the names of orders, layouts and policies;
* :mod:`~lengthwise.planning.lengths`: reading and validating per-sample lengths
  (:mod:`~lengthwise.planning.jsonl` reads one field of a JSON-lines file);
* :mod:`~lengthwise.planning.config`: :class:`PlanConfig`, everything that decides a plan;
* :mod:`~lengthwise.planning.cost`: the compute cost of a micro-batch;
* :mod:`~lengthwise.planning.edges`: padding-optimal bucket edges, solved exactly;
* :mod:`~lengthwise.planning.batching`: batch rules, batches cut inside buckets, ranks evened out;
* :mod:`~lengthwise.planning.orders`: the order of micro-batches (interleave, stratified, ...),
  sorted by :mod:`~lengthwise.planning.sorting` (stable orders from the fast sort);
* :mod:`~lengthwise.planning.streams`: the named random streams of one ``(seed, epoch)``;
* :mod:`~lengthwise.planning.prepare`: lengths made ready for a planner;
* :mod:`~lengthwise.planning.schedule`: :class:`EpochPlan`, the plan type both layouts fill;
* :mod:`~lengthwise.planning.padded` and :mod:`~lengthwise.planning.packed`: the two planners;
* :mod:`~lengthwise.planning.plan`: :func:`plan_epoch`, which calls the planner of the layout;
* :mod:`~lengthwise.planning.shuffle`: a seeded permutation evaluated anywhere in O(1) memory;
* :mod:`~lengthwise.planning.windowed`: an epoch as a shuffle cut into windows, each planned
  when reached; :mod:`~lengthwise.planning.window_cursor`: one rank's resumable place in it;
* :mod:`~lengthwise.planning.metrics`: the figures of ``docs/metrics.md`` for any schedule.

Example::

    >>> import numpy as np
    >>> from lengthwise.planning import plan_epoch
    >>> plan = plan_epoch(np.arange(1, 1001), batch_size=8, buckets=4, world_size=2)
    >>> plan.num_batches * 2 == plan.total_batches
    True
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "plan_epoch": "lengthwise.planning.plan",
    "PlanConfig": "lengthwise.planning.config",
    "EpochPlan": "lengthwise.planning.schedule",
    "PaddedEpochPlan": "lengthwise.planning.padded",
    "PackedEpochPlan": "lengthwise.planning.packed",
    "CostModel": "lengthwise.planning.cost",
    "load_lengths": "lengthwise.planning.lengths",
    "open_lengths": "lengthwise.planning.lengths",
    "WindowedPlan": "lengthwise.planning.windowed",
    "optimal_edges": "lengthwise.planning.edges",
    "batch_stats": "lengthwise.planning.metrics",
    "recomposition": "lengthwise.planning.metrics",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
