"""The configuration of a plan: everything but the lengths, the seed and the epoch.

Example::

    >>> cfg = PlanConfig(max_tokens=4096, world_size=8, grad_accum=2)
    >>> cfg.order, cfg.layout, cfg.row_limit().max_length()
    ('stratified', 'pad', 4096)
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import numpy as np

from lengthwise.planning import batching
from lengthwise.planning.cost import CostModel
from lengthwise.planning.vocabulary import EVEN_OUT, LAYOUTS, ORDERS

__all__ = ["PlanConfig", "lengths_checksum"]


def lengths_checksum(lengths: np.ndarray, crc: int = 0) -> int:
    """A 32-bit CRC of the lengths (as int64), chained onto ``crc``.

    Example::

        >>> lengths_checksum(np.array([1, 2])) == lengths_checksum([1, 2])
        True
    """
    return zlib.crc32(np.ascontiguousarray(lengths, dtype=np.int64).tobytes(), crc)


@dataclass(frozen=True)
class PlanConfig:
    """Everything but the lengths, the seed and the epoch that decides a plan."""

    max_tokens: int | None = None
    batch_size: int | None = None
    buckets: int | str | tuple[int, ...] = "auto"
    order: str = "stratified"
    world_size: int = 1
    grad_accum: int = 1
    max_run: int = 3
    max_len: int | None = None
    pad_multiple: int = 1
    on_overflow: str = "truncate"
    even_out: str = "split"
    cost: CostModel | None = None
    max_cost: float | None = None
    layout: str = "pad"
    rows_per_batch: int = 1

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.on_overflow == "split" and self.layout != "pack":
            raise ValueError("on_overflow='split' cuts long samples into packed rows: it needs "
                             "layout='pack'; padded batches use 'truncate', 'drop' or 'error'")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.world_size < 1 or self.grad_accum < 1:
            raise ValueError("world_size and grad_accum must be >= 1")
        if self.even_out not in EVEN_OUT:
            raise ValueError(f"even_out must be one of {EVEN_OUT}, got {self.even_out!r}")
        if isinstance(self.buckets, list):
            object.__setattr__(self, "buckets", tuple(int(e) for e in self.buckets))
        self.row_limit()  # validates the batch rule

    def row_limit(self) -> batching.RowLimit:
        """The batch rule of this configuration."""
        return batching.row_limit(batch_size=self.batch_size, max_tokens=self.max_tokens,
                                  cost=self.cost, max_cost=self.max_cost,
                                  pad_multiple=self.pad_multiple)

    def fingerprint(self, lengths: np.ndarray | None = None) -> int:
        """A 32-bit checksum of the configuration (and lengths), to detect a changed plan.

        Example::

            >>> PlanConfig(batch_size=4).fingerprint() == PlanConfig(batch_size=4).fingerprint()
            True
        """
        fields = dataclasses.asdict(self)
        fields.pop("world_size")  # an elastic restart may change it
        crc = zlib.crc32(repr(sorted(fields.items())).encode())
        return crc if lengths is None else lengths_checksum(lengths, crc)
