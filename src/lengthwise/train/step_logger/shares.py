"""Each bucket's share of the data, the weights of the composition-corrected loss.

Example::

    >>> normalise_shares([1, 3])
    {0: 0.25, 1: 0.75}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.train.step_logger._values import to_bucket, to_float

__all__ = ["bucket_token_shares", "normalise_shares"]


def normalise_shares(shares: Any) -> dict[int, float]:
    """Bucket shares (a dict ``bucket -> share`` or a sequence by bucket) summing to 1.

    Example::

        >>> normalise_shares({2: 1.0, 0: 1.0})
        {2: 0.5, 0: 0.5}
    """
    if isinstance(shares, Mapping):
        items = [(to_bucket(k), to_float(v, f"bucket_shares[{k!r}]")) for k, v in shares.items()]
    else:
        values = np.asarray(shares, dtype=np.float64)
        if values.ndim != 1:
            raise ConfigError(f"bucket_shares must be 1-D or a dict, got shape {values.shape}")
        items = [(i, float(v)) for i, v in enumerate(values)]
    if not items:
        raise ConfigError("bucket_shares is empty")
    for bucket, share in items:
        if share is None or not math.isfinite(share) or share < 0:
            raise ConfigError(f"bucket_shares[{bucket}] must be finite and >= 0, got {share!r}")
    total = sum(share for _, share in items)
    if total <= 0:
        raise ConfigError("bucket_shares must not all be zero")
    return {int(b): s / total for b, s in items}  # type: ignore[arg-type]


def bucket_token_shares(plan: Any, *, by: str = "tokens") -> dict[int, float]:
    """Share of each bucket in an epoch plan, for ``StepLogger(bucket_shares=...)``.

    ``plan`` needs ``bucket``, ``offsets``, ``indices`` and ``lengths`` (as in
    ``lengthwise.EpochPlan``), or is a windowed plan (``sampler.plan`` of a windowed
    sampler), whose windows are summed (planning each once): their bucket ids are
    those of the plan-wide edges. ``by="tokens"`` (for token-averaged losses) weights
    by real tokens, ``by="samples"`` (for per-sample-averaged losses) by samples.

    Example::

        >>> from types import SimpleNamespace
        >>> import numpy as np
        >>> plan = SimpleNamespace(bucket=[0, 1], offsets=np.array([0, 2, 3]),
        ...                        indices=np.array([0, 1, 2]), lengths=np.array([1, 3, 4]))
        >>> bucket_token_shares(plan)
        {0: 0.5, 1: 0.5}
        >>> bucket_token_shares(plan, by="samples")[0]
        0.6666666666666666
    """
    if by not in ("tokens", "samples"):
        raise ConfigError(f"by must be 'tokens' or 'samples', got {by!r}")
    windowed = callable(getattr(plan, "windows", None))
    if not windowed and not hasattr(plan, "offsets"):
        raise TypeError("plan must be an epoch plan or a windowed plan (sampler.plan), got "
                        f"{type(plan).__name__}")
    if windowed:  # a windowed plan: its windows' plans
        parts = [_bucket_totals(win.plan, by) for win in plan.windows()]
        totals = np.zeros(max((p.size for p in parts), default=0))
        for part in parts:
            totals[: part.size] += part
    else:
        totals = _bucket_totals(plan, by)
    if totals.size == 0 or totals.sum() <= 0:
        raise ConfigError("the plan has no tokens to take shares from")
    return {int(b): float(t / totals.sum()) for b, t in enumerate(totals) if t > 0}


def _bucket_totals(plan: Any, by: str) -> np.ndarray:
    """Real tokens (or samples) of each bucket of one plan, indexed by bucket."""
    offsets = np.asarray(plan.offsets, dtype=np.int64)
    # packed rows have no buckets: they all count as bucket 0
    bucket = np.asarray(getattr(plan, "bucket", np.zeros(max(offsets.size - 1, 0))),
                        dtype=np.int64)
    if offsets.shape != (bucket.size + 1,):
        raise ValueError(
            f"plan.offsets must have one more entry than plan.bucket ({bucket.size + 1}), "
            f"got {offsets.size}"
        )
    if by == "tokens":
        lengths = np.asarray(plan.lengths, dtype=np.float64)
        cum = np.concatenate([[0.0], np.cumsum(lengths[np.asarray(plan.indices, dtype=np.int64)])])
        weights = cum[offsets[1:]] - cum[offsets[:-1]]
    else:
        weights = np.diff(offsets).astype(np.float64)
    return np.bincount(bucket, weights=weights) if bucket.size else np.zeros(0)
