"""What every analysis reads: one log, its options, and each shared result computed once.

Each intermediate result and measurement of a :class:`Diagnosis` is a cached property, so the
analyses of :mod:`lengthwise.doctor.analyses` ask for what they need in any order.

Example::

    >>> import numpy as np
    >>> noise = np.random.default_rng(0).standard_normal(1500)
    >>> rows = [{"step": s, "loss": 2.0 + 0.4 * (s % 3) + 0.02 * e}
    ...         for s, e in enumerate(noise, 1)]
    >>> d = Diagnosis(load(rows), DiagnoseOptions())
    >>> d.bands.count
    3
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from lengthwise.doctor.attribution import (
    NO_BUCKET_FIELD,
    Attribution,
    Noise,
    attribute,
    bucket_levels,
    noise_budget,
    row_codes,
)
from lengthwise.doctor.bands import Bands, band_residual, find_bands
from lengthwise.doctor.cliffs import (
    CheckpointAssociation,
    Cliff,
    CliffContext,
    associate,
    checkpoint_window,
    find_cliffs,
    throughput_ratio,
)
from lengthwise.doctor.context import (
    CLIP_KEYS,
    MICRO_VIEW,
    RunContext,
    logged_plan,
    match_period,
    plan_text,
    run_context,
    setting_beside,
    settings_beside,
    world_size_beside,
)
from lengthwise.doctor.curve import (
    EmptySteps,
    Phases,
    StableStats,
    Stall,
    empty_steps,
    find_phases,
    find_stall,
    nonfinite_losses,
    roughness_residual,
    stable_stats,
)
from lengthwise.doctor.epochs import (
    EpochBoundaries,
    epoch_boundaries,
    implausible_staircase,
    staircase_starts,
)
from lengthwise.doctor.errors import EmptyLogError
from lengthwise.doctor.numeric import rolling_mean
from lengthwise.doctor.periodicity import Periodicity, checked_periodicity, periodicity_of
from lengthwise.doctor.readers import read_log, read_records
from lengthwise.doctor.report import Series
from lengthwise.doctor.runlog import RunLog
from lengthwise.doctor.signals import (
    SCHEDULE_KEYS,
    EvalGap,
    GradNorm,
    Schedule,
    StepTimes,
    check_schedule,
    eval_gap,
    grad_norm_findings,
    step_times,
)
from lengthwise.errors import ConfigError

Source = str | os.PathLike[str] | Iterable[Mapping[str, Any]] | RunLog


@dataclass(frozen=True)
class DiagnoseOptions:
    """The options of one diagnosis (``lengthwise doctor``'s flags, see ``diagnose``)."""

    step_key: str | None = None
    loss_key: str | None = None
    start: float | None = None
    end: float | None = None
    checkpoint_every: int | None = None
    checkpoints: Sequence[float] | None = None
    steps_per_epoch: float | None = None
    batch_size: int | None = None
    eval_every: float | None = None
    world_size: int | None = None
    seed: int = 0
    order: str | None = None
    clip: float | None = None
    timing: bool = True


def load(source: Source, *, step_key: str | None = None, loss_key: str | None = None) -> RunLog:
    """A :class:`RunLog` from a path, a list of row dicts, or a RunLog (returned as is)."""
    if isinstance(source, RunLog):
        return source
    if isinstance(source, str | os.PathLike):
        return read_log(source, step_key=step_key, loss_key=loss_key)
    return read_records(source, step_key=step_key, loss_key=loss_key)


class Diagnosis:
    """One log under diagnosis: the log, the options and, computed once each, the shared
    intermediate results and the measurements the report shows."""

    def __init__(self, log: RunLog, options: DiagnoseOptions, source: Source | None = None) -> None:
        self.log, self.options = log, options
        #: the log's name as the report shows it, and how it was read (format, rows, restarts)
        self.source, self.input = log.source, log.input
        #: the path the log was read from (None: records or a RunLog): its config files
        self.path = source if isinstance(source, str | os.PathLike) else None
        self._source = source
        self._rng = np.random.default_rng(options.seed)

    # -- the rows -------------------------------------------------------------------------
    @cached_property
    def _empty(self) -> tuple[EmptySteps, np.ndarray]:
        return empty_steps(self.log.step, self.log.loss, self.log.columns)

    @property
    def skipped(self) -> EmptySteps:
        """Steps the trainer skipped (no supervised token)."""
        return self._empty[0]

    @cached_property
    def finite(self) -> np.ndarray:
        """Which logged rows have a finite loss (all are, or the log is refused)."""
        log, fin = self.log, np.isfinite(self.log.loss)
        if not fin.any() and self.skipped.count == log.loss.size:
            raise EmptyLogError(
                f"{log.source}: all {log.loss.size} steps were skipped by the trainer: none "
                f"held a supervised token (`{self.skipped.field}` 0); check the loss mask and "
                "whether truncation at max_len cut the supervised tokens")
        if not fin.any():
            raise EmptyLogError(f"{log.source}: all {log.loss.size} loss values are NaN or inf")
        return fin

    @cached_property
    def step(self) -> np.ndarray:
        """The steps of the finite rows."""
        return self.log.step[self.finite]

    @cached_property
    def loss(self) -> np.ndarray:
        """The finite losses."""
        return self.log.loss[self.finite]

    @cached_property
    def cols(self) -> dict[str, np.ndarray]:
        """The other logged columns at the finite rows."""
        return {k: v[self.finite] for k, v in self.log.columns.items()}

    @cached_property
    def buckets(self) -> list[Any] | None:
        """Each finite row's bucket (None: not logged)."""
        if self.log.buckets is None:
            return None
        return [b for b, f in zip(self.log.buckets, self.finite.tolist(), strict=True) if f]

    @cached_property
    def length(self) -> tuple[np.ndarray | None, str | None]:
        """Each step's mean sequence length and the field it came from (None: not logged)."""
        cols = self.cols
        if "seq_len" in cols:
            return cols["seq_len"], "seq_len"
        if "real_tokens" in cols and "samples" in cols:
            with np.errstate(divide="ignore", invalid="ignore"):
                return cols["real_tokens"] / cols["samples"], "real_tokens / samples"
        if "real_tokens" in cols:
            return cols["real_tokens"], "real_tokens"
        return None, None

    # -- the run's context ----------------------------------------------------------------
    @cached_property
    def plan(self) -> dict[str, Any]:
        """The log's ``plan`` event (``{}``: none)."""
        return logged_plan(self._source)

    @cached_property
    def checkpoint_steps(self) -> tuple[np.ndarray, str | None]:
        """The checkpoint steps and where they came from (given, ``--checkpoint-every``, the
        log's events)."""
        log, every, steps = self.log, self.options.checkpoint_every, self.options.checkpoints
        if steps is not None:
            return np.asarray(sorted(steps), dtype=np.float64), "given"
        if every is not None:
            if every <= 0:
                raise ConfigError(f"--checkpoint-every must be positive, got {every}")
            first = math.ceil(float(log.step[0]) / every) * every
            return np.arange(first, float(log.step[-1]) + 1, every, dtype=np.float64), (
                f"--checkpoint-every {every}")
        return (log.checkpoints, "events") if log.checkpoints.size else (np.zeros(0), None)

    @cached_property
    def run_context(self) -> RunContext:
        """The run's known mechanisms as logged or given (before a staircase sets epochs)."""
        o, log = self.options, self.log
        ck, ck_source = self.checkpoint_steps
        world, world_source = (o.world_size, "--world-size") if o.world_size is not None else (
            world_size_beside(self.path) if self.path is not None else (None, None))
        return run_context(self.step, self.cols, interval=log.step_interval,
                           steps_per_epoch=o.steps_per_epoch, batch_size=o.batch_size,
                           checkpoint_every=o.checkpoint_every, checkpoint_steps=ck,
                           checkpoint_source=ck_source, eval_every=o.eval_every,
                           world_size=world, world_size_source=world_source,
                           order=o.order or plan_text(self.plan, "order"),
                           view=plan_text(self.plan, "view"))

    @property
    def context(self) -> RunContext:
        """The run's context, with the epochs a regular staircase implies."""
        return self._epochs[0]

    # -- the stable region and its cliffs -------------------------------------------------
    @cached_property
    def phases(self) -> Phases:
        """The warm-up and the stable region."""
        o = self.options
        return find_phases(self.step, self.loss, lr=self.cols.get("lr"), start=o.start,
                           end=o.end)

    @cached_property
    def region(self) -> np.ndarray:
        """The stable region's rows."""
        return (self.step >= self.phases.start) & (self.step <= self.phases.end)

    @cached_property
    def cliff_start(self) -> float:
        """Cliffs are looked for from the end of the lr warm-up (else after the first window)."""
        p, s = self.phases, self.step
        if p.chosen_by == "user":
            return p.start
        if p.warmup_source == "lr" and p.warmup_end is not None:
            return float(p.warmup_end)
        return float(s[min(s.size - 1, 25)])

    @cached_property
    def analysed(self) -> np.ndarray:
        """The rows searched for cliffs: from :attr:`cliff_start`, and the stable region."""
        return ((self.step >= self.cliff_start) & (self.step <= self.phases.end)) | self.region

    @cached_property
    def _cliffs(self) -> tuple[list[Cliff], np.ndarray, float]:
        p, ck = self.phases, self.checkpoint_steps[0]
        warm = p.warmup_end if p.warmup_source == "lr" else None
        found = find_cliffs(self.step, self.loss, self.region, search=self.analysed,
                            context=CliffContext(checkpoints=ck,
                                                 window=checkpoint_window(self.log.step_interval),
                                                 buckets=self.buckets,
                                                 phase_bounds=(warm, p.start)))
        if not (self.region & ~found[1]).any():
            raise EmptyLogError(f"{self.log.source}: the stable region holds only cliff steps")
        return found

    @property
    def cliffs(self) -> list[Cliff]:
        """The loss cliffs (spikes and jumps)."""
        return self._cliffs[0]

    @property
    def cliff_mask(self) -> np.ndarray:
        """The rows inside a cliff."""
        return self._cliffs[1]

    @cached_property
    def use(self) -> np.ndarray:
        """The stable region's rows outside cliffs: what the statistics describe."""
        return self.region & ~self.cliff_mask

    @cached_property
    def residual(self) -> np.ndarray:
        """The loss minus its smooth trend (cliffs left out)."""
        return roughness_residual(self.loss, self.cliff_mask)

    @cached_property
    def detrended(self) -> np.ndarray:
        """The detrended loss of the :attr:`use` rows (the bands' and levels' series)."""
        return band_residual(self.loss, self.cliff_mask, int(self.use.sum()))[self.use]

    # -- the measurements -----------------------------------------------------------------
    @cached_property
    def stats(self) -> StableStats:
        """The stable region's statistics."""
        empty = self._empty[1]
        nonfinite = nonfinite_losses(self.log.step[~empty], self.log.loss[~empty])
        return stable_stats(self.loss, self.region, self.cliff_mask,
                            corrected=self.cols.get("corrected_loss"),
                            noise_scale=self._cliffs[2], nonfinite=nonfinite)

    @cached_property
    def bands(self) -> Bands:
        """The bands of the detrended loss (the first draws of the shared generator)."""
        return find_bands(self.detrended, level=self.stats.mean, rng=self._rng)

    @cached_property
    def periodicity(self) -> Periodicity:
        """The period of the stable region's loss, checked against the run's mechanisms."""
        idx = np.flatnonzero(self.region)
        steps, note = self.step[idx], ""
        if steps.size > 2:
            gaps = np.diff(steps)
            irregular = float(np.mean(np.abs(gaps - np.median(gaps)) > 1e-9))
            if irregular > 0.05:
                note = (f"{irregular:.0%} of the step gaps differ from the median gap "
                        f"{np.median(gaps):g}; periods assume even logging")
        y, cmask = self.loss[idx], self.cliff_mask[idx]
        found = periodicity_of(y, cmask, interval=self.log.step_interval, note=note)
        return checked_periodicity(found, steps, y, cmask, self.run_context,
                                   np.random.default_rng([self.options.seed, 1]))

    @cached_property
    def checkpoint_association(self) -> CheckpointAssociation:
        """Whether the cliffs start at checkpoints, with the throughput dip and save time."""
        log, s, (ck, ck_source) = self.log, self.step, self.checkpoint_steps
        tput = None
        if ck.size and "tokens_per_second" in self.cols:
            tput = throughput_ratio(s, self.cols["tokens_per_second"], ck, log.step_interval)
        return associate(s[self.analysed], [c.step for c in self.cliffs], ck,
                         interval=log.step_interval, source=ck_source,
                         every=self.options.checkpoint_every, throughput_ratio=tput,
                         save_seconds_mean=float(np.mean(log.checkpoint_seconds))
                         if ck.size and log.checkpoint_seconds.size else None)

    @cached_property
    def _epochs(self) -> tuple[RunContext, EpochBoundaries]:
        """Epoch boundaries from the context, else from an unexplained period's staircase."""
        self.bands  # noqa: B018 - the bands draw from the shared generator first
        keep = ~self.cliff_mask & (self.step >= self.cliff_start)
        s, y, ctx, per = self.step[keep], self.loss[keep], self.run_context, self.periodicity
        epochs = epoch_boundaries(s, y, ctx.epoch_starts, source=ctx.steps_per_epoch_source,
                                  rng=self._rng)
        if ctx.steps_per_epoch is not None or per.period is None or match_period(
                per.period, ctx).mechanism is not None:
            return ctx, epochs
        starts = staircase_starts(s, y, float(per.period_points or 0))
        if not starts:
            return ctx, epochs
        source = f"a regular staircase every {per.period:g} steps"
        found = epoch_boundaries(s, y, starts, source=source, rng=self._rng)
        if not found.found:
            return ctx, epochs
        why = implausible_staircase(found)
        if why is not None:  # the period stays a periodic component
            note = (f"the {per.period:.4g}-step period falls like a staircase but is not read "
                    f"as epochs: {why}; {epochs.note}")
            return ctx, replace(epochs, note=note)
        return replace(ctx, steps_per_epoch=float(per.period or 0),
                       steps_per_epoch_source=source, epoch_starts=starts), found

    @property
    def epochs(self) -> EpochBoundaries:
        """The level changes at epoch starts."""
        return self._epochs[1]

    @cached_property
    def attribution(self) -> Attribution:
        """How much of the step-to-step variance the bucket and the length explain."""
        use, buckets = self.use, self.buckets
        structure = (self.bands.count or 0) > 1 or self.periodicity.period is not None
        self._epochs  # noqa: B018 - the epochs draw from the shared generator before it
        length, length_field = self.length
        picked = None if buckets is None else [
            b for b, u in zip(buckets, use.tolist(), strict=True) if u]
        found = attribute(self.residual[use], loss=self.loss[use], buckets=picked,
                          length=None if length is None else length[use],
                          length_field=length_field, rng=self._rng, structure_found=structure,
                          logged_bucket_loss=self.log.bucket_loss)
        if self.run_context.view != MICRO_VIEW:
            return found
        if picked is None:
            return replace(found, levels=NO_BUCKET_FIELD)
        edges = self.plan.get("edges")
        levels = bucket_levels(self.detrended, self.loss[use], picked,
                               edges=edges if isinstance(edges, list) else None,
                               rng=np.random.default_rng([self.options.seed, 2]))
        # lines that each hold one bucket (a packed row holds many lengths), or bad buckets
        return replace(found, levels=levels) if levels.lines or levels.invalid else found

    @cached_property
    def noise(self) -> Noise | None:
        """The step-to-step variance split into sampling, composition, schedule and the rest."""
        use, a, cols = self.use, self.attribution, self.cols
        # the bucket when it separates steps at all (else, e.g. stratified steps that all
        # hold the same mix, the steps' mean length); its share beyond what shuffles give
        r2, src = (a.bucket_r2_adjusted, f"length bucket (`{a.bucket_field}`)") if (
            a.bucket_r2 is not None and a.bucket_r2 > 0) else (None, None)
        length, length_src = self.length
        pick = {k: cols[k][use] for k in ("loss_sample_std", "loss_sample_neff", "samples", "lr")
                if k in cols}
        return noise_budget(self.residual[use], loss_sample_std=pick.get("loss_sample_std"),
                            samples=pick.get("loss_sample_neff", pick.get("samples")),
                            composition_r2=r2, composition_source=src, lr=pick.get("lr"),
                            length=None if length is None else length[use],
                            length_source=None if length_src is None
                            else f"sequence length (`{length_src}`)")

    @cached_property
    def stall(self) -> Stall:
        """Whether the loss stopped moving."""
        return find_stall(self.step, self.loss)

    @cached_property
    def grad_norm(self) -> GradNorm:
        """The gradient-norm findings: rates over the logged steps, tests over the analysed
        ones (clip: given, else beside the log)."""
        clip = self.options.clip
        if clip is not None and not clip > 0:
            raise ConfigError(f"--clip must be positive, got {clip}")
        clip_source = "--clip" if clip is not None else None
        if clip is None and self.path is not None:
            clip, clip_source = setting_beside(self.path, CLIP_KEYS)
        return grad_norm_findings(self.step, self.cols.get("grad_norm"),
                                  cliffs=[c.step for c in self.cliffs],
                                  interval=self.log.step_interval, clip=clip,
                                  clip_source=clip_source, analysed=self.analysed)

    @cached_property
    def eval_gap(self) -> EvalGap:
        """The held-out loss against the training loss."""
        return eval_gap(self.step, self.loss, self.log.evals)

    @cached_property
    def schedule(self) -> Schedule:
        """The logged learning rate against the schedule configured beside a log file."""
        config, where = settings_beside(self.path, SCHEDULE_KEYS) if self.path is not None \
            else ({}, None)
        log = self.log
        return check_schedule(log.step, log.columns.get("lr"), config, where, log.step_interval)

    @cached_property
    def step_time(self) -> StepTimes:
        """Slow steps, stragglers and throughput (none with ``timing=False``)."""
        if not self.options.timing:
            return StepTimes(note="not analysed: step times left out (timing=False)")
        log, ctx = self.log, self.context
        return step_times(log.step, log.columns, checkpoint_every=ctx.checkpoint_every,
                          eval_every=ctx.eval_every,
                          restarts=[r.step_after for r in log.input.restarts],
                          rank_seconds=log.rank_seconds)

    @cached_property
    def series(self) -> Series:
        """The arrays behind the report, for plots."""
        codes, names = None, []
        if self.buckets is not None:
            row, names, _ = row_codes(self.buckets)  # -1: no bucket, or several
            if len(names) >= 2 and (row >= 0).any():
                codes = row
        return Series(step=self.step, loss=self.loss,
                      trend=rolling_mean(self.loss, 51, valid=~self.cliff_mask),
                      region=self.region, cliff_mask=self.cliff_mask, bucket_codes=codes,
                      bucket_names=list(names), checkpoints=self.checkpoint_steps[0],
                      grad_norm=self.cols.get("grad_norm"), evals=self.log.evals)
