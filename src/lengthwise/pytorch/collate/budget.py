"""The budget of one planned micro-batch, checked on every collated batch.

A :class:`Budget` holds the batch rule of a plan: padded tokens (rows x padded
length), rows, or a cost for the padded layout; tokens per packed row and rows
per micro-batch for the packed layout. The collators built by
``BucketBatchSampler.collator()`` check every micro-batch against it and raise
:class:`BudgetError` instead of handing an over-sized batch to the GPU.

Example::

    >>> Budget(max_tokens=16).check_padded(rows=2, padded_len=8, batch=0)
    >>> Budget(max_tokens=16).check_padded(rows=3, padded_len=8, batch=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lengthwise.pytorch.collate.budget.BudgetError: micro-batch 4 is over the plan's budget: ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lengthwise.errors import ConfigError
from lengthwise.planning.cost import CostModel

__all__ = ["Budget", "BudgetError", "budget_of"]

_HINT = ("(the samples are longer than the lengths the plan was built from, or the collator "
         "truncates or pads differently from the plan: use sampler.collator(), which truncates "
         "to the plan's limit and pads to its pad_multiple)")


class BudgetError(ConfigError):
    """A collated micro-batch holds more than the plan's budget allows."""


@dataclass(frozen=True)
class Budget:
    """What one micro-batch may hold, from the plan's batch rule.

    Padded layout: ``max_tokens`` (rows x padded length), ``batch_size`` (rows), or
    ``max_cost`` with the cost coefficients ``cost = (a, b, c)`` (rows x
    ``a*P + b*P**2 + c``), or ``(a, b, c, d, cap)`` (plus ``d*min(P, cap)``). Packed
    layout (``layout="pack"``): ``max_tokens`` is the capacity of a row and ``rows`` the
    rows of a micro-batch.

    Example::

        >>> Budget(max_tokens=8, rows=2, layout="pack").check_packed([8, 7], batch=0)
    """

    max_tokens: int | None = None
    batch_size: int | None = None
    max_cost: float | None = None
    cost: tuple[float, ...] = (1.0, 0.0, 0.0)
    rows: int = 1
    layout: str = "pad"

    def __post_init__(self) -> None:
        if self.layout not in ("pad", "pack"):
            raise ConfigError(f"layout must be 'pad' or 'pack', got {self.layout!r}")
        given = [x is not None for x in (self.max_tokens, self.batch_size, self.max_cost)]
        if sum(given) != 1:
            raise ConfigError("a budget has exactly one of max_tokens, batch_size or max_cost")
        if self.layout == "pack" and self.max_tokens is None:
            raise ConfigError("a packed budget needs max_tokens (the tokens of one row)")

    def check_padded(self, *, rows: int, padded_len: int, batch: int) -> None:
        """Raise :class:`BudgetError` if ``rows`` rows of ``padded_len`` tokens break the rule.

        Example::

            >>> Budget(batch_size=4).check_padded(rows=4, padded_len=10_000, batch=0)
        """
        where = f"micro-batch {batch} is over the plan's budget"
        if self.batch_size is not None:
            if rows > self.batch_size:
                raise BudgetError(f"{where}: {rows} rows > batch_size={self.batch_size} {_HINT}")
            return
        if self.max_tokens is not None:
            tokens = rows * padded_len
            if tokens > self.max_tokens:
                raise BudgetError(f"{where}: {rows} rows x {padded_len} padded tokens = {tokens} "
                                  f"> max_tokens={self.max_tokens} {_HINT}")
            return
        model = CostModel(*self.cost)
        spent = rows * model.row_cost(padded_len)
        if spent > self.max_cost * (1 + 1e-12):
            coeffs = ", ".join(f"{k}={v}" for k, v in model.fields().items())
            raise BudgetError(f"{where}: {rows} rows x {padded_len} padded tokens cost "
                              f"{spent:.6g} > max_cost={self.max_cost} ({coeffs}) {_HINT}")

    def check_packed(self, row_tokens: Sequence[int], *, batch: int,
                     rows_known: bool = True) -> None:
        """Raise :class:`BudgetError` if packed rows break the rule.

        ``row_tokens`` are the tokens of each row; with ``rows_known=False`` they
        are one flat list of the micro-batch's samples, checked in total only
        (at most ``rows x max_tokens``).

        Example::

            >>> Budget(max_tokens=8, rows=2, layout="pack").check_packed([15], batch=0,
            ...                                                           rows_known=False)
        """
        where = f"micro-batch {batch} is over the plan's budget"
        cap = int(self.max_tokens)
        if not rows_known:
            total = int(sum(row_tokens))
            if total > self.rows * cap:
                raise BudgetError(f"{where}: {total} tokens > {self.rows} rows x {cap} tokens "
                                  f"{_HINT}")
            return
        if len(row_tokens) > self.rows:
            raise BudgetError(f"{where}: {len(row_tokens)} packed rows > rows_per_batch="
                              f"{self.rows} {_HINT}")
        for r, used in enumerate(row_tokens):
            if used > cap:
                raise BudgetError(f"{where}: row {r} holds {used} tokens > max_tokens={cap} "
                                  f"(the row capacity) {_HINT}")


def budget_of(config: Any) -> Budget:
    """The :class:`Budget` of one micro-batch of a plan of ``config``.

    Example::

        >>> from lengthwise.planning.config import PlanConfig
        >>> budget_of(PlanConfig(max_tokens=4096, layout="pack", rows_per_batch=2)).rows
        2
    """
    cost = config.cost
    coeffs = (1.0, 0.0, 0.0) if cost is None else tuple(float(v) for v in cost.fields().values())
    return Budget(max_tokens=config.max_tokens, batch_size=config.batch_size,
                  max_cost=config.max_cost, cost=coeffs, rows=int(config.rows_per_batch),
                  layout=config.layout)
