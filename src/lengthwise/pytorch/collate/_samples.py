"""Incoming samples read into checked per-field NumPy arrays, and the values that pad them.

Example::

    >>> sample_fields({"input_ids": [4, 5, 6]}, 0, ("input_ids", "labels"), 2)["labels"]
    array([4, 5])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from lengthwise.errors import DataError

#: fields that hold token ids (collated as ``torch.long``)
TOKEN_FIELDS = ("input_ids", "labels")


def check_batch(samples: Any, who: str) -> list[Any]:
    """The samples of one call to the collator ``who`` as a non-empty list.

    Example::

        >>> check_batch(({"input_ids": [1]},), "PadCollator")
        [{'input_ids': [1]}]
    """
    if isinstance(samples, Mapping):
        raise TypeError(f"{who} expects a list of samples, got a single mapping; "
                        "wrap it in a list")
    samples = list(samples)
    if not samples:
        raise DataError(f"{who} received an empty batch")
    return samples


def as_array(value: Any, field: str, index: int) -> np.ndarray:
    """One sample's field as a 1-D NumPy array, with token fields checked to be integers.

    Example::

        >>> as_array(torch.tensor([3, 4]), "input_ids", 0)
        array([3, 4])
    """
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
    """The listed fields of one sample, ``labels`` defaulting to ``input_ids``, all one length.

    Example::

        >>> sorted(sample_fields({"input_ids": [1, 2]}, 0, ("input_ids", "labels"), None))
        ['input_ids', 'labels']
    """
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
    """The torch dtype of a collated field: ``long`` for token ids, else NumPy's common type.

    Example::

        >>> result_dtype([np.zeros(2, np.float32), np.zeros(1, np.int8)], "weight")
        torch.float32
    """
    if field in TOKEN_FIELDS:
        return torch.long
    kind = np.result_type(*arrays)
    return torch.from_numpy(np.zeros(0, dtype=kind)).dtype


def pad_value(field: str, pad_token_id: Any, label_pad_id: int) -> Any:
    """What pads ``field``: ``pad_token_id`` for ``input_ids``, ``label_pad_id`` for labels, else 0.

    Example::

        >>> pad_value("input_ids", 0, -100), pad_value("labels", 0, -100), pad_value("w", 0, -100)
        (0, -100, 0)
    """
    if field == "input_ids":
        return pad_token_id
    return label_pad_id if field == "labels" else 0
