"""Do the cliffs line up with checkpoint saves? An exact permutation test.

A cliff is *aligned* when it starts within ``[c - before, c + after]`` of some
checkpoint step ``c`` (``before`` = one logging interval, ``after`` = three, at
least 3 steps: the disturbance of a save shows in the steps right after it).
Under the null hypothesis the ``m`` cliffs sit at ``m`` random distinct points
of the analysed region; the number that land near a checkpoint is then
hypergeometric, so the permutation p-value ``P(X >= aligned)`` is exact, with
no Monte-Carlo error. ``associated`` is true when ``p < alpha``, false
otherwise, and null when there are no cliffs or no checkpoints to test.

Example::

    >>> import numpy as np
    >>> steps = np.arange(1, 1001.0)
    >>> a = associate(steps, [101.0, 301.0, 501.0], np.arange(100.0, 1001, 100), interval=1)
    >>> a.associated, a.aligned, a.p_value < 1e-3
    (True, 3, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lengthwise.doctor.numbers import significant

#: significance level for ``associated``
ALPHA = 0.05


@dataclass(frozen=True)
class CheckpointAssociation:
    """Result of testing whether cliffs start at checkpoint steps."""

    associated: bool | None
    p_value: float | None
    checkpoints: int
    cliffs: int
    aligned: int
    expected_aligned: float | None
    window: tuple[float, float]
    source: str | None
    save_seconds_mean: float | None = None
    throughput_ratio: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``checkpoint_association`` key of the report)."""
        return {
            "associated": self.associated,
            "p_value": significant(self.p_value),
            "checkpoints": self.checkpoints,
            "cliffs": self.cliffs,
            "aligned": self.aligned,
            "expected_aligned": (
                None if self.expected_aligned is None else round(self.expected_aligned, 3)
            ),
            "window_steps": [self.window[0], self.window[1]],
            "source": self.source,
            "test": "exact permutation test of cliff placements (hypergeometric tail)",
            "save_seconds_mean": self.save_seconds_mean,
            "throughput_ratio_after_save": self.throughput_ratio,
            "note": self.note,
        }


def hypergeom_sf(k: int, total: int, good: int, draws: int) -> float:
    """``P(X >= k)`` for ``X`` ~ hypergeometric(total, good, draws).

    >>> round(hypergeom_sf(1, 10, 1, 1), 3)
    0.1
    """
    if k <= max(0, draws - (total - good)):
        return 1.0
    lo, hi = max(k, 0, draws - (total - good)), min(good, draws)
    if lo > hi:
        return 0.0 if k > hi else 1.0
    denom = _lcomb(total, draws)
    terms = [_lcomb(good, i) + _lcomb(total - good, draws - i) - denom for i in range(lo, hi + 1)]
    top = max(terms)
    return float(min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms)))


def _lcomb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def checkpoint_window(interval: float) -> tuple[float, float]:
    """``(before, after)``: a cliff within this many steps of a save is aligned with it.

    >>> checkpoint_window(1.0), checkpoint_window(10.0)
    ((1.0, 3.0), (10.0, 30.0))
    """
    return float(interval), float(max(3.0, 3.0 * interval))


def near_checkpoint(
    steps: np.ndarray, checkpoints: np.ndarray, before: float, after: float
) -> np.ndarray:
    """Mask of ``steps`` lying within ``[c - before, c + after]`` of some checkpoint ``c``."""
    if checkpoints.size == 0:
        return np.zeros(steps.size, dtype=bool)
    ck = np.sort(checkpoints)
    i = np.searchsorted(ck, steps - after, side="left")
    i = np.minimum(i, ck.size - 1)
    return (ck[i] >= steps - after) & (ck[i] <= steps + before)


def associate(
    region_steps: np.ndarray,
    cliff_steps: Sequence[float],
    checkpoints: np.ndarray,
    *,
    interval: float,
    source: str | None = "events",
    alpha: float = ALPHA,
    save_seconds_mean: float | None = None,
    throughput_ratio: float | None = None,
    every: float | None = None,
) -> CheckpointAssociation:
    """Test cliff starts against checkpoint steps over the analysed ``region_steps``.

    ``every`` (a ``--checkpoint-every`` interval) only shapes the note when no save
    falls inside the log.
    """
    before, after = checkpoint_window(interval)
    ck = np.asarray(checkpoints, dtype=np.float64)
    lo, hi = (float(region_steps[0]), float(region_steps[-1])) if region_steps.size else (0, 0)
    ck_in = ck[(ck >= lo - after) & (ck <= hi + before)]
    cliffs = np.asarray(cliff_steps, dtype=np.float64)
    base = {
        "checkpoints": int(ck_in.size),
        "cliffs": int(cliffs.size),
        "window": (-before, after),
        "source": source if ck.size or every else None,
        "save_seconds_mean": save_seconds_mean,
        "throughput_ratio": throughput_ratio,
    }
    if ck.size == 0:
        if every is not None:
            span = hi - lo
            note = (f"--checkpoint-every {every:g} exceeds the {span:g} steps of the log: "
                    "no save falls inside it, so spikes cannot be tested against saves")
        else:
            note = "no checkpoint steps known (log checkpoint events or pass --checkpoint-every N)"
        return CheckpointAssociation(None, None, aligned=0, expected_aligned=None, note=note,
                                     **base)
    if cliffs.size == 0:
        return CheckpointAssociation(None, None, aligned=0, expected_aligned=None,
                                     note="no cliffs to test", **base)
    near = near_checkpoint(region_steps, ck_in, before, after)
    total, good, draws = int(region_steps.size), int(near.sum()), int(cliffs.size)
    aligned = int(near_checkpoint(cliffs, ck_in, before, after).sum())
    if good == 0:
        return CheckpointAssociation(None, None, aligned=aligned, expected_aligned=0.0,
                                     note="no checkpoint inside the analysed steps", **base)
    p = hypergeom_sf(aligned, total, good, min(draws, total))
    return CheckpointAssociation(
        associated=bool(p < alpha),
        p_value=p,
        aligned=aligned,
        expected_aligned=draws * good / total,
        **base,
    )


def throughput_ratio(
    steps: np.ndarray, tokens_per_second: np.ndarray, checkpoints: np.ndarray, interval: float
) -> float | None:
    """Median throughput in the steps right after saves / median elsewhere (None: unknown)."""
    ok = np.isfinite(tokens_per_second)
    if ok.sum() < 20 or checkpoints.size == 0:
        return None
    near = near_checkpoint(steps, checkpoints, 0.0, max(1.0, interval)) & ok
    far = ~near & ok
    if near.sum() == 0 or far.sum() == 0:
        return None
    rest = float(np.median(tokens_per_second[far]))
    return float(np.median(tokens_per_second[near]) / rest) if rest > 0 else None
