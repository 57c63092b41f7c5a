"""``diagnose``: read a log and run every analysis, returning a :class:`Report`.

Example::

    >>> from lengthwise.doctor import diagnose, one_line_verdict
    >>> from lengthwise.doctor.simulate import simulate_run
    >>> run = simulate_run("stratified", steps=1500, seed=0)
    >>> one_line_verdict(diagnose(run.records)).startswith("clean")
    True
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lengthwise.doctor.attribution import TO_LOG, Attribution, attribute, composition
from lengthwise.doctor.bands import find_bands
from lengthwise.doctor.checkpoints import associate, near_checkpoint, throughput_ratio
from lengthwise.doctor.cliffs import find_cliffs
from lengthwise.doctor.errors import EmptyLogError
from lengthwise.doctor.periodicity import MIN_POINTS, detrend_window, find_periodicity
from lengthwise.doctor.phases import find_phases
from lengthwise.doctor.readers import read_log, read_records
from lengthwise.doctor.report import Report, Series
from lengthwise.doctor.runlog import RunLog
from lengthwise.doctor.smoothing import rolling_mean
from lengthwise.doctor.stats import nonfinite_losses, roughness_residual, stable_stats
from lengthwise.doctor.verdict import build_verdict

Source = str | os.PathLike[str] | Iterable[Mapping[str, Any]] | RunLog


def load(source: Source, *, step_key: str | None = None, loss_key: str | None = None) -> RunLog:
    """A :class:`RunLog` from a path, a list of row dicts, or a RunLog (returned as is)."""
    if isinstance(source, RunLog):
        return source
    if isinstance(source, str | os.PathLike):
        return read_log(source, step_key=step_key, loss_key=loss_key)
    return read_records(source, step_key=step_key, loss_key=loss_key)


def checkpoint_steps(
    log: RunLog,
    *,
    every: int | None = None,
    steps: Sequence[float] | None = None,
) -> tuple[np.ndarray, str | None]:
    """Checkpoint steps and where they came from (explicit list, ``every``, or log events)."""
    if steps is not None:
        return np.asarray(sorted(steps), dtype=np.float64), "given"
    if every is not None:
        if every <= 0:
            raise ValueError(f"--checkpoint-every must be positive, got {every}")
        first = math.ceil(float(log.step[0]) / every) * every
        return np.arange(first, float(log.step[-1]) + 1, every, dtype=np.float64), (
            f"--checkpoint-every {every}"
        )
    if log.checkpoints.size:
        return log.checkpoints, "events"
    return np.zeros(0), None


def diagnose(
    source: Source,
    *,
    step_key: str | None = None,
    loss_key: str | None = None,
    start: float | None = None,
    end: float | None = None,
    checkpoint_every: int | None = None,
    checkpoints: Sequence[float] | None = None,
    seed: int = 0,
) -> Report:
    """Diagnose one training log.

    ``source`` is a log path (JSONL, ``.gz``, CSV, TensorBoard file or directory),
    an in-memory list of row dicts, or a :class:`RunLog`. ``start``/``end`` fix
    the stable region (steps, inclusive); ``checkpoint_every`` or ``checkpoints``
    give checkpoint steps when the log has no checkpoint events. ``seed`` makes
    the bootstrap and permutation tests reproducible.
    """
    log = load(source, step_key=step_key, loss_key=loss_key)
    rng = np.random.default_rng(seed)
    nonfinite = nonfinite_losses(log.step, log.loss)
    fin = np.isfinite(log.loss)
    if not fin.any():
        raise EmptyLogError(f"{log.source}: all {log.loss.size} loss values are NaN or inf")
    s, y = log.step[fin], log.loss[fin]
    cols = {k: v[fin] for k, v in log.columns.items()}
    buckets = None
    if log.buckets is not None:
        buckets = [b for b, f in zip(log.buckets, fin.tolist(), strict=True) if f]
    phases = find_phases(s, y, lr=cols.get("lr"), start=start, end=end)
    region = (s >= phases.start) & (s <= phases.end)
    search = (s >= _cliff_start(s, phases)) & (s <= phases.end)
    cliffs, cmask, noise = find_cliffs(s, y, region, search=search | region)
    use = region & ~cmask
    if not use.any():
        raise EmptyLogError(f"{log.source}: the stable region holds only cliff steps")
    phases.points = int(use.sum())
    phases.cliff_points = int((cmask & region).sum())
    stats = stable_stats(y, region, cmask, corrected=cols.get("corrected_loss"),
                         noise_scale=noise)
    stats.nonfinite = nonfinite
    resid = roughness_residual(y, cmask)
    bands = find_bands(resid[use], level=stats.mean, rng=rng)
    periodicity = _periodicity(s, y, region, cmask, log.step_interval)
    ck, ck_source = checkpoint_steps(log, every=checkpoint_every, steps=checkpoints)
    log.input.checkpoint_source = ck_source
    assoc = associate(s[search | region], [c.step for c in cliffs], ck,
                      interval=log.step_interval, source=ck_source)
    if ck.size:
        near = near_checkpoint(np.array([c.step for c in cliffs]), ck,
                               float(-assoc.window[0]), float(assoc.window[1]))
        for c, flag in zip(cliffs, near.tolist(), strict=True):
            c.at_checkpoint = bool(flag)
        if log.checkpoint_seconds.size:
            assoc.save_seconds_mean = float(np.mean(log.checkpoint_seconds))
        if "tokens_per_second" in cols:
            assoc.throughput_ratio = throughput_ratio(s, cols["tokens_per_second"], ck,
                                                      log.step_interval)
    attribution = _attribution(resid, y, use, buckets, cols, rng)
    if buckets is not None:
        index = {float(v): i for i, v in enumerate(s)}
        for c in cliffs:
            label = buckets[index[c.step]]
            c.bucket = list(label) if isinstance(label, tuple) else label
    if attribution.bucket_field is None and attribution.length_field is None and (
        (bands.count or 0) > 1 or periodicity.period is not None
    ):
        attribution.likely_cause = (
            "batch composition: which length bucket each step's batch came from, "
            "or how long its sequences were"
        )
        attribution.to_log = list(TO_LOG)
    attribution.logged_bucket_loss = log.bucket_loss
    report = Report(
        source=log.source,
        input=log.input,
        phases=phases,
        stats=stats,
        bands=bands,
        periodicity=periodicity,
        cliffs=cliffs,
        checkpoint_association=assoc,
        attribution=attribution,
    )
    report.verdict = build_verdict(report)
    report.series = _series(s, y, region, cmask, buckets)
    report.series.checkpoints = ck
    return report


def _cliff_start(s: np.ndarray, phases: Any) -> float:
    """Cliffs are looked for from the end of the lr warm-up (else after the first window)."""
    if phases.chosen_by == "user":
        return phases.start
    if phases.warmup_source == "lr" and phases.warmup_end is not None:
        return float(phases.warmup_end)
    return float(s[min(s.size - 1, 25)])


def _periodicity(
    s: np.ndarray, y: np.ndarray, region: np.ndarray, cmask: np.ndarray, interval: float
) -> Any:
    idx = np.flatnonzero(region)
    window = detrend_window(idx.size)
    trend = rolling_mean(y, window, valid=~cmask)
    rw = (y - trend)[idx]
    rw[cmask[idx] | ~np.isfinite(rw)] = 0.0
    if int((region & ~cmask).sum()) < MIN_POINTS:
        rw = rw[: (region & ~cmask).sum()]
    result = find_periodicity(rw, interval=interval, max_period=window // 2, window=window)
    steps = s[idx]
    if steps.size > 2:
        gaps = np.diff(steps)
        irregular = float(np.mean(np.abs(gaps - np.median(gaps)) > 1e-9))
        if irregular > 0.05:
            result.note = (f"{irregular:.0%} of the step gaps differ from the median gap "
                           f"{np.median(gaps):g}; periods assume even logging")
    return result


def _attribution(
    resid: np.ndarray,
    y: np.ndarray,
    use: np.ndarray,
    buckets: list[Any] | None,
    cols: dict[str, np.ndarray],
    rng: np.random.Generator,
) -> Attribution:
    length, length_field = None, None
    if "seq_len" in cols:
        length, length_field = cols["seq_len"], "seq_len"
    elif "real_tokens" in cols and "samples" in cols:
        with np.errstate(divide="ignore", invalid="ignore"):
            length = cols["real_tokens"] / cols["samples"]
        length_field = "real_tokens / samples"
    elif "real_tokens" in cols:
        length, length_field = cols["real_tokens"], "real_tokens"
    sel_b = None
    if buckets is not None:
        sel_b = [b for b, u in zip(buckets, use.tolist(), strict=True) if u]
    return attribute(
        resid[use],
        loss=y[use],
        buckets=sel_b,
        length=None if length is None else length[use],
        length_field=length_field,
        rng=rng,
    )


def _series(
    s: np.ndarray, y: np.ndarray, region: np.ndarray, cmask: np.ndarray, buckets: list[Any] | None
) -> Series:
    trend = rolling_mean(y, 51, valid=~cmask)
    codes, names = None, []
    if buckets is not None:
        shares, names, has = composition(buckets)
        single = has & (shares.max(axis=1) == 1.0)
        if len(names) >= 2 and single.any():
            codes = np.where(single, np.argmax(shares, axis=1), -1)
    return Series(step=s, loss=y, trend=trend, region=region, cliff_mask=cmask,
                  bucket_codes=codes, bucket_names=list(names))
