"""A collator of your own (Hugging Face's, TRL's...) held to a plan: truncated, then checked.

:class:`HeldCollator` truncates every sample to the length the plan counted it at
(``PlanConfig.sample_limit()``: ``max_len`` and the longest row the budget holds),
calls the wrapped collator, and checks the micro-batch it returns against the
plan's budget, raising :class:`~lengthwise.pytorch.collate.budget.BudgetError`
instead of handing the GPU more than the plan allowed.

Example::

    >>> import torch
    >>> from lengthwise.planning.config import PlanConfig
    >>> def pad(samples):
    ...     n = max(len(s["input_ids"]) for s in samples)
    ...     return {"input_ids": torch.tensor([s["input_ids"] + [0] * (n - len(s["input_ids"]))
    ...                                        for s in samples])}
    >>> held = HeldCollator(pad, PlanConfig(max_tokens=8))
    >>> held([{"input_ids": [1] * 20}])["input_ids"].shape
    torch.Size([1, 8])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lengthwise.pytorch.collate.budget import Budget
from lengthwise.pytorch.collate.from_plan import budget_of

__all__ = ["HeldCollator"]


def _truncate(sample: Any, limit: int) -> Any:
    """``sample`` with every field as long as its ``input_ids`` cut to ``limit`` items, and
    every field one item shorter (labels shifted ahead of time) cut to ``limit - 1``.

    Example::

        >>> cut = _truncate({"input_ids": [1, 2, 3, 4], "labels": [2, 3, 4]}, 2)
        >>> cut["input_ids"], cut["labels"]
        ([1, 2], [2])
    """
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        return sample
    try:
        n = len(sample["input_ids"])
    except TypeError:
        return sample
    if n <= limit:
        return sample
    out = dict(sample)
    for key, value in sample.items():
        if key == "input_ids" or isinstance(value, (str, bytes)):
            out[key] = value[:limit] if key == "input_ids" else value
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
