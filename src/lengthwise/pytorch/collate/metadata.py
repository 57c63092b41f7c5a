"""The logging metadata the collators add to a batch, and how to strip or read it.

Example::

    >>> batch = {"input_ids": 1, "real_tokens": 5, "padded_tokens": 8, "samples": 2, "bucket": 0}
    >>> model_inputs(batch), batch_metadata(batch)["bucket"]
    ({'input_ids': 1}, 0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["METADATA_KEYS", "batch_metadata", "model_inputs"]

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
