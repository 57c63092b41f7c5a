"""Token lengths of a ``ray.data.Dataset``: tokenizing at cluster scale with Ray Data.

:func:`ray_lengths` runs a Hugging Face tokenizer over a text column with
``Dataset.map_batches`` on every CPU of the Ray cluster, keeps the results in the
order of the rows (Ray's ``preserve_order``), and returns them as one ``int64``
array, written to ``.npy`` or Parquet on request. Ray is an optional extra
(``pip install 'ray[data]'``); :func:`lengthwise.compute_lengths` sends a Ray data
set here.

Example (not run: it starts Ray)::

    import ray
    from lengthwise.hf.ray_lengths import ray_lengths
    ds = ray.data.read_parquet("s3://bucket/corpus/")
    lengths = ray_lengths(ds, tokenizer, column="text", out="lengths.npy")
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from lengthwise.atomic import atomic_open, atomic_path
from lengthwise.errors import ConfigError, DataError
from lengthwise.planning.lengths import validate_lengths

__all__ = ["is_ray_dataset", "ray_lengths"]

_OUT = "__lengthwise_length__"


def is_ray_dataset(obj: Any) -> bool:
    """True for a ``ray.data.Dataset`` (without importing Ray when it is not loaded).

    Example::

        >>> is_ray_dataset([1, 2])
        False
    """
    return type(obj).__module__.startswith("ray.data") and hasattr(obj, "map_batches")


def _count(batch: dict, *, tokenizer: Any, column: str, add_special_tokens: bool) -> dict:
    texts = batch[column]
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"column {column!r} has a {type(texts[bad[0]]).__name__} where text "
                        f"was expected (row {bad[0]} of a batch)")
    texts = [str(t) for t in texts]
    if not callable(tokenizer):  # a bare tokenizers.Tokenizer
        ids = [e.ids for e in tokenizer.encode_batch(texts,
                                                     add_special_tokens=add_special_tokens)]
    else:
        ids = tokenizer(texts, add_special_tokens=add_special_tokens,
                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    return {_OUT: np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))}


def ray_lengths(dataset: Any, tokenizer: Any, *, column: str = "text",
                out: str | os.PathLike[str] | None = None, batch_size: int = 1000,
                add_special_tokens: bool = True, concurrency: int | None = None) -> np.ndarray:
    """Token length of every row of a Ray data set, aligned with its rows (``int64``).

    Rows are counted in the order the data set yields them with Ray's
    ``preserve_order`` (a data set materialized without it may hold its blocks in
    the order they were produced).

    ``column`` holds the text; ``out`` (``.npy`` or ``.parquet``) also writes the
    lengths there, one row per data-set row, for :func:`lengthwise.load_lengths`.
    ``concurrency`` caps the parallel tasks (default: Ray's choice, every CPU).
    """
    if column not in dataset.schema().names:
        raise DataError(f"the Ray data set has no column {column!r} "
                        f"(columns: {dataset.schema().names})")
    counted = dataset.select_columns([column]).map_batches(
        _count, batch_size=batch_size, batch_format="numpy", concurrency=concurrency,
        fn_kwargs={"tokenizer": tokenizer, "column": column,
                   "add_special_tokens": add_special_tokens})
    # lengths must line up with the rows: a data set runs with the context it was made with
    # (shared with the data set it came from), so set the order there and put it back after
    options = counted.context.execution_options
    keep, options.preserve_order = options.preserve_order, True
    try:
        parts = [b[_OUT] for b in counted.iter_batches(batch_size=None, batch_format="numpy")]
    finally:
        options.preserve_order = keep
    lengths = validate_lengths(np.concatenate(parts) if parts else np.zeros(0, np.int64),
                               what=f"lengths of column {column!r}")
    if out is not None:
        path = os.fspath(out)
        if path.endswith(".npy"):
            with atomic_open(path) as fh:
                np.save(fh, lengths)
        elif path.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            with atomic_path(path) as tmp:
                pq.write_table(pa.table({"length": lengths}), tmp)
        else:
            raise ConfigError(f"out must end in .npy or .parquet, got {path!r}")
    return lengths
