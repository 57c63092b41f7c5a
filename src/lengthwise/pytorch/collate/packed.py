"""The packed layout: samples concatenated into padding-free rows with per-sample positions,
the rows cut by next fit, their block-diagonal attention mask, and a data set view that
fetches whole rows.

Example::

    >>> PackCollator()([{"input_ids": [5, 6]}, {"input_ids": [7]}])["position_ids"]
    tensor([[0, 1, 0]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lengthwise.errors import ConfigError, DataError
from lengthwise.pytorch.collate.budget import Budget
from lengthwise.pytorch.collate.samples import (
    check_batch,
    check_budget,
    check_fields,
    int_option,
    pad_value,
    result_dtype,
    sample_fields,
)

__all__ = ["PackCollator", "RowsDataset", "packed_attention_mask"]

Row = list[dict[str, np.ndarray]]


def sample_rows(samples: list[Any], fields: tuple[str, ...], max_length: int | None,
                capacity: int | None) -> list[Row]:
    """Samples grouped into rows, each sample's fields as arrays.

    A list of lists gives the rows explicitly; a flat list is one row, or, with a
    ``capacity``, split in order into rows of at most ``capacity`` tokens.
    """
    explicit = isinstance(samples[0], (list, tuple))
    if explicit and not all(isinstance(r, (list, tuple)) for r in samples):
        raise TypeError("PackCollator got a mix of rows (lists) and samples; "
                        "give one or the other")
    if explicit:
        rows, index = [], 0
        for r, row in enumerate(samples):
            if not row:
                raise DataError(f"PackCollator: row {r} is empty")
            rows.append([sample_fields(s, index + j, fields, max_length)
                         for j, s in enumerate(row)])
            index += len(row)
    else:
        flat = [sample_fields(s, i, fields, max_length) for i, s in enumerate(samples)]
        rows = [flat] if capacity is None else next_fit(flat, capacity)
    if capacity is not None:
        for r, row in enumerate(rows):
            used = sum(s["input_ids"].size for s in row)
            if used > capacity:
                raise DataError(f"PackCollator: row {r} holds {used} tokens, more than "
                                f"row_capacity={capacity}")
    return rows


def next_fit(flat: Row, capacity: int) -> list[Row]:
    """Samples in order into rows of at most ``capacity`` tokens, a new row when one is full."""
    rows: list[Row] = [[]]
    used = 0
    for i, s in enumerate(flat):
        n = s["input_ids"].size
        if n > capacity:
            raise DataError(f"sample {i} has {n} tokens, more than row_capacity={capacity}; "
                            "split or truncate it first (max_length)")
        if used + n > capacity:
            rows.append([])
            used = 0
        rows[-1].append(s)
        used += n
    return rows


def packed_attention_mask(position_ids: torch.Tensor,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A causal, block-diagonal ``(B, 1, T, T)`` mask for packed rows.

    A new sample starts wherever the position id does not grow by one. Tokens
    attend only to earlier tokens of their own sample. With ``dtype=torch.bool``
    the mask is ``True`` where attention is allowed; with a floating dtype it is
    additive (0 allowed, the dtype's minimum blocked), as eager attention needs.
    Memory is ``B*T*T`` elements: meant for eager/SDPA attention at moderate ``T``;
    varlen kernels use ``cu_seq_lens`` instead.

    Example::

        >>> m = packed_attention_mask(torch.tensor([[0, 1, 0, 1]]), dtype=torch.bool)
        >>> m[0, 0].int().tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    """
    if position_ids.ndim == 1:
        position_ids = position_ids[None]
    if position_ids.ndim != 2:
        raise DataError("position_ids must be (batch, tokens), "
                        f"got shape {tuple(position_ids.shape)}")
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    segment = starts.long().cumsum(-1)
    t = position_ids.shape[1]
    causal = torch.ones((t, t), dtype=torch.bool, device=position_ids.device).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    allowed = allowed[:, None]
    if dtype == torch.bool:
        return allowed
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be torch.bool or a floating dtype, got {dtype}")
    out = torch.zeros(allowed.shape, dtype=dtype, device=position_ids.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)



class PackCollator:
    """Concatenate samples into one padding-free row, as Hugging Face's flattening collator.

    Output (all ``(1, T)`` unless noted): ``input_ids``; ``labels`` with the first
    token of every sample set to ``label_pad_id`` so no prediction crosses a
    sample boundary (labels are not shifted; the model shifts them);
    ``position_ids`` restarting at ``position_ids_start`` for every sample; with
    ``return_flash_attn_kwargs``, ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32,
    ``(n+1,)``) and ``max_length_q``/``max_length_k`` (ints); with
    ``return_seq_idx``, ``seq_idx`` (int32); the other ``fields`` concatenated; and
    the metadata (``bucket`` is ``-1``).

    Rows: a flat list of samples is one row, or, with ``row_capacity`` ``C``, split
    in order into rows of at most ``C`` tokens (next fit); a list of lists gives the
    rows explicitly. Rows are concatenated too (varlen attention does not need a
    row dimension); ``padded_tokens`` is ``rows * C`` (``T`` without ``C``).
    ``pad_to_capacity`` closes every row with a filler sample of ``pad_token_id``
    (labels masked) so the output can be viewed as ``(rows, C)``.

    Attention stays inside samples when the model builds its mask from
    ``position_ids`` or ``cu_seq_lens`` (Hugging Face models with FlashAttention
    varlen, or SDPA/eager when called without a cache: ``use_cache=False``, which
    ``Trainer`` sets). Otherwise pass ``mask_dtype`` to add an explicit
    block-diagonal 4-D ``attention_mask`` (see :func:`packed_attention_mask`).

    With a packed ``budget`` every micro-batch is checked against it (each row
    within the capacity, at most ``budget.rows`` rows; a flat list without
    ``row_capacity``: at most ``rows x capacity`` tokens), raising
    :class:`~lengthwise.pytorch.collate.budget.BudgetError`. ``sampler.collator()`` builds
    this collator from a packed plan (``max_length``, ``row_capacity``, budget).

    Example::

        >>> b = PackCollator(metadata=False)([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
        >>> b["labels"].tolist(), b["position_ids"].tolist(), b["cu_seq_lens_q"].tolist()
        ([[-100, 6, 7, -100, 9]], [[0, 1, 2, 0, 1]], [0, 3, 5])
    """

    def __init__(
        self,
        *,
        label_pad_id: int = -100,
        fields: Sequence[str] = ("input_ids", "labels"),
        row_capacity: int | None = None,
        pad_to_capacity: bool = False,
        pad_token_id: int | None = None,
        return_flash_attn_kwargs: bool = True,
        return_seq_idx: bool = False,
        position_ids_start: int = 0,
        max_length: int | None = None,
        mask_dtype: torch.dtype | None = None,
        metadata: bool = True,
        budget: Budget | None = None,
    ) -> None:
        row_capacity = int_option("row_capacity", row_capacity)
        pad_token_id = int_option("pad_token_id", pad_token_id, minimum=0)
        if pad_to_capacity and (row_capacity is None or pad_token_id is None):
            raise ConfigError("pad_to_capacity needs row_capacity and pad_token_id")
        if mask_dtype is not None and not (isinstance(mask_dtype, torch.dtype) and (
                mask_dtype == torch.bool or mask_dtype.is_floating_point)):
            raise TypeError(f"mask_dtype must be torch.bool or a floating dtype, got {mask_dtype}")
        self.label_pad_id = int_option("label_pad_id", label_pad_id, minimum=None,
                                       allow_none=False)
        self.fields = check_fields(fields)
        self.row_capacity = row_capacity
        self.pad_to_capacity = pad_to_capacity
        self.pad_token_id = pad_token_id
        self.return_flash_attn_kwargs = return_flash_attn_kwargs
        self.return_seq_idx = return_seq_idx
        self.position_ids_start = int_option("position_ids_start", position_ids_start, minimum=0,
                                             allow_none=False)
        self.max_length = int_option("max_length", max_length)
        self.mask_dtype = mask_dtype
        self.metadata = metadata
        self.budget = check_budget(budget, "pack", "PackCollator")
        self._calls = 0  # micro-batches collated so far (names the batch in a BudgetError)

    def _filler(self, n: int, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A sample of ``n`` padding tokens with the fields and dtypes of ``like``."""
        return {field: np.full(n, pad_value(field, self.pad_token_id, self.label_pad_id),
                               dtype=arr.dtype)
                for field, arr in like.items()}

    def __call__(self, samples: Sequence[Any]) -> dict[str, Any]:
        samples = check_batch(samples, "PackCollator")
        rows = sample_rows(samples, self.fields, self.max_length, self.row_capacity)
        row_tokens = [sum(s["input_ids"].size for s in row) for row in rows]
        self._calls += 1
        if self.budget is not None:
            flat = self.row_capacity is None and not isinstance(samples[0], (list, tuple))
            self.budget.check_packed(row_tokens, batch=self._calls - 1, rows_known=not flat)
        segments: list[dict[str, np.ndarray]] = []
        for row, used in zip(rows, row_tokens, strict=True):
            segments.extend(row)
            if self.pad_to_capacity and used < self.row_capacity:
                segments.append(self._filler(self.row_capacity - used, row[0]))
        seg_lens = np.array([s["input_ids"].size for s in segments], dtype=np.int64)
        cu = np.concatenate(([0], np.cumsum(seg_lens)))
        total = int(cu[-1])

        batch: dict[str, Any] = {}
        for field in self.fields:
            arrays = [s[field] for s in segments]
            dtype = result_dtype(arrays, field)
            values = torch.from_numpy(np.concatenate(arrays))
            if field == "labels":
                values = values.clone()
                values[torch.from_numpy(cu[:-1])] = self.label_pad_id
            batch[field] = values.to(dtype)[None]
        # position of each token inside its sample
        starts = np.repeat(cu[:-1], seg_lens)
        positions = np.arange(total, dtype=np.int64) - starts + self.position_ids_start
        batch["position_ids"] = torch.from_numpy(positions)[None]
        if self.return_seq_idx:
            seq = np.repeat(np.arange(len(segments), dtype=np.int32), seg_lens)
            batch["seq_idx"] = torch.from_numpy(seq)[None]
        if self.return_flash_attn_kwargs:
            cu32 = torch.from_numpy(cu.astype(np.int32))
            batch["cu_seq_lens_q"] = cu32
            batch["cu_seq_lens_k"] = cu32.clone()
            batch["max_length_q"] = batch["max_length_k"] = int(seg_lens.max())
        if self.mask_dtype is not None:
            batch["attention_mask"] = packed_attention_mask(batch["position_ids"], self.mask_dtype)
        if self.metadata:
            batch["real_tokens"] = int(sum(row_tokens))
            batch["padded_tokens"] = (len(rows) * self.row_capacity if self.row_capacity
                                      else total)
            batch["samples"] = sum(len(row) for row in rows)
            batch["bucket"] = -1
        return batch


class RowsDataset:
    """Wrap a map-style data set: a list of indices fetches that list of samples.

    ``DataLoader(RowsDataset(ds), batch_sampler=BucketBatchSampler(..., PlanConfig(...,
    layout="pack", rows_per_batch=R), yield_rows=True), collate_fn=PackCollator())``
    hands the collator each micro-batch as a list of rows, exactly as the plan packed them.

    Example::

        >>> RowsDataset(["a", "b", "c"])[[2, 0]], RowsDataset(["a", "b", "c"])[1]
        (['c', 'a'], 'b')
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | Sequence[int]) -> Any:
        if isinstance(index, (list, tuple)):
            return [self.dataset[i] for i in index]
        return self.dataset[index]
