"""The plan type both layouts fill: every rank's micro-batches of one epoch.

A plan holds the micro-batches of all ranks in schedule order as CSR arrays:
micro-batch ``k`` is ``indices[offsets[k]:offsets[k + 1]]``, runs on rank
``k % world_size`` at local position ``k // world_size``, which is optimizer step
``position // grad_accum``. :class:`~lengthwise.planning.padded.PaddedEpochPlan`
adds bucket ids and edges; :class:`~lengthwise.planning.packed.PackedEpochPlan`
adds packed rows and the token spans of split samples.

Example::

    >>> from lengthwise.planning.plan import PlanConfig, plan_epoch
    >>> config = PlanConfig(batch_size=2, order="sorted", world_size=3)
    >>> plan = plan_epoch([5, 3, 8, 2, 7, 1], config)
    >>> plan.num_batches, plan.total_batches, plan.batch(0).tolist()
    (1, 3, [5, 3])
    >>> [b.tolist() for b in plan.batch_rows(1)]
    [[1, 0]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning.batching import EvenOutReport
from lengthwise.planning.config import PlanConfig

__all__ = ["EpochPlan", "even_out_counts"]


@dataclass(kw_only=True)
class EpochPlan:
    """One epoch's micro-batches for every rank (see the module docstring for the layout).

    ``counts`` holds what happened to the samples (``truncated``, ``dropped``,
    ``split_batches``, ...); ``stats`` the figures of ``docs/metrics.md``.
    """

    indices: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    config: PlanConfig
    seed: int
    epoch: int
    plan_seconds: float
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def grad_accum(self) -> int:
        return self.config.grad_accum

    @property
    def num_batches(self) -> int:
        """Micro-batches per rank (the same on every rank)."""
        return (self.offsets.size - 1) // self.world_size

    @property
    def total_batches(self) -> int:
        """Micro-batches over all ranks."""
        return self.offsets.size - 1

    @property
    def splits_samples(self) -> bool:
        """Whether entries of ``indices`` are pieces of samples (packed ``on_overflow="split"``)."""
        return False

    def batch(self, k: int) -> np.ndarray:
        """Sample ids of micro-batch ``k`` of the schedule (all ranks)."""
        return self.indices[self.offsets[k] : self.offsets[k + 1]]

    def batch_rows(self, k: int) -> list[np.ndarray]:
        """Sample ids of micro-batch ``k``, one array per packed row (one array when padded)."""
        return [self.batch(k)]

    def rank_batches(self, rank: int, start: int = 0) -> list[np.ndarray]:
        """Micro-batches of ``rank`` in order, from its local position ``start`` on."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} out of range for world_size {self.world_size}")
        first = rank + start * self.world_size
        return [self.batch(k) for k in range(first, self.total_batches, self.world_size)]

    @property
    def stats(self) -> dict:
        """The figures of ``docs/metrics.md`` for this plan."""
        raise NotImplementedError


def even_out_counts(counts: dict[str, int], planned_ids: np.ndarray, planned: int,
                    even: EvenOutReport) -> dict[str, int]:
    """``counts`` plus what evening out the ranks did (``planned`` samples before it).

    Example::

        >>> rep = EvenOutReport(split_batches=1, dropped=0, repeated=0)
        >>> even_out_counts({"truncated": 2}, np.array([0, 1]), 2, rep)["planned"]
        2
    """
    changed = even.repeated or even.dropped
    return dict(counts, planned=int(np.unique(planned_ids).size) if changed else int(planned),
                split_batches=even.split_batches, dropped_to_even_out=even.dropped,
                repeated=even.repeated)
