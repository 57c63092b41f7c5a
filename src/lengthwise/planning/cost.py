"""The compute cost of a micro-batch: ``rows * (a*P + b*P**2 + c)``.

``a=1, b=c=0`` counts padded tokens. ``b`` covers attention and ``c`` a fixed
per-sample cost. See ``docs/metrics.md`` ("cost model").

Example::

    >>> CostModel().row_cost(100)
    100.0
    >>> CostModel(a=1, b=0.5, c=10).row_cost(4)
    22.0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthwise.errors import ConfigError


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the per-row cost ``a*P + b*P**2 + c`` of a padded row of length P."""

    a: float = 1.0
    b: float = 0.0
    c: float = 0.0

    def __post_init__(self) -> None:
        if min(self.a, self.b, self.c) < 0 or self.a + self.b + self.c <= 0:
            raise ConfigError(f"cost coefficients must be >= 0 and not all zero, got {self}")

    def row_cost(self, padded_len: np.ndarray | float) -> np.ndarray | float:
        """Cost of one row padded to ``padded_len`` tokens."""
        p = np.asarray(padded_len, dtype=np.float64)
        out = self.a * p + self.b * p * p + self.c
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
