"""The plan of a packed epoch: an :class:`EpochPlan` whose micro-batches are packed rows.

Example::

    >>> from lengthwise.planning.config import PlanConfig
    >>> from lengthwise.planning.packed import plan_packed_epoch
    >>> plan = plan_packed_epoch([5, 3, 4, 2], PlanConfig(max_tokens=7, layout="pack"))
    >>> plan.capacity, plan.total_batches
    (7, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lengthwise.planning import metrics
from lengthwise.planning.cost import CostModel
from lengthwise.planning.schedule import EpochPlan

__all__ = ["PackedEpochPlan"]


@dataclass(kw_only=True)
class PackedEpochPlan(EpochPlan):
    """An :class:`EpochPlan` of packed rows, with per-row and per-piece helpers.

    ``offsets`` bounds micro-batches; with ``rows_per_batch > 1``, ``row_offsets``
    bounds the rows inside them. With ``on_overflow="split"``, ``token_spans[i]``
    is the ``(start, length)`` of entry ``i`` of ``indices`` within its sample.
    """

    #: boundaries of the rows inside ``indices`` (``None``: one row per micro-batch)
    row_offsets: np.ndarray | None = None
    #: ``(start, length)`` token span of each entry of ``indices`` (``None``: nothing split)
    token_spans: np.ndarray | None = None

    @property
    def splits_samples(self) -> bool:
        """Whether entries of ``indices`` are pieces of samples (``on_overflow="split"``)."""
        return self.token_spans is not None

    @property
    def capacity(self) -> int:
        """Tokens per row (``max_tokens``)."""
        return int(self.config.max_tokens)

    def piece_lengths(self) -> np.ndarray:
        """Tokens of every entry of ``indices`` (a piece when samples were split)."""
        if self.token_spans is not None:
            return self.token_spans[:, 1].astype(np.int64)
        return self.lengths[self.indices]

    def batch_spans(self, k: int) -> np.ndarray | None:
        """``(start, length)`` rows of micro-batch ``k``'s entries (None: no splitting)."""
        if self.token_spans is None:
            return None
        return self.token_spans[self.offsets[k] : self.offsets[k + 1]]

    def batch_rows(self, k: int) -> list[np.ndarray]:
        """Sample ids of micro-batch ``k``, one array per packed row."""
        lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
        if self.row_offsets is None:
            return [self.indices[lo:hi]]
        bounds = self.row_offsets[(self.row_offsets >= lo) & (self.row_offsets <= hi)]
        return [self.indices[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    @cached_property
    def stats(self) -> dict:
        """The figures of ``docs/metrics.md`` (fill as ``padding_efficiency``), packing counts."""
        cfg = self.config
        rows_per = cfg.rows_per_batch
        pieces = self.piece_lengths()
        out = metrics.batch_stats(
            pieces, np.arange(pieces.size), self.offsets, world_size=cfg.world_size,
            grad_accum=cfg.grad_accum, cost=cfg.cost, capacity=self.capacity * rows_per,
            seed=self.seed, max_tokens=self.capacity * rows_per)
        key = self.indices.astype(np.int64)
        if self.token_spans is not None:  # a piece is (sample, start)
            key = key * (int(self.lengths.max()) + 1) + self.token_spans[:, 0]
        rows = (self.row_offsets.size - 1 if self.row_offsets is not None
                else self.total_batches)
        tokens = int(pieces.sum())
        best_rows = -(-tokens // self.capacity)
        out.update(
            pieces=int(pieces.size), unique_samples=int(np.unique(self.indices).size),
            repeated_in_schedule=int(key.size - np.unique(key).size),
            layout="pack", capacity=self.capacity, rows=int(rows),
            rows_per_batch=rows_per,
            fill=out["padding_efficiency"], best_rows=int(best_rows),
            efficiency_vs_sorted=best_rows / rows if rows else None,
            order=cfg.order, num_batches=self.num_batches, plan_seconds=self.plan_seconds)
        cost = cfg.cost or CostModel()
        out["cost_model"] = {"a": cost.a, "b": cost.b, "c": cost.c}
        out.update(self.counts)
        return out
