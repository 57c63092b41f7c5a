"""What a run's per-micro-batch loss log looks like: the doctor's findings and the stable region.

:func:`loss_log_figures` reads a log (``micro_log.jsonl``: one line per micro-batch) with
the doctor (:mod:`lengthwise.doctor.analyses`): the findings of its ``bands`` and ``levels``
(one loss level per length bucket: the ladder) analyses, and, over the stable region it
chooses (after the warm-up, cliffs left out), :func:`stable_figures`.

Example::

    >>> import numpy as np
    >>> loss = np.array([2.0, 2.0, 1.5, 1.5, 2.0, 1.5])
    >>> f = stable_figures(loss, loss - loss.mean(), [0, 0, 1, 1, 0, 1])
    >>> f["bands_at_0_1"], f["longest_same_bucket_run"], f["low_to_low_gaps"]["max"]
    (2, 2, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BAND_GAP", "LOW_SHARE", "loss_log_figures", "stable_figures"]

#: two loss levels are separate bands when no line of the detrended loss lies between them
#: over this many nats
BAND_GAP = 0.1
#: a "low" line: among this share of the lowest detrended losses of the stable region
LOW_SHARE = 0.2
#: the doctor's analyses read: bands, and one level per length bucket (the ladder)
ANALYSES = ("bands", "levels")


def _bands(detrended: np.ndarray, gap: float) -> int:
    """Groups of the sorted values split where two neighbours lie more than ``gap`` apart."""
    x = np.sort(detrended[np.isfinite(detrended)])
    return int((np.diff(x) > gap).sum() + 1) if x.size else 0


def _longest_run(buckets: Sequence[Any]) -> int:
    best = run = 0
    last: Any = object()
    for b in buckets:
        run = run + 1 if b == last and b is not None else 1
        best, last = max(best, run), b
    return best


def stable_figures(loss: np.ndarray, detrended: np.ndarray, buckets: Sequence[Any] | None,
                   ) -> dict[str, Any]:
    """Figures of the stable region's lines, in log order: mean and standard deviation of
    the loss, the bands of its detrended values :data:`BAND_GAP` apart, the longest run of
    consecutive lines from one bucket, and the gaps (in lines) between consecutive lows
    (the lowest :data:`LOW_SHARE` of the detrended loss)."""
    loss = np.asarray(loss, dtype=np.float64)
    detrended = np.asarray(detrended, dtype=np.float64)
    lows = np.flatnonzero(detrended <= np.quantile(detrended, LOW_SHARE)) if detrended.size \
        else np.zeros(0, dtype=np.int64)
    gaps = np.diff(lows)
    return {"lines": int(loss.size), "mean": float(loss.mean()) if loss.size else None,
            "std": float(loss.std(ddof=1)) if loss.size > 1 else None,
            "bands_at_0_1": _bands(detrended, BAND_GAP),
            "longest_same_bucket_run": _longest_run(buckets) if buckets is not None else None,
            "low_to_low_gaps": {"mean": float(gaps.mean()) if gaps.size else None,
                                "median": float(np.median(gaps)) if gaps.size else None,
                                "max": int(gaps.max()) if gaps.size else None}}


def loss_log_figures(path: str | Path, *, order: str) -> dict[str, Any]:
    """The doctor's findings (:data:`ANALYSES`) and :func:`stable_figures` of the log at
    ``path`` of a run in ``order``; a log the doctor cannot read is ``{"error": ...}``."""
    from lengthwise.doctor.analyses import ANALYSES as REGISTRY
    from lengthwise.doctor.diagnosis import DiagnoseOptions, Diagnosis, load
    from lengthwise.errors import LengthwiseError

    try:
        d = Diagnosis(load(str(path)), DiagnoseOptions(order=order, timing=False, seed=0),
                      str(path))
        found = [(name, f) for name in ANALYSES for f in REGISTRY[name](d)]
        use = d.use
        buckets = d.buckets
        kept = None if buckets is None else [b for b, u in zip(buckets, use, strict=True) if u]
        stable = stable_figures(d.loss[use], d.detrended, kept)
        region = {"start": float(d.phases.start), "end": float(d.phases.end),
                  "cliff_lines": int((d.region & d.cliff_mask).sum())}
    except LengthwiseError as exc:
        return {"error": str(exc)}
    return {"findings": [{"analysis": name, "name": f.name, "kind": f.kind, "claim": f.claim,
                          "figures": f.figures} for name, f in found],
            "stable": stable, "region": region}
