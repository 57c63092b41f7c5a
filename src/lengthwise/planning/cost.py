"""The compute cost of a micro-batch: ``rows * (a*P + b*P**2 + c + d*min(P, cap))``.

``a=1, b=c=d=0`` counts padded tokens. ``b`` covers attention, ``c`` a fixed
per-sample cost and ``d`` a cost per token up to ``cap`` tokens of the row (a
DFlash draft's slots, in proportion to a sample's length up to its anchor limit:
:mod:`lengthwise.dflash.cost.flops`). See ``docs/metrics.md`` ("cost model").

Example::

    >>> CostModel().row_cost(100)
    100.0
    >>> CostModel(a=1, b=0.5, c=10).row_cost(4)
    22.0
    >>> CostModel(a=1, d=2, cap=3).row_cost([2, 8]).tolist()
    [6.0, 14.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.errors import ConfigError


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the per-row cost ``a*P + b*P**2 + c + d*min(P, cap)`` of a padded row
    of length P."""

    a: float = 1.0
    b: float = 0.0
    c: float = 0.0
    d: float = 0.0
    cap: float = float("inf")

    def __post_init__(self) -> None:
        if (min(self.a, self.b, self.c, self.d) < 0
                or self.a + self.b + self.c + self.d <= 0):
            raise ConfigError(f"cost coefficients must be >= 0 and not all zero, got {self}")
        if not self.cap > 0:
            raise ConfigError(f"cost cap must be > 0 tokens, got {self.cap}")

    def __repr__(self) -> str:
        # the capped term only where it is used
        extra = f", d={self.d!r}, cap={self.cap!r}" if self.d else ""
        return f"CostModel(a={self.a!r}, b={self.b!r}, c={self.c!r}{extra})"

    @property
    def linear(self) -> bool:
        """Whether the cost is ``a*P + b*P**2 + c`` (no capped term)."""
        return self.d == 0

    def fields(self) -> dict[str, float]:
        """The coefficients, the capped term's only where it is used."""
        out = {"a": self.a, "b": self.b, "c": self.c}
        if self.d:
            out.update(d=self.d, cap=self.cap)
        return out

    def row_cost(self, padded_len: np.ndarray | float) -> np.ndarray | float:
        """Cost of one row padded to ``padded_len`` tokens."""
        p = np.asarray(padded_len, dtype=np.float64)
        out = self.a * p + self.b * p * p + self.c
        if self.d:
            out = out + self.d * np.minimum(p, self.cap)
        return float(out) if out.ndim == 0 else out

    def batch_cost(self, rows: np.ndarray | int, padded_len: np.ndarray | float):
        """Cost of micro-batches of ``rows`` rows padded to ``padded_len``."""
        out = np.asarray(rows, dtype=np.float64) * self.row_cost(padded_len)
        return float(out) if np.ndim(out) == 0 else out


def round_up(values: np.ndarray | int, multiple: int) -> np.ndarray | int:
    """Round lengths up to a multiple (the padded length of a row).

    Example::

        >>> int(round_up(13, 8))
        16
    """
    if multiple <= 1:
        return values
    return -(-np.asarray(values) // multiple) * multiple
