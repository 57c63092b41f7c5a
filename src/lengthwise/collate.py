"""Collators that turn samples of token ids into model inputs, padded or packed.

Both collators return a dict of torch tensors plus four plain ``int`` entries the
training loop can log (see METRICS.md):

* ``real_tokens``: tokens that belong to samples;
* ``padded_tokens``: tokens the micro-batch occupies (``rows * P`` padded,
  ``rows * C`` packed with a row capacity ``C``);
* ``samples``: samples in the micro-batch;
* ``bucket``: bucket id of the micro-batch (``-1`` when unknown or packed).

Strip them with :func:`model_inputs` before calling the model (and read them with
:func:`batch_metadata`), or build the collator with ``metadata=False`` (for
``transformers.Trainer``, which passes the whole batch to the model).

Example::

    >>> import lengthwise
    >>> collate = lengthwise.PadCollator(pad_token_id=0, pad_multiple=4, edges=[4, 16])
    >>> batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9, 10, 11, 12]}])
    >>> batch["input_ids"].tolist()
    [[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 10, 11, 12, 0, 0, 0]]
    >>> batch["real_tokens"], batch["padded_tokens"], batch["bucket"]
    (8, 16, 1)
    >>> sorted(model_inputs(batch))
    ['attention_mask', 'input_ids', 'labels']
    >>> batch_metadata(batch)
    {'real_tokens': 8, 'padded_tokens': 16, 'samples': 2, 'bucket': 1}
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

__all__ = [
    "METADATA_KEYS",
    "PackCollator",
    "PadCollator",
    "batch_metadata",
    "bucket_of",
    "model_inputs",
    "packed_attention_mask",
]

#: keys of the logging metadata that the collators add to a batch
METADATA_KEYS: tuple[str, ...] = ("real_tokens", "padded_tokens", "samples", "bucket")

_TOKEN_FIELDS = ("input_ids", "labels")


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch without the logging metadata, ready for ``model(**model_inputs(batch))``.

    Example::

        >>> model_inputs({"input_ids": 1, "real_tokens": 3, "padded_tokens": 4, "bucket": 0})
        {'input_ids': 1}
    """
    return {k: v for k, v in batch.items() if k not in METADATA_KEYS}


def batch_metadata(batch: Mapping[str, Any]) -> dict[str, int | None]:
    """The logging metadata of a batch, ``bucket`` ``None`` when unknown.

    Made to be passed on as keywords, e.g.
    ``step_logger.record_micro(loss=loss, **batch_metadata(batch))``.

    Example::

        >>> batch_metadata({"real_tokens": 5, "padded_tokens": 8, "samples": 2, "bucket": -1})
        {'real_tokens': 5, 'padded_tokens': 8, 'samples': 2, 'bucket': None}
    """
    missing = [k for k in METADATA_KEYS if k not in batch]
    if missing:
        raise KeyError(f"the batch has no {missing}: build the collator with metadata=True")
    out = {k: int(batch[k]) for k in METADATA_KEYS}
    if out["bucket"] < 0:
        out["bucket"] = None
    return out


def bucket_of(length: int, edges: Sequence[int]) -> int:
    """Index of the bucket ``(edges[k-1], edges[k]]`` that holds ``length``.

    Example::

        >>> bucket_of(5, [4, 16]), bucket_of(4, [4, 16])
        (1, 0)
    """
    k = bisect.bisect_left(edges, length)
    if k == len(edges):
        raise ValueError(
            f"a sample of {length} tokens is longer than the last bucket edge {edges[-1]}; "
            "the edges do not match the data (plan with the same max_len, or truncate with "
            "max_length)")
    return k


def _check_edges(edges: Sequence[int] | None) -> list[int] | None:
    if edges is None:
        return None
    out = [int(e) for e in edges]
    if not out or any(e != orig for e, orig in zip(out, edges, strict=True)):
        raise ValueError(f"edges must be a non-empty list of integer upper edges, got {edges!r}")
    if any(b <= a for a, b in zip(out, out[1:], strict=False)) or out[0] < 1:
        raise ValueError(f"edges must be positive and strictly increasing, got {out}")
    return out


def _check_fields(fields: Sequence[str]) -> tuple[str, ...]:
    if isinstance(fields, str):
        fields = (fields,)
    fields = tuple(fields)
    if "input_ids" not in fields:
        raise ValueError(f"fields must include 'input_ids', got {fields}")
    if len(set(fields)) != len(fields):
        raise ValueError(f"fields has duplicates: {fields}")
    # the attention mask is always built from the lengths
    return tuple(f for f in fields if f != "attention_mask")


def _as_array(value: Any, field: str, index: int) -> np.ndarray:
    """One sample's field as a 1-D NumPy array, with token fields checked to be integers."""
    if isinstance(value, torch.Tensor):
        arr = value.detach().cpu().numpy()
    else:
        arr = np.asarray(value)
    where = f"sample {index}, field {field!r}"
    if arr.ndim != 1:
        raise ValueError(f"{where}: expected a 1-D sequence of tokens, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{where}: the sample has no tokens")
    if field in _TOKEN_FIELDS:
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{where}: token ids must be integers, got dtype {arr.dtype}")
        if field == "input_ids" and arr.min() < 0:
            raise ValueError(f"{where}: negative token id {int(arr.min())}")
    elif arr.dtype.kind not in "iufb":
        raise TypeError(f"{where}: expected numbers, got dtype {arr.dtype}")
    return arr


def _sample_fields(sample: Any, index: int, fields: tuple[str, ...],
                   max_length: int | None) -> dict[str, np.ndarray]:
    """The listed fields of one sample, ``labels`` defaulting to ``input_ids``, all one length."""
    if not isinstance(sample, Mapping):
        raise TypeError(f"sample {index}: expected a mapping of fields (a dict), "
                        f"got {type(sample).__name__}")
    if "input_ids" not in sample:
        raise KeyError(f"sample {index} has no 'input_ids' (it has {sorted(sample)})")
    out = {"input_ids": _as_array(sample["input_ids"], "input_ids", index)}
    n = out["input_ids"].size
    for field in fields:
        if field == "input_ids":
            continue
        if field not in sample:
            if field == "labels":
                out[field] = out["input_ids"]
                continue
            raise KeyError(f"sample {index} has no field {field!r} (it has {sorted(sample)})")
        arr = _as_array(sample[field], field, index)
        if arr.size != n:
            raise ValueError(f"sample {index}: field {field!r} has {arr.size} values but "
                             f"'input_ids' has {n}")
        out[field] = arr
    if max_length is not None and n > max_length:
        out = {k: v[:max_length] for k, v in out.items()}
    return out


def _check_batch(samples: Any, who: str) -> list[Any]:
    if isinstance(samples, Mapping):
        raise TypeError(f"{who} expects a list of samples, got a single mapping; "
                        "wrap it in a list")
    samples = list(samples)
    if not samples:
        raise ValueError(f"{who} received an empty batch")
    return samples


def _result_dtype(arrays: list[np.ndarray], field: str) -> torch.dtype:
    if field in _TOKEN_FIELDS:
        return torch.long
    kind = np.result_type(*arrays)
    return torch.from_numpy(np.zeros(0, dtype=kind)).dtype


def _check_positive(name: str, value: int | None, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class PadCollator:
    """Pad samples into a ``rows x P`` micro-batch, ``P`` = longest rounded up to ``pad_multiple``.

    Samples are mappings with ``input_ids`` (list, array or tensor of token ids) and
    optionally ``labels`` (default: a copy of ``input_ids``) and the other ``fields``,
    which are padded with 0. Returns ``input_ids``, ``attention_mask``, ``labels``,
    the other fields, and the metadata ``real_tokens``, ``padded_tokens``,
    ``samples`` and ``bucket`` (bucket id of the longest sample in ``edges``; ``-1``
    without edges). Pass the planner's ``pad_multiple`` and ``edges`` so the counts
    match its plan.
    ``max_length`` truncates samples first, as the planner's ``max_len`` does.

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
        pad_multiple: int = 8,
        label_pad_id: int = -100,
        fields: Sequence[str] = ("input_ids", "labels"),
        padding_side: Literal["right", "left"] = "right",
        edges: Sequence[int] | None = None,
        max_length: int | None = None,
        metadata: bool = True,
    ) -> None:
        if not isinstance(pad_token_id, (int, np.integer)) or isinstance(pad_token_id, bool):
            raise TypeError(f"pad_token_id must be an integer token id, got {pad_token_id!r}")
        _check_positive("pad_multiple", pad_multiple, allow_none=False)
        _check_positive("max_length", max_length)
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        self.pad_token_id = int(pad_token_id)
        self.pad_multiple = int(pad_multiple)
        self.label_pad_id = int(label_pad_id)
        self.fields = _check_fields(fields)
        self.padding_side = padding_side
        self.edges = _check_edges(edges)
        self.max_length = max_length
        self.metadata = metadata

    def _fill(self, field: str) -> int:
        if field == "input_ids":
            return self.pad_token_id
        return self.label_pad_id if field == "labels" else 0

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        samples = _check_batch(samples, "PadCollator")
        rows = [_sample_fields(s, i, self.fields, self.max_length) for i, s in enumerate(samples)]
        lengths = [r["input_ids"].size for r in rows]
        longest = max(lengths)
        padded_len = -(-longest // self.pad_multiple) * self.pad_multiple
        n = len(rows)
        batch: dict[str, Any] = {}
        for field in self.fields:
            dtype = _result_dtype([r[field] for r in rows], field)
            batch[field] = torch.full((n, padded_len), self._fill(field), dtype=dtype)
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
        raise ValueError("position_ids must be (batch, tokens), "
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
    ) -> None:
        _check_positive("row_capacity", row_capacity)
        _check_positive("max_length", max_length)
        if pad_to_capacity and (row_capacity is None or pad_token_id is None):
            raise ValueError("pad_to_capacity needs row_capacity and pad_token_id")
        if mask_dtype is not None and not (mask_dtype == torch.bool
                                           or mask_dtype.is_floating_point):
            raise TypeError(f"mask_dtype must be torch.bool or a floating dtype, got {mask_dtype}")
        self.label_pad_id = int(label_pad_id)
        self.fields = _check_fields(fields)
        self.row_capacity = None if row_capacity is None else int(row_capacity)
        self.pad_to_capacity = pad_to_capacity
        self.pad_token_id = pad_token_id
        self.return_flash_attn_kwargs = return_flash_attn_kwargs
        self.return_seq_idx = return_seq_idx
        self.position_ids_start = int(position_ids_start)
        self.max_length = max_length
        self.mask_dtype = mask_dtype
        self.metadata = metadata

    def _rows(self, samples: list[Any]) -> list[list[dict[str, np.ndarray]]]:
        """Samples grouped into rows, each sample's fields as arrays."""
        explicit = isinstance(samples[0], (list, tuple))
        if explicit and not all(isinstance(r, (list, tuple)) for r in samples):
            raise TypeError("PackCollator got a mix of rows (lists) and samples; "
                            "give one or the other")
        if explicit:
            rows, index = [], 0
            for r, row in enumerate(samples):
                if not row:
                    raise ValueError(f"PackCollator: row {r} is empty")
                rows.append([_sample_fields(s, index + j, self.fields, self.max_length)
                             for j, s in enumerate(row)])
                index += len(row)
        else:
            flat = [_sample_fields(s, i, self.fields, self.max_length)
                    for i, s in enumerate(samples)]
            rows = [flat] if self.row_capacity is None else self._next_fit(flat)
        cap = self.row_capacity
        if cap is not None:
            for r, row in enumerate(rows):
                used = sum(s["input_ids"].size for s in row)
                if used > cap:
                    raise ValueError(f"PackCollator: row {r} holds {used} tokens, more than "
                                     f"row_capacity={cap}")
        return rows

    def _next_fit(self, flat: list[dict[str, np.ndarray]]) -> list[list[dict[str, np.ndarray]]]:
        cap = self.row_capacity
        rows: list[list[dict[str, np.ndarray]]] = [[]]
        used = 0
        for i, s in enumerate(flat):
            n = s["input_ids"].size
            if n > cap:
                raise ValueError(f"sample {i} has {n} tokens, more than row_capacity={cap}; "
                                 "split or truncate it first (max_length)")
            if used + n > cap:
                rows.append([])
                used = 0
            rows[-1].append(s)
            used += n
        return rows

    def _filler(self, n: int, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for field, arr in like.items():
            value = self.pad_token_id if field == "input_ids" else (
                self.label_pad_id if field == "labels" else 0)
            out[field] = np.full(n, value, dtype=arr.dtype)
        return out

    def __call__(self, samples: Sequence[Any]) -> dict[str, Any]:
        samples = _check_batch(samples, "PackCollator")
        rows = self._rows(samples)
        real = sum(s["input_ids"].size for row in rows for s in row)
        segments: list[dict[str, np.ndarray]] = []
        for row in rows:
            segments.extend(row)
            if self.pad_to_capacity:
                free = self.row_capacity - sum(s["input_ids"].size for s in row)
                if free > 0:
                    segments.append(self._filler(free, row[0]))
        seg_lens = np.array([s["input_ids"].size for s in segments], dtype=np.int64)
        cu = np.concatenate(([0], np.cumsum(seg_lens)))
        total = int(cu[-1])

        batch: dict[str, Any] = {}
        for field in self.fields:
            arrays = [s[field] for s in segments]
            dtype = _result_dtype(arrays, field)
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
            batch["real_tokens"] = int(real)
            batch["padded_tokens"] = (len(rows) * self.row_capacity if self.row_capacity
                                      else total)
            batch["samples"] = sum(len(row) for row in rows)
            batch["bucket"] = -1
        return batch
