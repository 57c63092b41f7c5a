"""The JSON record of one optimizer step, read from its summed vector.

Example::

    >>> import numpy as np
    >>> from lengthwise.train.step_logger._vector import local_vector
    >>> vec = local_vector([(2.0, 30, 32, 2, None, None, None)], None,
    ...                    ids=np.zeros(0, dtype=np.int64))
    >>> rec = step_record(vec, step=1, epoch=None, lr=None, grad_norm=None, seconds=1.0,
    ...                   buckets=[], bucket_loss={}, corrected=None, skipped=False,
    ...                   skipped_total=0)
    >>> rec["loss"], rec["padding_efficiency"], rec["tokens_per_second"]
    (2.0, 0.9375, 30.0)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lengthwise.finite_json import NON_FINITE
from lengthwise.train.step_logger._values import to_count, to_float
from lengthwise.train.step_logger._vector import (
    LOSS_SUM,
    LOSS_WEIGHT,
    MICRO,
    PAD,
    PAD_N,
    REAL,
    REAL_N,
    SAMP,
    SAMP_N,
    count,
    sample_spread,
)

#: Keys of a step record; extra fields passed to ``step`` must not reuse them.
RESERVED_FIELDS = frozenset(
    {
        "step", "epoch", "loss", "lr", "grad_norm", "real_tokens", "padded_tokens",
        "padding_efficiency", "tokens_per_second", "seconds", "samples", "micro_batches",
        "buckets", "bucket_loss", "corrected_loss", "skipped", "skipped_total", "time", "event",
        "loss_sample_std", "loss_sample_neff", NON_FINITE,
    }
)


def step_record(vec: np.ndarray, *, step: int, epoch: Any, lr: Any, grad_norm: Any,
                seconds: float, buckets: list[int], bucket_loss: dict[int, float],
                corrected: float | None, skipped: bool, skipped_total: int) -> dict[str, Any]:
    """The record of a step whose summed vector is ``vec`` (fields in the documented order)."""
    real = count(vec, REAL, REAL_N)
    padded = count(vec, PAD, PAD_N)
    rec = {
        "step": step,
        "epoch": None if epoch is None else to_count(epoch, "epoch"),
        "loss": float(vec[LOSS_SUM] / vec[LOSS_WEIGHT]) if vec[LOSS_WEIGHT] > 0 else None,
        "lr": to_float(lr, "lr"),
        "grad_norm": to_float(grad_norm, "grad_norm"),
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_efficiency": real / padded if real is not None and padded else None,
        "tokens_per_second": real / seconds if real is not None and seconds > 0 else None,
        "seconds": seconds,
        "samples": count(vec, SAMP, SAMP_N),
        "micro_batches": int(round(vec[MICRO])),
        "buckets": buckets,
        "bucket_loss": {str(b): v for b, v in bucket_loss.items()},
        "corrected_loss": corrected,
        "skipped": skipped,
        "skipped_total": skipped_total,
        "time": time.time(),
    }
    std, neff = sample_spread(vec)
    if neff is not None:
        rec["loss_sample_std"] = std
        rec["loss_sample_neff"] = neff
    return rec
