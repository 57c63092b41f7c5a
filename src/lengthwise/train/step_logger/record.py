"""A step's numbers: logged values read into plain numbers, summed into one vector, read back.

Logged values (floats, ints, NumPy scalars, torch scalars) are read without
importing torch: tensors are recognised by their ``detach`` and ``item``.

One optimizer step's sums live in one float vector, the vector that is all-reduced
over ranks. Layout: seventeen fixed entries (sums and how many micro-batches gave
them, and the token-weighted sums of the per-sample losses: ``sum w``, ``sum w x``,
``sum w x^2``, ``sum w^2``, and how many micro-batches gave them; the counts of
tokens and samples are split into their low and high 32 bits, so that their sums
stay exact integers in float64 far above 2**53), then four per bucket:
``loss * weight``, ``weight``, micro-batches, observed weight (real tokens, or 1
per micro-batch without them). Summing the vectors of all ranks gives the step's
totals; under ``torch.distributed`` the per-bucket part has a fixed size,
:func:`vector_capacity`, so that every rank's vector matches (the sum is
:func:`lengthwise.pytorch.dist.all_reduce_sum`); in one process it has a row for
each bucket id the step had (:func:`bucket_ids`), however large the ids.
:func:`step_record` reads the JSON record of the step from its summed vector.

Example::

    >>> to_float(np.float32(0.5), "lr"), to_count(3.0, "samples"), to_bucket(np.int64(2))
    (0.5, 3, 2)
    >>> micro = [(2.0, 30, 32, 2, 7, None, None)]
    >>> ids = bucket_ids(micro, num_buckets=None, distributed=False)
    >>> vec = local_vector(micro, None, ids=ids)
    >>> ids.tolist(), count(vec, REAL, REAL_N), bucket_columns(vec)[0].tolist()
    ([7], 30, [60.0, 30.0, 1.0, 30.0])
    >>> rec = step_record(vec, step=1, epoch=None, lr=None, grad_norm=None, seconds=1.0,
    ...                   buckets=[7], bucket_loss={}, offset=None, skipped=False,
    ...                   skipped_total=0)
    >>> rec["loss"], rec["padding_efficiency"], rec["tokens_per_second"]
    (2.0, 0.9375, 30.0)
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.finite_json import NON_FINITE


def is_tensor(x: Any) -> bool:
    """Whether ``x`` looks like a torch tensor."""
    return hasattr(x, "detach") and hasattr(x, "item")


def to_float(x: Any, name: str) -> float | None:
    """A real scalar (number, 1-element array or tensor) as a float; ``None`` stays ``None``."""
    if x is None:
        return None
    if is_tensor(x):
        x = x.detach()
        if x.numel() != 1:
            raise ConfigError(f"{name} must be a scalar, got a tensor of shape {tuple(x.shape)}")
        return float(x.item())
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise ConfigError(f"{name} must be a scalar, got an array of shape {x.shape}")
        return float(x.reshape(()))
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def to_count(x: Any, name: str) -> int | None:
    """A non-negative whole number as an int; ``None`` stays ``None``."""
    exact = _integral(x)
    if exact is not None:  # integers stay exact, also above 2**53
        if exact < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {x!r}")
        return exact
    value = to_float(x, name)
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ConfigError(f"{name} must be a non-negative integer, got {x!r}")
    return int(value)


def _integral(x: Any) -> int | None:
    """``x`` as an exact int if it is an integer scalar (int, NumPy, torch), else ``None``."""
    if is_tensor(x):
        if x.numel() != 1 or x.dtype.is_floating_point or x.dtype.is_complex:
            return None
        x = x.detach().reshape(()).item()
    elif isinstance(x, np.ndarray):
        if x.size != 1 or x.dtype.kind not in "iu":
            return None
        x = x.reshape(()).item()
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        return None
    return int(x)


def to_bucket(x: Any) -> int | None:
    """A bucket id as a non-negative int; ``None`` stays ``None``."""
    if x is None:
        return None
    if (is_tensor(x) and x.numel() == 1) or (isinstance(x, np.ndarray) and x.size == 1):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or int(x) < 0:
        raise ConfigError(f"bucket must be a non-negative integer or None, got {x!r}")
    return int(x)


def is_column(value: Any) -> bool:
    """Whether ``value`` holds one entry per micro-batch (a 1-D sequence, array or tensor)."""
    if isinstance(value, np.ndarray) or is_tensor(value):
        return value.ndim == 1
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def read_losses(raw: list[Any]) -> list[float | None]:
    """Turn recorded losses into floats, reading all tensors with one device transfer."""
    tensors = [x for x in raw if is_tensor(x)]
    if not tensors:
        return list(raw)
    import torch

    try:
        values = iter(torch.stack([t.reshape(()).float() for t in tensors]).cpu().tolist())
    except RuntimeError:  # tensors on different devices
        values = iter([float(t.item()) for t in tensors])
    return [next(values) if is_tensor(x) else x for x in raw]


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
    """Buckets the vector has room for (distributed); raises if ``buckets`` do not fit."""
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
    """
    buckets = [m[4] for m in micro if m[4] is not None]
    if distributed:
        return np.arange(vector_capacity(num_buckets, buckets), dtype=np.int64)
    return np.unique(np.asarray(buckets, dtype=np.int64))


def add_count(vec: np.ndarray, total: int, value: int) -> None:
    """Add a whole ``value`` to the count at ``total`` (its low and high 32 bits apart)."""
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
    """The summed count at ``total``, or ``None`` when no micro-batch gave it (``vec[n] == 0``)."""
    if vec[n] <= 0:
        return None
    return (int(round(vec[_HIGH[total]])) << _LOW_BITS) + int(round(vec[total]))


def bucket_columns(vec: np.ndarray) -> np.ndarray:
    """The per-bucket entries as a ``(buckets, 4)`` view."""
    return vec[FIXED:].reshape(-1, PER_BUCKET)


def sample_values(x: Any) -> np.ndarray:
    """Per-sample values (sequence, array or tensor) as a 1-D float array."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def add_sample_losses(vec: np.ndarray, losses: Any, weights: Any) -> None:
    """Add one micro-batch's per-sample losses (token ``weights`` or equal) to ``vec``.

    Non-finite per-sample losses are left out (the step's ``loss`` shows them).
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


#: Keys of a step record; extra fields passed to ``step`` must not reuse them.
RESERVED_FIELDS = frozenset(
    {
        "step", "epoch", "loss", "lr", "grad_norm", "real_tokens", "padded_tokens",
        "padding_efficiency", "tokens_per_second", "seconds", "samples", "micro_batches",
        "buckets", "bucket_loss", "corrected_loss", "skipped", "skipped_total", "time", "event",
        "loss_sample_std", "loss_sample_neff", NON_FINITE,
    }
)


def step_record(vec: np.ndarray, *, step: int, epoch: int | None, lr: float | None,
                grad_norm: float | None, seconds: float, buckets: list[int],
                bucket_loss: dict[int, float], offset: float | None, skipped: bool,
                skipped_total: int) -> dict[str, Any]:
    """The record of a step whose summed vector is ``vec`` (fields in the documented order).

    ``offset`` is the loss the step's bucket mix is expected to add: the corrected loss
    is the step's loss minus it (``None`` without an offset or a finite loss)."""
    real = count(vec, REAL, REAL_N)
    padded = count(vec, PAD, PAD_N)
    loss = float(vec[LOSS_SUM] / vec[LOSS_WEIGHT]) if vec[LOSS_WEIGHT] > 0 else None
    rec = {
        "step": step,
        "epoch": epoch,
        "loss": loss,
        "lr": lr,
        "grad_norm": grad_norm,
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_efficiency": real / padded if real is not None and padded else None,
        "tokens_per_second": real / seconds if real is not None and seconds > 0 else None,
        "seconds": seconds,
        "samples": count(vec, SAMP, SAMP_N),
        "micro_batches": int(round(vec[MICRO])),
        "buckets": buckets,
        "bucket_loss": {str(b): v for b, v in bucket_loss.items()},
        "corrected_loss": (loss - offset if offset is not None and loss is not None
                           and math.isfinite(loss) else None),
        "skipped": skipped,
        "skipped_total": skipped_total,
        "time": time.time(),
    }
    std, neff = sample_spread(vec)
    if neff is not None:
        rec["loss_sample_std"] = std
        rec["loss_sample_neff"] = neff
    return rec
