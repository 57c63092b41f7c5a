"""A data set view that fetches whole packed rows, for samplers that yield rows.

``DataLoader(RowsDataset(ds), batch_sampler=BucketBatchSampler(..., PlanConfig(...,
layout="pack", rows_per_batch=R), yield_rows=True), collate_fn=PackCollator())`` hands the collator
each micro-batch as a list of rows (lists of samples), exactly as the plan packed them.

Example::

    >>> RowsDataset(["a", "b", "c"])[[2, 0]]
    ['c', 'a']
    >>> RowsDataset(["a", "b", "c"])[1]
    'b'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class RowsDataset:
    """Wrap a map-style data set: a list of indices fetches that list of samples."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | Sequence[int]) -> Any:
        if isinstance(index, (list, tuple)):
            return [self.dataset[i] for i in index]
        return self.dataset[index]
