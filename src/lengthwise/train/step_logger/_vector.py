"""One optimizer step's sums in one float vector, the vector that is all-reduced over ranks.

Layout: seventeen fixed entries (sums and how many micro-batches gave them, and
the token-weighted sums of the per-sample losses: ``sum w``, ``sum w x``,
``sum w x^2``, ``sum w^2``, and how many micro-batches gave them; the counts of
tokens and samples are split into their low and high 32 bits, so that their sums
stay exact integers in float64 far above 2**53), then four per bucket:
``loss * weight``, ``weight``, micro-batches, observed weight (real tokens, or 1
per micro-batch without them). Summing the vectors of all ranks gives the step's
totals; under ``torch.distributed`` the per-bucket part has a fixed size,
:func:`vector_capacity`, so that every rank's vector matches (the sum is
:func:`lengthwise.pytorch.dist.all_reduce_sum`); in one process it has a row for
each bucket id the step had (:func:`bucket_ids`), however large the ids.

Example::

    >>> micro = [(2.0, 30, 32, 2, 7, None, None)]
    >>> ids = bucket_ids(micro, num_buckets=None, distributed=False)
    >>> vec = local_vector(micro, None, ids=ids)
    >>> ids.tolist(), count(vec, REAL, REAL_N), bucket_columns(vec)[0].tolist()
    ([7], 30, [60.0, 30.0, 1.0, 30.0])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.train.step_logger._values import read_losses

#: one recorded micro-batch: (loss, real tokens, padded tokens, samples, bucket,
#: per-sample losses or None, per-sample token weights or None)
Micro = tuple[Any, int | None, int | None, int | None, int | None, Any, Any]

# the fixed entries: sums and their counts, micro-batches, the loss sum and its weight,
# then the per-sample loss sums (weights, weighted losses, weighted squares, squared weights)
REAL, REAL_N, PAD, PAD_N, SAMP, SAMP_N, MICRO, LOSS_SUM, LOSS_WEIGHT = range(9)
S_W, S_WX, S_WX2, S_WW, S_N = range(9, 14)
# the high 32 bits of the counts at REAL, PAD and SAMP (those hold the low 32 bits)
REAL_HI, PAD_HI, SAMP_HI = range(14, 17)
FIXED = 17
_HIGH = {REAL: REAL_HI, PAD: PAD_HI, SAMP: SAMP_HI}
_LOW_BITS = 32
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
        raise ConfigError(
            f"bucket {top} is not below {DEFAULT_NUM_BUCKETS}; pass num_buckets= "
            "(or bucket_shares=) to StepLogger for more buckets under torch.distributed"
        )
    return DEFAULT_NUM_BUCKETS


def bucket_ids(micro: list[Micro], *, num_buckets: int | None, distributed: bool,
               ) -> np.ndarray:
    """The bucket id of each per-bucket row of a step's vector.

    Under ``torch.distributed`` the rows are ``0 .. capacity - 1`` on every rank (see
    :func:`vector_capacity`); in one process, the ids the step's micro-batches had.

    Example::

        >>> bucket_ids([(1.0, 3, 4, 1, 10**9, None, None)], num_buckets=None,
        ...            distributed=False).tolist()
        [1000000000]
    """
    buckets = [m[4] for m in micro if m[4] is not None]
    if distributed:
        return np.arange(vector_capacity(num_buckets, buckets), dtype=np.int64)
    return np.unique(np.asarray(buckets, dtype=np.int64))


def add_count(vec: np.ndarray, total: int, value: int) -> None:
    """Add a whole ``value`` to the count at ``total`` (its low and high 32 bits apart).

    Example::

        >>> v = np.zeros(FIXED)
        >>> add_count(v, REAL, 2**53 + 1); add_count(v, REAL, 2**53 + 1)
        >>> v[REAL_N] = 2
        >>> count(v, REAL, REAL_N) == 2**54 + 2
        True
    """
    value = int(value)
    vec[total] += value & ((1 << _LOW_BITS) - 1)
    vec[_HIGH[total]] += value >> _LOW_BITS


def local_vector(micro: list[Micro], user_loss: float | None, *, ids: np.ndarray) -> np.ndarray:
    """This rank's sums over its recorded micro-batches (``user_loss`` overrides their losses).

    ``ids`` are the bucket ids of the per-bucket rows (:func:`bucket_ids`).

    Example::

        >>> float(local_vector([], 1.5, ids=np.zeros(0, dtype=np.int64))[LOSS_SUM])
        1.5
    """
    losses = read_losses([m[0] for m in micro])
    row = {int(b): i for i, b in enumerate(ids.tolist())}
    vec = np.zeros(FIXED + PER_BUCKET * len(row), dtype=np.float64)
    for loss, (_, real, padded, samples, bucket, per_sample, weights) in zip(
        losses, micro, strict=True
    ):
        if per_sample is not None:
            add_sample_losses(vec, per_sample, weights)
        weight = 1.0 if real is None else float(real)
        vec[MICRO] += 1
        for value, total, n in ((real, REAL, REAL_N), (padded, PAD, PAD_N),
                                (samples, SAMP, SAMP_N)):
            if value is not None:
                add_count(vec, total, value)
                vec[n] += 1
        if loss is not None and user_loss is None:
            vec[LOSS_SUM] += loss * weight
            vec[LOSS_WEIGHT] += weight
        if bucket is not None:
            base = FIXED + PER_BUCKET * row[int(bucket)]
            vec[base + B_MICRO] += 1
            vec[base + B_OBSERVED] += weight
            if loss is not None and math.isfinite(loss):
                vec[base + B_LOSS_SUM] += loss * weight
                vec[base + B_WEIGHT] += weight
    if user_loss is not None:
        real = count(vec, REAL, REAL_N)
        weight = float(real) if real else 1.0
        vec[LOSS_SUM] = user_loss * weight
        vec[LOSS_WEIGHT] = weight
    return vec


def count(vec: np.ndarray, total: int, n: int) -> int | None:
    """The summed count at ``total``, or ``None`` when no micro-batch gave it (``vec[n] == 0``).

    Example::

        >>> count(np.zeros(FIXED), SAMP, SAMP_N) is None
        True
    """
    if vec[n] <= 0:
        return None
    return (int(round(vec[_HIGH[total]])) << _LOW_BITS) + int(round(vec[total]))


def bucket_columns(vec: np.ndarray) -> np.ndarray:
    """The per-bucket entries as a ``(buckets, 4)`` view.

    Example::

        >>> bucket_columns(np.zeros(FIXED + 2 * PER_BUCKET)).shape
        (2, 4)
    """
    return vec[FIXED:].reshape(-1, PER_BUCKET)


def sample_values(x: Any) -> np.ndarray:
    """Per-sample values (sequence, array or tensor) as a 1-D float array.

    Example::

        >>> sample_values([1, 2.5]).tolist()
        [1.0, 2.5]
    """
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def add_sample_losses(vec: np.ndarray, losses: Any, weights: Any) -> None:
    """Add one micro-batch's per-sample losses (token ``weights`` or equal) to ``vec``.

    Non-finite per-sample losses are left out (the step's ``loss`` shows them).

    Example::

        >>> v = np.zeros(FIXED)
        >>> add_sample_losses(v, [1.0, 3.0], [1, 3])
        >>> v[S_W].item(), v[S_WX].item(), v[S_N].item()
        (4.0, 10.0, 1.0)
    """
    x = sample_values(losses)
    w = np.ones_like(x) if weights is None else sample_values(weights)
    ok = np.isfinite(x) & np.isfinite(w)
    x, w = x[ok], w[ok]
    vec[S_W] += w.sum()
    vec[S_WX] += (w * x).sum()
    vec[S_WX2] += (w * x * x).sum()
    vec[S_WW] += (w * w).sum()
    vec[S_N] += 1


def sample_spread(vec: np.ndarray) -> tuple[float | None, float | None]:
    """Token-weighted std of the per-sample losses and their effective number.

    The std is the unbiased one for reliability weights,
    ``var = (sum w x^2 / W - mean^2) / (1 - sum w^2 / W^2)``, and the effective
    number is ``W^2 / sum w^2`` (the sample count when weights are equal), so that
    ``std / sqrt(effective number)`` is the standard error of the step's loss.
    ``(None, None)`` when no micro-batch gave per-sample losses or fewer than 2 samples.

    Example::

        >>> v = np.zeros(FIXED)
        >>> add_sample_losses(v, [1.0, 3.0], None)
        >>> sample_spread(v)
        (1.4142135623730951, 2.0)
    """
    if vec[S_N] <= 0 or vec[S_W] <= 0:
        return None, None
    total = float(vec[S_W])
    neff = total * total / float(vec[S_WW])
    if neff <= 1.0 + 1e-12:
        return None, neff
    mean = float(vec[S_WX]) / total
    var = max(0.0, float(vec[S_WX2]) / total - mean * mean) / (1.0 - 1.0 / neff)
    return math.sqrt(var), neff
