"""``diagnose``: read a log and run every analysis, returning a :class:`Report`.

Each finding is built once, complete, in the order the analyses need each other:
phases -> cliffs -> statistics, bands, periodicity, checkpoints, epoch
boundaries -> attribution -> noise budget -> verdict.

Example::

    >>> from lengthwise.doctor import diagnose
    >>> import numpy as np
    >>> noise = np.random.default_rng(0).standard_normal(1500)
    >>> diagnose([{"step": s, "loss": 2.0 + 0.05 * e} for s, e in enumerate(noise, 1)]
    ...          ).verdict.clean
    True
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lengthwise.doctor.attribution import Attribution, attribute, row_codes
from lengthwise.doctor.bands import band_residual, find_bands
from lengthwise.doctor.checkpoints import (
    CheckpointAssociation,
    associate,
    checkpoint_window,
    throughput_ratio,
)
from lengthwise.doctor.cliffs import Cliff, CliffContext, find_cliffs
from lengthwise.doctor.context import RunContext, run_context
from lengthwise.doctor.cycles import checked_periodicity
from lengthwise.doctor.epochs import (
    EpochBoundaries,
    epoch_boundaries,
    implausible_staircase,
    staircase_starts,
)
from lengthwise.doctor.errors import EmptyLogError
from lengthwise.doctor.evalgap import eval_gap
from lengthwise.doctor.gradnorm import GradNorm, grad_norm_findings
from lengthwise.doctor.levels import NO_BUCKET_FIELD, bucket_levels
from lengthwise.doctor.mechanisms import match_period
from lengthwise.doctor.noise import noise_budget
from lengthwise.doctor.order import logged_order, logged_plan, logged_view
from lengthwise.doctor.periodicity import Periodicity, periodicity_of
from lengthwise.doctor.phases import Phases, find_phases
from lengthwise.doctor.readers import read_log, read_records
from lengthwise.doctor.report import Findings, Report, Series
from lengthwise.doctor.run_config import clip_beside, settings_beside, world_size_beside
from lengthwise.doctor.runlog import RunLog
from lengthwise.doctor.schedule import SCHEDULE_KEYS, Schedule, check_schedule
from lengthwise.doctor.skipped import EmptySteps, empty_steps
from lengthwise.doctor.smoothing import rolling_mean
from lengthwise.doctor.stall import find_stall
from lengthwise.doctor.stats import nonfinite_losses, roughness_residual, stable_stats
from lengthwise.doctor.steptime import StepTimes, step_times
from lengthwise.doctor.verdict import MICRO_VIEW, Verdict, build_verdict
from lengthwise.errors import ConfigError

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
            raise ConfigError(f"--checkpoint-every must be positive, got {every}")
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
    steps_per_epoch: float | None = None,
    batch_size: int | None = None,
    eval_every: float | None = None,
    world_size: int | None = None,
    seed: int = 0,
    order: str | None = None,
    clip: float | None = None,
    timing: bool = True,
) -> Report:
    """Diagnose one training log.

    ``source`` is a log path (JSONL, ``.gz``, CSV, TensorBoard file or directory),
    an in-memory list of row dicts, or a :class:`RunLog`. ``start``/``end`` fix
    the stable region (steps, inclusive); ``checkpoint_every`` or ``checkpoints``
    give checkpoint steps when the log has no checkpoint events;
    ``steps_per_epoch``, ``batch_size`` (samples per optimizer step) and
    ``eval_every`` are the lengths a period is matched against; ``world_size``
    (data-parallel processes; default: a ``training_args.json`` or config file
    beside the log, see :mod:`lengthwise.doctor.run_config`) enters the
    mega-batch arithmetic. ``seed`` makes
    the bootstrap and permutation tests reproducible.
    ``order`` is the batch order the run used (default: the log's ``plan`` event, see
    :func:`~lengthwise.doctor.order.logged_order`); the doctor does not prescribe it.
    ``clip`` is the gradient-clipping norm (default: a config file beside the log, see
    :func:`~lengthwise.doctor.run_config.clip_beside`), for the clip rate.
    ``timing=False`` leaves the logged step times out (no slow-step, straggler or
    throughput finding): they measure the machine and its load, not the run, so a verdict
    that must read the same on every machine (the demo's, the order experiments') is
    made without them.
    """
    log = load(source, step_key=step_key, loss_key=loss_key)
    rng = np.random.default_rng(seed)
    skipped, empty = empty_steps(log.step, log.loss, log.columns)
    nonfinite = nonfinite_losses(log.step[~empty], log.loss[~empty])
    s, y, cols, buckets = _finite_rows(log, skipped)
    phases = find_phases(s, y, lr=cols.get("lr"), start=start, end=end)
    region = (s >= phases.start) & (s <= phases.end)
    search = (s >= _cliff_start(s, phases)) & (s <= phases.end)
    ck, ck_source = checkpoint_steps(log, every=checkpoint_every, steps=checkpoints)
    world, world_source = _world_size(source, world_size)
    ctx = run_context(s, cols, interval=log.step_interval, steps_per_epoch=steps_per_epoch,
                      batch_size=batch_size, checkpoint_every=checkpoint_every,
                      checkpoint_steps=ck, checkpoint_source=ck_source, eval_every=eval_every,
                      world_size=world, world_size_source=world_source,
                      order=order or logged_order(source), view=logged_view(source))
    window = checkpoint_window(log.step_interval)
    warm = phases.warmup_end if phases.warmup_source == "lr" else None
    cliff_ctx = CliffContext(checkpoints=ck, window=window, buckets=buckets,
                             phase_bounds=(warm, phases.start))
    cliffs, cmask, noise_scale = find_cliffs(s, y, region, search=search | region,
                                             context=cliff_ctx)
    use = region & ~cmask
    if not use.any():
        raise EmptyLogError(f"{log.source}: the stable region holds only cliff steps")
    stats = stable_stats(y, region, cmask, corrected=cols.get("corrected_loss"),
                         noise_scale=noise_scale, nonfinite=nonfinite)
    resid = roughness_residual(y, cmask)
    detrended = band_residual(y, cmask, int(use.sum()))[use]
    bands = find_bands(detrended, level=stats.mean, rng=rng)
    periodicity = _periodicity(s, y, region, cmask, log.step_interval)
    periodicity = checked_periodicity(periodicity, s[region], y[region], cmask[region], ctx,
                                      np.random.default_rng([seed, 1]))
    analysed = search | region
    assoc = _association(log, s, cols, analysed, cliffs, (ck, ck_source), checkpoint_every)
    keep = ~cmask & (s >= _cliff_start(s, phases))
    ctx, epochs = _epochs(s[keep], y[keep], periodicity, ctx, rng)
    structure = (bands.count or 0) > 1 or periodicity.period is not None
    attribution = _attribution(resid, y, use, buckets, cols, rng, structure,
                               log.bucket_loss)
    if ctx.view == MICRO_VIEW and buckets is None:
        attribution = replace(attribution, levels=NO_BUCKET_FIELD)
    elif ctx.view == MICRO_VIEW and buckets is not None:
        edges = logged_plan(source).get("edges")
        levels = bucket_levels(
            detrended, y[use], [b for b, u in zip(buckets, use.tolist(), strict=True) if u],
            edges=edges if isinstance(edges, list) else None,
            rng=np.random.default_rng([seed, 2]))
        # lines that each hold one bucket (a packed row holds many lengths), or bad buckets
        if levels.lines or levels.invalid:
            attribution = replace(attribution, levels=levels)
    noise = _noise(resid, use, cols, attribution)
    gnorm = _grad_norm(source, s, cols, analysed, cliffs, log.step_interval, clip)
    findings = Findings(
        source=log.source, input=log.input, context=ctx, phases=phases, stats=stats,
        bands=bands, periodicity=periodicity, cliffs=cliffs, checkpoint_association=assoc,
        epochs=epochs, attribution=attribution, noise=noise, stall=find_stall(s, y),
        skipped=skipped, grad_norm=gnorm, eval_gap=eval_gap(s, y, log.evals),
        schedule=_schedule(source, log),
        step_time=step_times(log.step, log.columns, checkpoint_every=ctx.checkpoint_every,
                             eval_every=ctx.eval_every,
                             restarts=[r.step_after for r in log.input.restarts],
                             rank_seconds=log.rank_seconds) if timing else
        StepTimes(note="not analysed: step times left out (timing=False)"),
    )
    return Report(**{k: getattr(findings, k) for k in Findings.__dataclass_fields__},
                  verdict=build_verdict(findings),
                  series=replace(_series(s, y, region, cmask, buckets, ck,
                                         cols.get("grad_norm")), evals=log.evals))


def _grad_norm(source: Source, s: np.ndarray, cols: dict[str, np.ndarray],
               analysed: np.ndarray, cliffs: list[Cliff], interval: float,
               clip: float | None) -> GradNorm:
    """The gradient-norm findings: rates over the logged steps, tests over the analysed ones
    (clip: given, else beside the log)."""
    if clip is not None and not clip > 0:
        raise ConfigError(f"--clip must be positive, got {clip}")
    clip_source = "--clip" if clip is not None else None
    if clip is None and isinstance(source, str | os.PathLike):
        clip, clip_source = clip_beside(source)
    return grad_norm_findings(s, cols.get("grad_norm"), cliffs=[c.step for c in cliffs],
                              interval=interval, clip=clip, clip_source=clip_source,
                              analysed=analysed)


def _schedule(source: Source, log: RunLog) -> Schedule:
    """The logged learning rate against the schedule configured beside a log file."""
    config, where = ({}, None)
    if isinstance(source, str | os.PathLike):
        config, where = settings_beside(source, SCHEDULE_KEYS)
    return check_schedule(log.step, log.columns.get("lr"), config, where, log.step_interval)


def _world_size(source: Source, given: int | None) -> tuple[int | None, str | None]:
    """The world size given, else the one recorded beside a log file (else unknown)."""
    if given is not None:
        return given, "--world-size"
    if isinstance(source, str | os.PathLike):
        return world_size_beside(source)
    return None, None


def _finite_rows(
    log: RunLog, skipped: EmptySteps,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], list[Any] | None]:
    """Steps, losses, columns and buckets of the rows whose loss is finite."""
    fin = np.isfinite(log.loss)
    if not fin.any() and skipped.count == log.loss.size:
        raise EmptyLogError(f"{log.source}: all {log.loss.size} steps were skipped by the "
                            f"trainer: none held a supervised token (`{skipped.field}` 0); "
                            "check the loss mask and whether truncation at max_len cut the "
                            "supervised tokens")
    if not fin.any():
        raise EmptyLogError(f"{log.source}: all {log.loss.size} loss values are NaN or inf")
    s, y = log.step[fin], log.loss[fin]
    cols = {k: v[fin] for k, v in log.columns.items()}
    buckets = None
    if log.buckets is not None:
        buckets = [b for b, f in zip(log.buckets, fin.tolist(), strict=True) if f]
    return s, y, cols, buckets


def _association(
    log: RunLog,
    s: np.ndarray,
    cols: dict[str, np.ndarray],
    analysed: np.ndarray,
    cliffs: list[Cliff],
    checkpoints: tuple[np.ndarray, str | None],
    checkpoint_every: int | None,
) -> CheckpointAssociation:
    """Whether the cliffs start at checkpoints, with the throughput dip and save time."""
    ck, ck_source = checkpoints
    tput = None
    if ck.size and "tokens_per_second" in cols:
        tput = throughput_ratio(s, cols["tokens_per_second"], ck, log.step_interval)
    return associate(s[analysed], [c.step for c in cliffs], ck, interval=log.step_interval,
                     source=ck_source, every=checkpoint_every, throughput_ratio=tput,
                     save_seconds_mean=float(np.mean(log.checkpoint_seconds))
                     if ck.size and log.checkpoint_seconds.size else None)


def _epochs(
    s: np.ndarray, y: np.ndarray, per: Periodicity, ctx: RunContext, rng: np.random.Generator,
) -> tuple[RunContext, EpochBoundaries]:
    """Epoch boundaries from the context, else from an unexplained period's staircase."""
    epochs = epoch_boundaries(s, y, ctx.epoch_starts, source=ctx.steps_per_epoch_source, rng=rng)
    if ctx.steps_per_epoch is None and per.period is not None and match_period(
        per.period, ctx
    ).mechanism is None:
        ctx, epochs = _staircase(s, y, per, ctx, epochs, rng)
    return ctx, epochs


def _staircase(
    s: np.ndarray, y: np.ndarray, per: Periodicity, ctx: RunContext, epochs: EpochBoundaries,
    rng: np.random.Generator,
) -> tuple[RunContext, EpochBoundaries]:
    """An unexplained period that is a regular staircase: epochs of that length, if it tests so.

    Only when the implied epochs are plausible (:func:`~lengthwise.doctor.epochs.
    implausible_staircase`); otherwise the period stays a periodic component and
    the epochs' note says why it was not read as epochs.
    """
    starts = staircase_starts(s, y, float(per.period_points or 0))
    if not starts:
        return ctx, epochs
    source = f"a regular staircase every {per.period:g} steps"
    found = epoch_boundaries(s, y, starts, source=source, rng=rng)
    if not found.found:
        return ctx, epochs
    why = implausible_staircase(found)
    if why is not None:
        note = (f"the {per.period:.4g}-step period falls like a staircase but is not read as "
                f"epochs: {why}; {epochs.note}")
        return ctx, replace(epochs, note=note)
    return replace(ctx, steps_per_epoch=float(per.period or 0), steps_per_epoch_source=source,
                   epoch_starts=starts), found


def verdict_for(source: Source, **options: Any) -> Verdict:
    """The verdict of one log: ``diagnose(source, **options).verdict``.

    The one verdict the command line, the demo and the API show.

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> verdict_for([{"step": s, "loss": 2.0 + 0.5 * (s % 2) + 0.05 * rng.standard_normal()}
    ...              for s in range(1, 1501)]).clean
    False
    """
    return diagnose(source, **options).verdict


def _cliff_start(s: np.ndarray, phases: Phases) -> float:
    """Cliffs are looked for from the end of the lr warm-up (else after the first window)."""
    if phases.chosen_by == "user":
        return phases.start
    if phases.warmup_source == "lr" and phases.warmup_end is not None:
        return float(phases.warmup_end)
    return float(s[min(s.size - 1, 25)])


def _periodicity(
    s: np.ndarray, y: np.ndarray, region: np.ndarray, cmask: np.ndarray, interval: float
) -> Periodicity:
    idx = np.flatnonzero(region)
    steps = s[idx]
    note = ""
    if steps.size > 2:
        gaps = np.diff(steps)
        irregular = float(np.mean(np.abs(gaps - np.median(gaps)) > 1e-9))
        if irregular > 0.05:
            note = (f"{irregular:.0%} of the step gaps differ from the median gap "
                    f"{np.median(gaps):g}; periods assume even logging")
    return periodicity_of(y[idx], cmask[idx], interval=interval, note=note)


def _attribution(
    resid: np.ndarray,
    y: np.ndarray,
    use: np.ndarray,
    buckets: list[Any] | None,
    cols: dict[str, np.ndarray],
    rng: np.random.Generator,
    structure: bool,
    bucket_loss: dict[str, float] | None,
) -> Attribution:
    length, length_field = _length(cols)
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
        structure_found=structure,
        logged_bucket_loss=bucket_loss,
    )


def _noise(resid: np.ndarray, use: np.ndarray, cols: dict[str, np.ndarray],
           a: Attribution) -> Any:
    # the bucket when it separates steps at all (else, e.g. stratified steps that all hold
    # the same mix, the steps' mean length)
    if a.bucket_r2 is not None and a.bucket_r2 > 0:
        # the share beyond what the shuffles give by chance (already adjusted: one group)
        r2, groups, src = a.bucket_r2_adjusted, 1, f"length bucket (`{a.bucket_field}`)"
    else:
        r2, groups, src = None, 1, None
    length, length_src = _length(cols)
    pick = {k: (cols[k][use] if k in cols else None)
            for k in ("loss_sample_std", "loss_sample_neff", "samples", "lr")}
    count = pick["loss_sample_neff"] if pick["loss_sample_neff"] is not None else pick["samples"]
    return noise_budget(resid[use], loss_sample_std=pick["loss_sample_std"],
                        samples=count, composition_r2=r2, composition_groups=groups,
                        composition_source=src, lr=pick["lr"],
                        length=None if length is None else length[use],
                        length_source=None if length_src is None
                        else f"sequence length (`{length_src}`)")


def _length(cols: dict[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
    """Each step's mean sequence length and the field it came from (None: not logged)."""
    if "seq_len" in cols:
        return cols["seq_len"], "seq_len"
    if "real_tokens" in cols and "samples" in cols:
        with np.errstate(divide="ignore", invalid="ignore"):
            return cols["real_tokens"] / cols["samples"], "real_tokens / samples"
    if "real_tokens" in cols:
        return cols["real_tokens"], "real_tokens"
    return None, None


def _series(
    s: np.ndarray, y: np.ndarray, region: np.ndarray, cmask: np.ndarray,
    buckets: list[Any] | None, checkpoints: np.ndarray, grad_norm: np.ndarray | None = None,
) -> Series:
    trend = rolling_mean(y, 51, valid=~cmask)
    codes, names = None, []
    if buckets is not None:
        row, names, _ = row_codes(buckets)  # -1: no bucket, or several
        if len(names) >= 2 and (row >= 0).any():
            codes = row
    return Series(step=s, loss=y, trend=trend, region=region, cliff_mask=cmask,
                  bucket_codes=codes, bucket_names=list(names), checkpoints=checkpoints,
                  grad_norm=grad_norm)
