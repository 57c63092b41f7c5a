"""The padded layout: samples padded into a ``rows x P`` micro-batch, and the bucket it is of.

Example::

    >>> PadCollator(pad_token_id=0, pad_multiple=4)([{"input_ids": [1, 2, 3]}])["input_ids"]
    tensor([[1, 2, 3, 0]])
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from lengthwise.errors import ConfigError
from lengthwise.pytorch.collate.budget import Budget
from lengthwise.pytorch.collate.samples import (
    check_batch,
    check_budget,
    check_edges,
    check_fields,
    int_option,
    pad_value,
    result_dtype,
    sample_fields,
)

__all__ = ["PadCollator", "bucket_of"]


def bucket_of(length: int, edges: Sequence[int]) -> int:
    """Index of the bucket ``(edges[k-1], edges[k]]`` that holds ``length``.

    Example::

        >>> bucket_of(5, [4, 16]), bucket_of(4, [4, 16])
        (1, 0)
    """
    k = bisect.bisect_left(edges, length)
    if k == len(edges):
        raise ConfigError(
            f"a sample of {length} tokens is longer than the last bucket edge {edges[-1]}; "
            "the edges do not match the data (plan with the same max_len, or truncate with "
            "max_length)")
    return k



class PadCollator:
    """Pad samples into a ``rows x P`` micro-batch, ``P`` = longest rounded up to ``pad_multiple``.

    Samples are mappings with ``input_ids`` (list, array or tensor of token ids) and
    optionally ``labels`` (default: a copy of ``input_ids``) and the other ``fields``,
    which are padded with 0. Returns ``input_ids``, ``attention_mask``, ``labels``,
    the other fields, and the metadata ``real_tokens``, ``padded_tokens``,
    ``samples`` and ``bucket`` (bucket id of the longest sample in ``edges``; ``-1``
    without edges). ``max_length`` truncates samples first, as the planner's
    ``max_len`` does. With a ``budget`` (a :class:`~lengthwise.pytorch.collate.budget.Budget`)
    every micro-batch is checked against it and an over-sized one raises
    :class:`~lengthwise.pytorch.collate.budget.BudgetError`.

    ``sampler.collator(pad_token_id)`` builds this collator from the sampler's plan:
    the same ``pad_multiple`` (default 1, as the planner's), ``max_length``,
    ``edges`` and budget, so every micro-batch is exactly what the plan counted.

    Example::

        >>> c = PadCollator(pad_token_id=0, pad_multiple=1, metadata=False)
        >>> b = c([{"input_ids": [1, 2], "labels": [-100, 2]}, {"input_ids": [3]}])
        >>> b["labels"].tolist(), b["attention_mask"].tolist()
        ([[-100, 2], [3, -100]], [[1, 1], [1, 0]])
    """

    def __init__(
        self,
        pad_token_id: int,
        *,
        pad_multiple: int = 1,
        label_pad_id: int = -100,
        fields: Sequence[str] = ("input_ids", "labels"),
        padding_side: Literal["right", "left"] = "right",
        edges: Sequence[int] | None = None,
        max_length: int | None = None,
        metadata: bool = True,
        budget: Budget | None = None,
    ) -> None:
        if padding_side not in ("right", "left"):
            raise ConfigError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        self.pad_token_id = int_option("pad_token_id", pad_token_id, minimum=0, allow_none=False)
        self.pad_multiple = int_option("pad_multiple", pad_multiple, allow_none=False)
        self.label_pad_id = int_option("label_pad_id", label_pad_id, minimum=None,
                                       allow_none=False)
        self.fields = check_fields(fields)
        self.padding_side = padding_side
        self.edges = check_edges(edges)
        self.max_length = int_option("max_length", max_length)
        self.metadata = metadata
        self.budget = check_budget(budget, "pad", "PadCollator")
        self._calls = 0  # micro-batches collated so far (names the batch in a BudgetError)

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        samples = check_batch(samples, "PadCollator")
        rows = [sample_fields(s, i, self.fields, self.max_length) for i, s in enumerate(samples)]
        lengths = [r["input_ids"].size for r in rows]
        longest = max(lengths)
        padded_len = -(-longest // self.pad_multiple) * self.pad_multiple
        n = len(rows)
        self._calls += 1
        if self.budget is not None:
            self.budget.check_padded(rows=n, padded_len=padded_len, batch=self._calls - 1)
        batch: dict[str, Any] = {}
        for field in self.fields:
            dtype = result_dtype([r[field] for r in rows], field)
            fill = pad_value(field, self.pad_token_id, self.label_pad_id)
            batch[field] = torch.full((n, padded_len), fill, dtype=dtype)
        mask = torch.zeros((n, padded_len), dtype=torch.long)
        for i, (row, length) in enumerate(zip(rows, lengths, strict=True)):
            cols = slice(0, length) if self.padding_side == "right" else slice(
                padded_len - length, padded_len)
            mask[i, cols] = 1
            for field in self.fields:
                batch[field][i, cols] = torch.from_numpy(np.ascontiguousarray(row[field]))
        batch["attention_mask"] = mask
        if self.metadata:
            batch["real_tokens"] = int(sum(lengths))
            batch["padded_tokens"] = n * padded_len
            batch["samples"] = n
            batch["bucket"] = bucket_of(longest, self.edges) if self.edges else -1
        return batch
