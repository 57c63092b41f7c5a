"""What one order's run measured, read back from its ``train_log.jsonl``.

Throughput is timed over whole epochs when the run has more than one (sorted
batches change length over an epoch), leaving out the first
``timing_warmup`` steps.

Example::

    >>> recs = [{"step": s, "epoch": 0, "loss": 2.0, "lr": 0.1, "real_tokens": 100,
    ...          "padded_tokens": 125, "seconds": 0.5, "samples": 4} for s in (1, 2, 3)]
    >>> r = summarise("random", recs, "log.jsonl", eval_loss=1.5, train_samples=12,
    ...               timing_warmup=1)
    >>> r.tokens_per_second, r.padding_efficiency, r.epochs
    (200.0, 0.8, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.planning.jsonl import jsonl_records

__all__ = ["OrderResult", "read_log", "summarise"]


@dataclass
class OrderResult:
    """What one order's run measured (rank 0's view; counts are summed over ranks)."""

    order: str
    steps: int
    log_path: str
    eval_loss: float
    tokens_per_second: float
    padding_efficiency: float
    real_tokens: int
    padded_tokens: int
    train_seconds: float
    epochs: float
    final_loss: float
    tokens_per_step: float
    loss: list[float] = field(default_factory=list, repr=False)
    corrected_loss: list[float | None] = field(default_factory=list, repr=False)
    lr: list[float] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, curves: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not curves:
            for key in ("loss", "corrected_loss", "lr"):
                out.pop(key)
        return out


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Step records of a ``train_log.jsonl``, one per step (a later line of a step wins)."""
    rows: dict[int, dict[str, Any]] = {}
    for _, rec in jsonl_records(path):
        if "event" not in rec and isinstance(rec.get("step"), int):
            rows[rec["step"]] = rec
    return [rows[k] for k in sorted(rows)]


def summarise(order: str, records: list[dict[str, Any]], log_path: str | Path,
              eval_loss: float, *, train_samples: int, timing_warmup: int = 3,
              resumed_from: str | None = None) -> OrderResult:
    """An :class:`OrderResult` from a run's step records."""
    last_epoch = max((r.get("epoch") or 0 for r in records), default=0)
    window = [r for r in records if (r.get("epoch") or 0) < last_epoch] or records
    timed = [r for r in window if r["step"] > timing_warmup] or window
    real_t = sum(r.get("real_tokens") or 0 for r in timed)
    secs = sum(r.get("seconds") or 0.0 for r in timed)
    real = sum(r.get("real_tokens") or 0 for r in records)
    padded = sum(r.get("padded_tokens") or 0 for r in records)
    samples = sum(r.get("samples") or 0 for r in records)
    # a step without a loss (nothing to learn: the log says null) reads as NaN
    losses = [math.nan if r.get("loss") is None else float(r["loss"]) for r in records]
    tail = losses[-10:] or [math.nan]
    return OrderResult(
        order=order, steps=len(records), log_path=str(log_path), eval_loss=eval_loss,
        tokens_per_second=real_t / secs if secs > 0 else math.nan,
        padding_efficiency=real / padded if padded else math.nan,
        real_tokens=int(real), padded_tokens=int(padded),
        train_seconds=float(sum(r.get("seconds") or 0.0 for r in records)),
        epochs=samples / train_samples if train_samples else math.nan,
        final_loss=float(np.mean(tail)), loss=losses,
        tokens_per_step=real / len(records) if records else math.nan,
        corrected_loss=[r.get("corrected_loss") for r in records],
        lr=[float(r["lr"]) for r in records],
        extra={"timed_steps": [timed[0]["step"], timed[-1]["step"]] if timed else None,
               **({"resumed_from": resumed_from} if resumed_from else {})},
    )
