"""Collators held to a plan: the layout, truncation, padding and budget the plan counted.

:func:`collator_for` is what ``BucketBatchSampler.collator()`` returns: a
:class:`PadCollator` or :class:`PackCollator` that truncates samples to exactly the
length the plan counted them at (``max_len`` and the longest row the budget holds,
under ``on_overflow="truncate"``), pads to the plan's ``pad_multiple``, and checks
every micro-batch against the plan's budget. :class:`HeldCollator` holds a collator of
your own (Hugging Face's, TRL's...) to the plan: samples truncated, then every result
checked against the budget, raising :class:`~lengthwise.pytorch.collate.budget.BudgetError`
instead of handing the GPU more than the plan allowed.

Example::

    >>> import torch
    >>> from lengthwise.planning.config import PlanConfig
    >>> c = collator_for(PlanConfig(max_tokens=16, max_len=6, pad_multiple=4), [8],
    ...                  pad_token_id=0)
    >>> c([{"input_ids": list(range(1, 11))}])["input_ids"].tolist()
    [[1, 2, 3, 4, 5, 6, 0, 0]]
    >>> def pad(samples):
    ...     n = max(len(s["input_ids"]) for s in samples)
    ...     return {"input_ids": torch.tensor([s["input_ids"] + [0] * (n - len(s["input_ids"]))
    ...                                        for s in samples])}
    >>> held = HeldCollator(pad, PlanConfig(max_tokens=8))
    >>> held([{"input_ids": [1] * 20}])["input_ids"].shape
    torch.Size([1, 8])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.pytorch.collate.budget import Budget, budget_of
from lengthwise.pytorch.collate.packed import PackCollator
from lengthwise.pytorch.collate.padded import PadCollator

__all__ = ["HeldCollator", "collator_for"]


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


def _truncate(sample: Any, limit: int) -> Any:
    """``sample`` with every field as long as its ``input_ids`` cut to ``limit`` items, and
    every field one item shorter (labels shifted ahead of time) cut to ``limit - 1``.
    """
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        return sample
    try:
        n = len(sample["input_ids"])
    except TypeError:
        return sample
    if n <= limit:
        return sample
    out = dict(sample, input_ids=sample["input_ids"][:limit])
    for key, value in sample.items():
        if key == "input_ids" or isinstance(value, (str, bytes)):
            continue
        try:
            size = len(value)
        except TypeError:  # a scalar field
            continue
        if size == n:
            out[key] = value[:limit]
        elif size == n - 1:  # shifted: item i belongs to position i + 1 of input_ids
            out[key] = value[: limit - 1]
    return out


class HeldCollator:
    """Wrap ``collator`` so its micro-batches are truncated and budgeted as the plan counted.

    ``config`` is the plan's :class:`~lengthwise.planning.config.PlanConfig`
    (``sampler.config``). Samples that are mappings with ``input_ids`` are cut to
    ``config.sample_limit()`` tokens (with every field of the same length, and a field
    one item shorter, such as labels shifted ahead of time, to one less); the
    result's ``input_ids`` is checked: ``rows x padded length`` (or rows, or cost)
    for the padded layout, its tokens for the packed one. A result that cannot be
    checked (not a mapping with an ``input_ids`` tensor or array, 2-D for the padded
    layout, 1-D or 2-D for the packed one) raises ``TypeError``: nothing leaves
    unchecked.
    """

    def __init__(self, collator: Callable[[list[Any]], Any], config: Any) -> None:
        if not callable(collator):
            raise TypeError(f"collator must be callable, got {collator!r}")
        if not callable(getattr(config, "sample_limit", None)):
            raise TypeError(f"config must be the plan's PlanConfig (sampler.config), got "
                            f"{type(config).__name__}")
        self.inner = collator
        self.limit = config.sample_limit()
        self.budget: Budget = budget_of(config)
        self._calls = 0

    def __call__(self, samples: list[Any]) -> Any:
        if self.limit is not None:
            samples = [_truncate(s, self.limit) for s in samples]
        batch = self.inner(samples)
        self._calls += 1
        shape = self._shape(batch)
        if self.budget.layout == "pad":
            self.budget.check_padded(rows=shape[0], padded_len=shape[1], batch=self._calls - 1)
        else:
            self.budget.check_packed([int(np.prod(shape))], batch=self._calls - 1,
                                     rows_known=False)
        return batch

    def _shape(self, batch: Any) -> tuple[int, ...]:
        """The shape of ``batch["input_ids"]``, or a TypeError saying what the budget needs."""
        want = ("2-D (rows x length)" if self.budget.layout == "pad"
                else "1-D or 2-D (the packed tokens)")
        where = f"HeldCollator: micro-batch {self._calls - 1}"
        if not isinstance(batch, Mapping) or "input_ids" not in batch:
            got = (f"a mapping with keys {sorted(map(str, batch))[:8]}"
                   if isinstance(batch, Mapping) else f"a {type(batch).__name__}")
            raise TypeError(f"{where}: the wrapped collator returned {got}; it must return a "
                            f"mapping with an input_ids tensor, {want}, so that the plan's "
                            "budget can be checked")
        shape = getattr(batch["input_ids"], "shape", None)
        if shape is None or len(shape) not in ((2,) if self.budget.layout == "pad" else (1, 2)):
            got = (f"has shape {tuple(shape)}" if shape is not None
                   else f"is a {type(batch['input_ids']).__name__}")
            raise TypeError(f"{where}: input_ids {got}; the plan's budget needs a tensor, "
                            f"{want}")
        return tuple(int(x) for x in shape)
