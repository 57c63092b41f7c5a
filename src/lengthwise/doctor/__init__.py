"""The loss-curve doctor: say why a training loss curve looks the way it does.

Reads a training log (JSON lines, ``.gz``, CSV, TensorBoard), finds the stable
region, and tests for bands (multimodal per-step loss), periodicity, cliffs
and their alignment with checkpoints; it attributes the noise to batch
composition when a bucket or length field is logged, and ranks likely causes
with a prescription for each, and splits the step-to-step variance into
sampling noise, composition, schedule and the rest (``noise``). NumPy only;
matplotlib is imported for plots.

Example::

    >>> from lengthwise.doctor import diagnose, verdict_for
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> bucket = rng.integers(0, 3, 2000)  # each step's batch from one of 3 length buckets
    >>> records = [{"step": s, "loss": 3.0 - 0.4 * b + 0.05 * e, "bucket": int(b)}
    ...            for s, (b, e) in enumerate(zip(bucket, rng.standard_normal(2000)), 1)]
    >>> report = diagnose(records)
    >>> report.bands.count, report.attribution.bucket_r2 > 0.5
    (3, True)
    >>> report.verdict.summary.startswith("3 loss bands")
    True
    >>> verdict_for(records) == report.verdict
    True
"""

from __future__ import annotations

from lengthwise.doctor.analyses import diagnose, load, verdict_for
from lengthwise.doctor.attribution import Noise
from lengthwise.doctor.errors import (
    EmptyLogError,
    LogError,
    LogNotFoundError,
    PlotUnavailableError,
    UnreadableLogError,
)
from lengthwise.doctor.readers import read_log, read_records
from lengthwise.doctor.report import REPORT_KEYS, Finding, Report, Verdict
from lengthwise.doctor.runlog import RunLog

__all__ = ["diagnose", "verdict_for", "load", "read_log", "read_records", "Report", "Verdict",
           "Finding", "Noise", "REPORT_KEYS", "RunLog", "LogError", "EmptyLogError",
           "UnreadableLogError", "LogNotFoundError", "PlotUnavailableError"]
