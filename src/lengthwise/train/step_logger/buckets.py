"""Per bucket: its share of the data, its running loss, and the offset of a step's bucket mix.

:func:`bucket_token_shares` reads each bucket's share of an epoch plan, and
:func:`normalise_shares` makes given shares sum to 1: the weights of the
composition-corrected loss.

The composition-corrected loss of a step is its loss minus the offset its bucket
mix is expected to have: ``sum_b w_b (m_b - M)``, with ``w_b`` the step's token
share in bucket ``b``, ``m_b`` the bucket's running loss over the *previous*
steps (the step itself left out) and ``M`` the data-share-weighted mean of the
``m_b``. It removes what the buckets are known to add and keeps each step's own
noise: with buckets that do not differ the corrected loss is as rough as the
raw one, with buckets that do it falls to the sampling noise. (It is not a
running mean: a smoothed curve would look calm whatever the batching.)

Example::

    >>> normalise_shares([1, 3])
    {0: 0.25, 1: 0.75}
    >>> losses = BucketLosses(window=50)
    >>> losses.add(np.array([[2.0, 1.0, 1.0, 1.0], [12.0, 3.0, 1.0, 3.0]]), False, 0)
    [0, 1]
    >>> losses.means()
    {0: 2.0, 1: 4.0}
    >>> step = np.array([[2.2, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])  # next step: bucket 0
    >>> round(2.2 - losses.expected_offset(step, None), 6)  # offset 2.0 - 3.5
    3.7
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.train.step_logger.record import (
    B_LOSS_SUM,
    B_MICRO,
    B_OBSERVED,
    B_WEIGHT,
    to_bucket,
    to_float,
)

__all__ = ["bucket_token_shares", "normalise_shares"]


def normalise_shares(shares: Any) -> dict[int, float]:
    """Bucket shares (a dict ``bucket -> share`` or a sequence by bucket) summing to 1."""
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


#: a bucket's running loss keeps at least this many of its steps
MIN_ENTRIES = 3


def window_mean(window: deque[tuple[int, float, float]]) -> float:
    """Weighted mean loss of a window of ``(step index, loss * weight, weight)`` entries."""
    return sum(s for _, s, _ in window) / sum(w for _, _, w in window)


class BucketLosses:
    """Per bucket, the token-weighted mean loss of its last ``window`` optimizer steps.

    A bucket keeps at least its last ``MIN_ENTRIES`` entries, however long ago.
    ``observed`` sums every bucket's weight (real tokens) so far, the shares that
    stand in when the data set's are not given.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.windows: dict[int, deque[tuple[int, float, float]]] = {}
        self.observed: dict[int, float] = {}

    def add(self, columns: np.ndarray, skipped: bool, index: int,
            ids: np.ndarray | None = None) -> list[int]:
        """Add step ``index``'s per-bucket sums (``(rows, 4)``, row ``r`` for bucket
        ``ids[r]``, by default bucket ``r``); return the buckets present.

        A skipped step counts towards ``observed`` but not towards the running losses.
        """
        ids = _ids(columns, ids)
        rows = np.flatnonzero(columns[:, B_MICRO] > 0)
        present = [int(ids[r]) for r in rows]
        for r, b in zip(rows.tolist(), present, strict=True):
            self.observed[b] = self.observed.get(b, 0.0) + float(columns[r, B_OBSERVED])
            if not skipped and columns[r, B_WEIGHT] > 0:
                self.windows.setdefault(b, deque()).append(
                    (index, float(columns[r, B_LOSS_SUM]), float(columns[r, B_WEIGHT]))
                )
        oldest = index - self.window  # entries at or before this index expire
        for entries in self.windows.values():
            while len(entries) > MIN_ENTRIES and entries[0][0] <= oldest:
                entries.popleft()
        return present

    def state_dict(self) -> dict[str, Any]:
        """The windows and observed weights as plain JSON data (lists, ints and floats)."""
        return {"windows": [[b, [list(e) for e in w]] for b, w in self.windows.items()],
                "observed": [[b, v] for b, v in self.observed.items()]}

    def load_state_dict(self, state: Any) -> None:
        """Restore what :meth:`state_dict` returned; :class:`ConfigError` for anything else."""
        if not isinstance(state, dict) or set(state) != {"windows", "observed"}:
            raise ConfigError("bucket losses: expected the keys 'windows' and 'observed'")
        windows = {state_count(b): _entries(w) for b, w in _pairs(state["windows"], "windows")}
        observed = {state_count(b): _real(v) for b, v in _pairs(state["observed"], "observed")}
        self.windows, self.observed = windows, observed

    def means(self) -> dict[int, float]:
        """The running loss of every bucket seen so far, by bucket id."""
        return {b: window_mean(w) for b, w in sorted(self.windows.items())}

    def expected_offset(self, columns: np.ndarray, shares: dict[int, float] | None,
                        ids: np.ndarray | None = None) -> float | None:
        """The offset a step with per-bucket sums ``columns`` is expected to have.

        Call it before :meth:`add` adds the step, so that the step is left out of
        the bucket means it is corrected with. ``shares`` weight the reference mean
        (default: the token shares observed so far). ``None`` when the step has no
        bucket; 0 for buckets not seen before.
        """
        weight = columns[:, B_WEIGHT] if columns.size else np.zeros(0)
        total = float(weight.sum())
        if total <= 0:
            return None
        means = self.means()
        shares = shares if shares is not None else self.observed
        ref_w = {b: shares.get(b, 0.0) for b in means}
        ref_total = sum(ref_w.values())
        if not means or ref_total <= 0:
            return 0.0
        ref = sum(ref_w[b] * m for b, m in means.items()) / ref_total
        ids = _ids(columns, ids)
        return sum(float(weight[r]) / total * (means[int(ids[r])] - ref)
                   for r in np.flatnonzero(weight > 0) if int(ids[r]) in means)


def _ids(columns: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """The bucket id of each row of ``columns`` (its index when ``ids`` is not given)."""
    return np.arange(columns.shape[0]) if ids is None else np.asarray(ids)


def _pairs(value: Any, name: str) -> list[list[Any]]:
    """``value`` checked to be a list of ``[bucket, value]`` pairs."""
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2
                                              for p in value):
        raise ConfigError(f"bucket losses: {name} must be a list of [bucket, value] pairs")
    return value


def _entries(value: Any) -> deque[tuple[int, float, float]]:
    """A bucket's window, checked to be ``[index, loss * weight, weight]`` entries."""
    if not isinstance(value, list) or not all(isinstance(e, list) and len(e) == 3
                                              for e in value):
        raise ConfigError("bucket losses: a window must be a list of [index, sum, weight]")
    return deque((state_count(i), _real(s), _real(w)) for i, s, w in value)


def state_count(value: Any, what: str = "bucket losses: an id or index") -> int:
    """``value`` of a saved state, checked to be a non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"bucket losses: {value!r} is not a finite number")
    return float(value)
