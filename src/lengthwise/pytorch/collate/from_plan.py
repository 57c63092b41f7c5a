"""The collator of a plan: the layout, truncation, padding and budget the plan counted.

:func:`collator_for` is what ``BucketBatchSampler.collator()`` returns: a
:class:`PadCollator` or :class:`PackCollator` that truncates samples to exactly the
length the plan counted them at (``max_len`` and the longest row the budget holds,
under ``on_overflow="truncate"``), pads to the plan's ``pad_multiple``, and checks
every micro-batch against the plan's budget.

Example::

    >>> from lengthwise.planning.config import PlanConfig
    >>> c = collator_for(PlanConfig(max_tokens=16, max_len=6, pad_multiple=4), [8],
    ...                  pad_token_id=0)
    >>> c([{"input_ids": list(range(1, 11))}])["input_ids"].tolist()
    [[1, 2, 3, 4, 5, 6, 0, 0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lengthwise.errors import ConfigError
from lengthwise.pytorch.collate.budget import Budget
from lengthwise.pytorch.collate.packed import PackCollator
from lengthwise.pytorch.collate.padded import PadCollator

__all__ = ["budget_of", "collator_for"]


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


def _fixed(options: dict[str, Any], name: str, value: Any, why: str) -> None:
    """Refuse an option that would make the collator disagree with the plan."""
    if name in options and options[name] != value:
        raise ConfigError(f"{name}={options[name]!r} disagrees with the plan ({name}={value!r}, "
                          f"{why}); leave it out, or build the sampler with the value you want")
    options.pop(name, None)


def collator_for(config: Any, edges: Sequence[int] | None, *, pad_token_id: int | None = None,
                 yield_rows: bool = False, **options: Any) -> PadCollator | PackCollator:
    """The collator that turns micro-batches of a plan of ``config`` into tensors.

    ``edges`` are the plan's bucket edges (the padded layout's ``bucket`` ids);
    ``yield_rows`` says the sampler hands each micro-batch over as its packed rows.
    ``options`` go to the collator (``metadata``, ``label_pad_id``, ``fields``,
    ``padding_side``, ``mask_dtype``, ``pad_to_capacity``...); those the plan sets
    (``pad_multiple``, ``max_length``, ``edges``, ``row_capacity``, ``budget``)
    may only repeat the plan's value.

    Example::

        >>> from lengthwise.planning.config import PlanConfig
        >>> c = collator_for(PlanConfig(max_tokens=8, layout="pack"), [8])
        >>> c([{"input_ids": [1] * 12}])["input_ids"].shape
        torch.Size([1, 8])
    """
    limit = config.sample_limit()  # what the planner truncates to, the one definition
    budget = budget_of(config)
    why = "the sampler's plan counted it"
    _fixed(options, "max_length", limit, why)
    _fixed(options, "budget", budget, why)
    if config.layout == "pad":
        if pad_token_id is None:
            raise TypeError("the padded layout needs pad_token_id: sampler.collator("
                            "pad_token_id=tokenizer.pad_token_id)")
        _fixed(options, "pad_multiple", config.pad_multiple, why)
        _fixed(options, "edges", None if edges is None else list(edges), why)
        return PadCollator(pad_token_id, pad_multiple=config.pad_multiple, max_length=limit,
                           edges=edges, budget=budget, **options)
    capacity = int(config.max_tokens)
    # one row per micro-batch, or rows handed over as rows: the rows are the plan's
    rows_known = yield_rows or config.rows_per_batch == 1
    _fixed(options, "row_capacity", capacity if rows_known else None, why)
    return PackCollator(pad_token_id=pad_token_id, max_length=limit, budget=budget,
                        row_capacity=capacity if rows_known else None, **options)
