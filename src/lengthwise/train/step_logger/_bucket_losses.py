"""The running loss of every bucket, and the offset of a step's bucket mix from the average.

The composition-corrected loss of a step is its loss minus the offset its bucket
mix is expected to have: ``sum_b w_b (m_b - M)``, with ``w_b`` the step's token
share in bucket ``b``, ``m_b`` the bucket's running loss over the *previous*
steps (the step itself left out) and ``M`` the data-share-weighted mean of the
``m_b``. It removes what the buckets are known to add and keeps each step's own
noise: with buckets that do not differ the corrected loss is as rough as the
raw one, with buckets that do it falls to the sampling noise. (It is not a
running mean: a smoothed curve would look calm whatever the batching.)

Example::

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
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.train.step_logger._vector import B_LOSS_SUM, B_MICRO, B_OBSERVED, B_WEIGHT

#: a bucket's running loss keeps at least this many of its steps
MIN_ENTRIES = 3


def window_mean(window: deque[tuple[int, float, float]]) -> float:
    """Weighted mean loss of a window of ``(step index, loss * weight, weight)`` entries.

    Example::

        >>> window_mean(deque([(0, 2.0, 1.0), (1, 6.0, 1.0)]))
        4.0
    """
    return sum(s for _, s, _ in window) / sum(w for _, _, w in window)


class BucketLosses:
    """Per bucket, the token-weighted mean loss of its last ``window`` optimizer steps.

    A bucket keeps at least its last ``MIN_ENTRIES`` entries, however long ago.
    ``observed`` sums every bucket's weight (real tokens) so far, the shares that
    stand in when the data set's are not given.

    Example::

        >>> BucketLosses(window=10).means()
        {}
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
        """The windows and observed weights as plain JSON data (lists, ints and floats).

        Example::

            >>> losses = BucketLosses(window=5)
            >>> _ = losses.add(np.array([[2.0, 1.0, 1.0, 1.0]]), False, 0)
            >>> losses.state_dict()
            {'windows': [[0, [[0, 2.0, 1.0]]]], 'observed': [[0, 1.0]]}
        """
        return {"windows": [[b, [list(e) for e in w]] for b, w in self.windows.items()],
                "observed": [[b, v] for b, v in self.observed.items()]}

    def load_state_dict(self, state: Any) -> None:
        """Restore what :meth:`state_dict` returned; :class:`ConfigError` for anything else.

        Example::

            >>> losses = BucketLosses(window=5)
            >>> losses.load_state_dict({"windows": [[0, [[0, 2.0, 1.0]]]], "observed": [[0, 1.0]]})
            >>> losses.means()
            {0: 2.0}
        """
        if not isinstance(state, dict) or set(state) != {"windows", "observed"}:
            raise ConfigError("bucket losses: expected the keys 'windows' and 'observed'")
        windows = {_count(b): _entries(w) for b, w in _pairs(state["windows"], "windows")}
        observed = {_count(b): _real(v) for b, v in _pairs(state["observed"], "observed")}
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
    return deque((_count(i), _real(s), _real(w)) for i, s, w in value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"bucket losses: {value!r} is not a non-negative integer")
    return value


def _real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"bucket losses: {value!r} is not a finite number")
    return float(value)
