"""What both collators share: their options checked, samples read into arrays, and the
logging metadata they add to a batch.

Example::

    >>> sample_fields({"input_ids": [4, 5, 6]}, 0, ("input_ids", "labels"), 2)["labels"]
    array([4, 5])
    >>> batch = {"input_ids": 1, "real_tokens": 5, "padded_tokens": 8, "samples": 2, "bucket": 0}
    >>> model_inputs(batch), batch_metadata(batch)["bucket"]
    ({'input_ids': 1}, 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lengthwise.errors import ConfigError, DataError
from lengthwise.pytorch.collate.budget import Budget

__all__ = ["METADATA_KEYS", "batch_metadata", "model_inputs"]

_LAYOUT_WORDS = {"pad": ("padded", "packed"), "pack": ("packed", "padded")}


def int_option(name: str, value: int | None, *, minimum: int | None = 1,
               allow_none: bool = True) -> int | None:
    """``value`` as an int (not a bool) of at least ``minimum``, or ``None`` if allowed.

    Token ids (``pad_token_id``) are >= 0: an embedding has no row -1. Label fill
    values (``label_pad_id``, usually -100) pass ``minimum=None``.
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_fields(fields: Sequence[str]) -> tuple[str, ...]:
    """The fields to collate: must hold ``input_ids``; ``attention_mask`` is dropped."""
    if isinstance(fields, str):
        fields = (fields,)
    fields = tuple(fields)
    if "input_ids" not in fields:
        raise ConfigError(f"fields must include 'input_ids', got {fields}")
    if len(set(fields)) != len(fields):
        raise ConfigError(f"fields has duplicates: {fields}")
    # the attention mask is always built from the lengths
    return tuple(f for f in fields if f != "attention_mask")


def check_edges(edges: Sequence[int] | None) -> list[int] | None:
    """Bucket edges as a list of positive, strictly increasing ints (``None`` stays ``None``)."""
    if edges is None:
        return None
    out = [int(e) for e in edges]
    if not out or any(e != orig for e, orig in zip(out, edges, strict=True)):
        raise ConfigError(f"edges must be a non-empty list of integer upper edges, got {edges!r}")
    if any(b <= a for a, b in zip(out, out[1:], strict=False)) or out[0] < 1:
        raise ConfigError(f"edges must be positive and strictly increasing, got {out}")
    return out


def check_budget(budget: Budget | None, layout: str, collator: str) -> Budget | None:
    """``budget`` (or ``None``), checked to be a :class:`Budget` of ``layout``."""
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be a lengthwise.pytorch.collate.Budget, got {budget!r}")
    if budget is not None and budget.layout != layout:
        want, got = _LAYOUT_WORDS[layout]
        raise ConfigError(f"{collator} needs a budget of the {want} layout, got a {got} one")
    return budget


#: fields that hold token ids (collated as ``torch.long``)
TOKEN_FIELDS = ("input_ids", "labels")


def check_batch(samples: Any, who: str) -> list[Any]:
    """The samples of one call to the collator ``who`` as a non-empty list."""
    if isinstance(samples, Mapping):
        raise TypeError(f"{who} expects a list of samples, got a single mapping; "
                        "wrap it in a list")
    samples = list(samples)
    if not samples:
        raise DataError(f"{who} received an empty batch")
    return samples


def as_array(value: Any, field: str, index: int) -> np.ndarray:
    """One sample's field as a 1-D NumPy array, with token fields checked to be integers."""
    if isinstance(value, torch.Tensor):
        arr = value.detach().cpu().numpy()
    else:
        arr = np.asarray(value)
    where = f"sample {index}, field {field!r}"
    if arr.ndim != 1:
        raise DataError(f"{where}: expected a 1-D sequence of tokens, got shape {arr.shape}")
    if arr.size == 0:
        raise DataError(f"{where}: the sample has no tokens")
    if field in TOKEN_FIELDS:
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{where}: token ids must be integers, got dtype {arr.dtype}")
        if field == "input_ids" and arr.min() < 0:
            raise DataError(f"{where}: negative token id {int(arr.min())}")
    elif arr.dtype.kind not in "iufb":
        raise TypeError(f"{where}: expected numbers, got dtype {arr.dtype}")
    return arr


def sample_fields(sample: Any, index: int, fields: tuple[str, ...],
                  max_length: int | None) -> dict[str, np.ndarray]:
    """The listed fields of one sample, ``labels`` defaulting to ``input_ids``, all one length."""
    if not isinstance(sample, Mapping):
        raise TypeError(f"sample {index}: expected a mapping of fields (a dict), "
                        f"got {type(sample).__name__}")
    if "input_ids" not in sample:
        raise KeyError(f"sample {index} has no 'input_ids' (it has {sorted(sample)})")
    out = {"input_ids": as_array(sample["input_ids"], "input_ids", index)}
    n = out["input_ids"].size
    for field in fields:
        if field == "input_ids":
            continue
        if field not in sample:
            if field == "labels":
                out[field] = out["input_ids"]
                continue
            raise KeyError(f"sample {index} has no field {field!r} (it has {sorted(sample)})")
        arr = as_array(sample[field], field, index)
        if arr.size != n:
            raise DataError(f"sample {index}: field {field!r} has {arr.size} values but "
                            f"'input_ids' has {n}")
        out[field] = arr
    if max_length is not None and n > max_length:
        out = {k: v[:max_length] for k, v in out.items()}
    return out


def result_dtype(arrays: list[np.ndarray], field: str) -> torch.dtype:
    """The torch dtype of a collated field: ``long`` for token ids, else NumPy's common type."""
    if field in TOKEN_FIELDS:
        return torch.long
    kind = np.result_type(*arrays)
    return torch.from_numpy(np.zeros(0, dtype=kind)).dtype


def pad_value(field: str, pad_token_id: Any, label_pad_id: int) -> Any:
    """What pads ``field``: ``pad_token_id`` (input_ids), ``label_pad_id`` (labels), or 0."""
    if field == "input_ids":
        return pad_token_id
    return label_pad_id if field == "labels" else 0


#: keys of the logging metadata that the collators add to a batch
METADATA_KEYS: tuple[str, ...] = ("real_tokens", "padded_tokens", "samples", "bucket")


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
