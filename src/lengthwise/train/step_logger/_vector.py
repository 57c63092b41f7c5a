"""One optimizer step's sums in one float vector, the vector that is all-reduced over ranks.

Layout: nine fixed entries (sums and how many micro-batches gave them), then
four per bucket: ``loss * weight``, ``weight``, micro-batches, observed weight
(real tokens, or 1 per micro-batch without them). Summing the vectors of all
ranks gives the step's totals; under ``torch.distributed`` the per-bucket part
has a fixed size, :func:`vector_capacity`, so that every rank's vector matches
(the sum is :func:`lengthwise.pytorch.dist.all_reduce_sum`).

Example::

    >>> vec = local_vector([(2.0, 30, 32, 2, 1)], None, num_buckets=None, distributed=False)
    >>> count(vec, REAL, REAL_N), bucket_columns(vec)[1].tolist()
    (30, [60.0, 30.0, 1.0, 30.0])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lengthwise.train.step_logger._values import read_losses

#: one recorded micro-batch: (loss, real tokens, padded tokens, samples, bucket)
Micro = tuple[Any, int | None, int | None, int | None, int | None]

# the fixed entries: sums and their counts, micro-batches, the loss sum and its weight
REAL, REAL_N, PAD, PAD_N, SAMP, SAMP_N, MICRO, LOSS_SUM, LOSS_WEIGHT = range(9)
FIXED = 9
# the columns of every bucket's entries
B_LOSS_SUM, B_WEIGHT, B_MICRO, B_OBSERVED = range(4)
PER_BUCKET = 4
#: per-bucket entries under torch.distributed when neither num_buckets nor shares say
DEFAULT_NUM_BUCKETS = 64


def vector_capacity(num_buckets: int | None, buckets: list[int]) -> int:
    """Buckets the vector has room for under ``torch.distributed``; raises if ``buckets`` won't fit.

    Example::

        >>> vector_capacity(None, [3]), vector_capacity(8, [])
        (64, 8)
    """
    if num_buckets is not None:
        return num_buckets
    top = max(buckets, default=-1)
    if top >= DEFAULT_NUM_BUCKETS:
        raise ValueError(
            f"bucket {top} is not below {DEFAULT_NUM_BUCKETS}; pass num_buckets= "
            "(or bucket_shares=) to StepLogger for more buckets under torch.distributed"
        )
    return DEFAULT_NUM_BUCKETS


def local_vector(micro: list[Micro], user_loss: float | None, *, num_buckets: int | None,
                 distributed: bool) -> np.ndarray:
    """This rank's sums over its recorded micro-batches (``user_loss`` overrides their losses).

    Example::

        >>> float(local_vector([], 1.5, num_buckets=None, distributed=False)[LOSS_SUM])
        1.5
    """
    losses = read_losses([m[0] for m in micro])
    buckets = [m[4] for m in micro if m[4] is not None]
    size = (vector_capacity(num_buckets, buckets) if distributed
            else max(buckets, default=-1) + 1)
    vec = np.zeros(FIXED + PER_BUCKET * size, dtype=np.float64)
    for loss, (_, real, padded, samples, bucket) in zip(losses, micro, strict=True):
        weight = 1.0 if real is None else float(real)
        vec[MICRO] += 1
        for value, total, n in ((real, REAL, REAL_N), (padded, PAD, PAD_N),
                                (samples, SAMP, SAMP_N)):
            if value is not None:
                vec[total] += value
                vec[n] += 1
        if loss is not None and user_loss is None:
            vec[LOSS_SUM] += loss * weight
            vec[LOSS_WEIGHT] += weight
        if bucket is not None:
            base = FIXED + PER_BUCKET * bucket
            vec[base + B_MICRO] += 1
            vec[base + B_OBSERVED] += weight
            if loss is not None and math.isfinite(loss):
                vec[base + B_LOSS_SUM] += loss * weight
                vec[base + B_WEIGHT] += weight
    if user_loss is not None:
        weight = vec[REAL] if vec[REAL_N] and vec[REAL] > 0 else 1.0
        vec[LOSS_SUM] = user_loss * weight
        vec[LOSS_WEIGHT] = weight
    return vec


def count(vec: np.ndarray, total: int, n: int) -> int | None:
    """The summed count at ``total``, or ``None`` when no micro-batch gave it (``vec[n] == 0``).

    Example::

        >>> count(np.zeros(FIXED), SAMP, SAMP_N) is None
        True
    """
    return int(round(vec[total])) if vec[n] > 0 else None


def bucket_columns(vec: np.ndarray) -> np.ndarray:
    """The per-bucket entries as a ``(buckets, 4)`` view.

    Example::

        >>> bucket_columns(np.zeros(FIXED + 2 * PER_BUCKET)).shape
        (2, 4)
    """
    return vec[FIXED:].reshape(-1, PER_BUCKET)
