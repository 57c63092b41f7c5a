"""The doctor's analyses: a registry of functions that return a run's findings; ``diagnose``.

Every entry of :data:`ANALYSES` takes the :class:`~lengthwise.doctor.diagnosis.Diagnosis` of
a log and returns its :class:`~lengthwise.doctor.report.Finding` s: causes, or a test that
could not run (``kind="untested"``).

Example::

    >>> from lengthwise.doctor.diagnosis import DiagnoseOptions, Diagnosis, load
    >>> rows = [{"step": i, "loss": 2.0} for i in range(10)]
    >>> d = Diagnosis(load(rows), DiagnoseOptions())
    >>> [(f.name, f.kind) for f in ANALYSES["bands"](d)]
    [('bands_untested', 'untested')]
    >>> import numpy as np
    >>> noise = np.random.default_rng(0).standard_normal(1500)
    >>> diagnose([{"step": s, "loss": 2.0 + 0.05 * e} for s, e in enumerate(noise, 1)]
    ...          ).verdict.clean
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import numpy as np

from lengthwise.doctor.attribution import ALPHA as LENGTH_ALPHA
from lengthwise.doctor.attribution import REPORT_ALPHA
from lengthwise.doctor.cliffs import Cliff
from lengthwise.doctor.context import MICRO_VIEW, match_period
from lengthwise.doctor.diagnosis import DiagnoseOptions, Diagnosis, Source, load
from lengthwise.doctor.numeric import fmt_num, num, steps_text, with_error
from lengthwise.doctor.report import Finding, Report, Verdict, rank
from lengthwise.doctor.runlog import Restart
from lengthwise.doctor.signals import LEAD_POINTS, SLOW_FACTOR, SLOW_Z, TREND_BLOCKS, Alignment

#: cliffs whose median recovery takes at most this many logged points are one-step spikes
QUICK_RECOVERY = 2
#: a loss cliff starting at most this many logged points after a resume belongs to the resume
RESUME_POINTS = 2
#: the fix when each step holds one micro-batch: no order can mix length buckets in a step
ONE_MICRO_BATCH_FIX = (
    "each step holds one micro-batch, drawn from one length bucket, whatever the order: "
    "more micro-batches per step (gradient accumulation, or more ranks) average the buckets' "
    "levels in the step loss; the order cannot")
#: a period whose length matches a mechanism: finding, claim, score factor and fixes ({p}: the
#: period, {what}: the mechanism)
PERIOD_CAUSES: dict[str, tuple[str, str, float, list[str]]] = {
    "megabatch": ("sorted_batches_cycle", "loss cycles every {p} steps: the mega-batch cycle of "
                  "length-grouped batches (e.g. group_by_length)", 1.0,
                  ["draw batches in random or stratified order instead of sorted runs: "
                   "`lengthwise plan --order stratified`"]),
    "epoch": ("epoch_cycle", "loss cycles once per epoch ({p} steps)", 1.0,
              ["shuffle the data anew every epoch; a cycle that repeats each epoch "
               "follows the data order (or memorisation when it steps down)"]),
    **{what: ("{what}_cycle", "loss cycles every {p} steps, the {what} interval", 1.0,
              ["check that the {what} does not reset the data loader, RNG or "
               "optimizer state, or leave the model in eval mode"])
       for what in ("checkpoint", "evaluation")},
    "lr_restarts": ("schedule_restarts", "loss cycles every {p} steps with the learning-rate "
                    "restarts", 0.5, ["expected with a restarting schedule; use a schedule "
                                      "without restarts if the jumps hurt"]),
}
PHASE_WORDS = {"warm-up": "in the lr warm-up", "early": "in early training",
               "stable": "in the stable region"}


#: the fix against composition noise by the run's order (never the order it already uses)
ORDER_FIXES = {
    "stratified": "the run's order is already stratified (each step holds every length bucket's "
                  "share): more samples per step (a larger max_tokens or grad_accum) shrink what "
                  "remains",
    "interleave": "stratify length buckets (the run interleaves them): "
                  "`lengthwise plan --order stratified`",
    "": "interleave or stratify length buckets: `lengthwise plan --order stratified`"}
#: the fix against the length mix's noise by the run's order
LENGTH_MIX_FIXES = {
    "stratified": "part of the sampling noise of any length mix, and the run is already "
                  "stratified: more samples per step shrink it; `noise` gives its share",
    "": "part of the sampling noise of any length mix: batches with the same share of every "
        "length bucket (`lengthwise plan --order stratified`) or more samples per step shrink "
        "it; `noise` gives its share"}


def _order_fix(d: Diagnosis, fixes: dict[str, str] = ORDER_FIXES) -> str:
    """The fix for the run's order (one micro-batch per step: no order helps)."""
    if d.context.one_micro_batch:
        return ONE_MICRO_BATCH_FIX
    return fixes.get(d.context.order or "", fixes[""])


def _figures(**values: Any) -> dict[str, Any]:
    """A finding's figures as plain data: numbers (and lists of them) as Python ints or
    floats to 6 decimals, None where a number is not finite or not known."""
    def plain(v: Any) -> Any:
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return num(v, 6) if isinstance(v, int | float | np.number) and not isinstance(
            v, bool) else v
    return {k: plain(v) for k, v in values.items()}


def _aligned(a: Alignment) -> dict[str, Any]:
    """The figures of an alignment test of the loss spikes."""
    return _figures(aligned=a.aligned, cliffs=a.cliffs, expected=a.expected, p_value=a.p_value)


def _untested(name: str, note: str) -> Finding:
    """A core test (bands, periodicity, per-bucket levels) that could not run, and why."""
    return Finding(name=f"{name.split()[-1]}_untested", kind="untested", score=0.0,
                   claim=f"{name}, {note.removeprefix('not tested: ')}")


def _region(d: Diagnosis) -> str:
    return f"stable region {fmt_num(d.phases.start)}..{fmt_num(d.phases.end)}"


def _nonfinite(d: Diagnosis) -> list[Finding]:
    """NaN or inf losses, or a loss that diverged to them."""
    nf = d.stats.nonfinite
    if not nf.count:
        return []
    diverged = nf.diverged_at is not None
    return [Finding(
        name="nonfinite_loss",
        figures=_figures(count=nf.count, nan=nf.nan, inf=nf.inf, diverged_at=nf.diverged_at),
        claim=(f"loss diverged to NaN/inf at step {fmt_num(nf.diverged_at)}" if diverged
               else f"{nf.count} NaN/inf loss value(s)"),
        score=1.0 if diverged else 0.6,
        where=f"from step {fmt_num(nf.first_steps[0])}" if nf.first_steps else "",
        evidence=[f"{nf.count} non-finite losses ({nf.nan} NaN, {nf.inf} inf), first at "
                  f"steps {steps_text(nf.first_steps)}"],
        fix=[
            "lower the learning rate after warm-up and clip gradients (e.g. max norm 1.0)",
            "with fp16, use bf16 or a dynamic loss scaler; check the batches at those "
            "steps for empty or corrupt samples",
        ],
    )]


def _skipped(d: Diagnosis) -> list[Finding]:
    """Steps the trainer skipped because they held no supervised token (not divergence)."""
    sk = d.skipped
    if not sk.count:
        return []
    return [Finding(
        name="empty_steps",
        figures=_figures(count=sk.count, share=sk.share, first_steps=sk.first_steps),
        claim=(f"{sk.count} step(s) skipped by the trainer ({sk.share:.1%} of the logged "
               "steps): they held no supervised token, so no update was applied (not "
               "divergence)"),
        score=min(0.5, 0.15 + 2.0 * sk.share),
        where=f"at steps {steps_text(sk.first_steps)}" + (" ..." if sk.count > 5 else ""),
        evidence=[f"{sk.count} row(s) logged `skipped: true` with `{sk.field}` 0 and no "
                  "finite loss; they are not counted as NaN/inf losses"],
        fix=[
            "check truncation: samples cut at `max_len` can lose every supervised (assistant) "
            "token; raise `max_len` or drop samples whose supervised part is cut",
            "check the loss mask of those samples (a chat template that masks every turn "
            "leaves nothing to learn)",
        ],
    )]


def _alignment_text(a: Alignment, what: str) -> str:
    return (f"{a.aligned} of {a.cliffs} loss spikes {what} ({a.expected or 0.0:.2g} expected by "
            f"chance; exact permutation p={fmt_num(a.p_value)})")


def _schedule(d: Diagnosis) -> list[Finding]:
    """A logged learning rate whose peak or warm-up is not the configured one."""
    sc = d.schedule
    if not sc.mismatches:
        return []
    return [Finding(
        name="schedule_not_as_configured",
        figures=_figures(peak=sc.peak, logged_peak=sc.logged_peak, warmup=sc.warmup,
                         logged_warmup=sc.logged_warmup), claim="; ".join(sc.mismatches), score=0.3,
        where="the learning-rate schedule",
        evidence=[f"configured in {sc.source}: peak {fmt_num(sc.peak)}, warm-up "
                  f"{fmt_num(sc.warmup, 9)} steps; logged: peak {fmt_num(sc.logged_peak)}, "
                  f"warm-up to step {fmt_num(sc.logged_warmup, 9)}"],
        fix=["check which settings the run used: a config file from another run, "
             "a scheduler built before the optimizer's rate was set, a resumed "
             "scheduler state that overrides the new settings"])]


def _step_time(d: Diagnosis) -> list[Finding]:
    """Slow steps that cost a share of the run's time, and a slower run after a restart."""
    t = d.step_time
    out: list[Finding] = []
    if t.costly:
        every = (f" every {fmt_num(t.period, 9)} steps" if t.period is not None else "")
        what = f" ({t.matches})" if t.matches else ""
        out.append(Finding(
            name="slow_steps",
            figures=_figures(slow=t.slow, cost_share=t.cost_share, period=t.period,
                             median_seconds=t.median_seconds),
            claim=(f"{t.slow} slow step(s){every}{what} cost {t.cost_share:.0%} of the run's "
                   "time"),
            score=min(0.4, 0.1 + 2 * (t.cost_share or 0.0)),
            where=f"at steps {steps_text(t.slow_steps)}",
            evidence=[f"each at least {SLOW_FACTOR:g} times the median step "
                      f"({t.median_seconds:.3g} s, from {t.source}) and {SLOW_Z:g} robust "
                      "standard deviations above it"],
            fix=["save asynchronously, or less often" if t.matches ==
                 "the checkpoint interval" else "evaluate less often or on fewer "
                 "samples" if t.matches else "look at what those steps wait for: "
                 "data loading, host-device syncs, garbage collection, another job "
                 "on the machine"]))
    late = t.stragglers
    if late is not None and late.found:
        out.append(Finding(
            name="straggler",
            figures=_figures(rank=late.rank, ranks=late.ranks, p_value=late.p_value,
                             excess=late.excess),
            claim=(f"rank {late.rank} is a straggler: the slowest of {late.ranks} ranks at "
                   f"{late.slowest_share:.0%} of the steps, {late.excess:.0%} slower than the "
                   "ranks' median"),
            score=min(0.4, 0.1 + (late.wait_share or 0.0)),
            where=f"rank {late.rank}",
            evidence=[f"binomial test against 1/{late.ranks} of the steps: p="
                      f"{fmt_num(late.p_value)} ({late.steps} steps); the other ranks wait "
                      f"{late.wait_share:.0%} of the step time for the slowest"],
            fix=["look at that rank's device and host: thermal throttling, a slower "
                 "link, another process on it, or a data shard of longer samples"]))
    slower = t.slower_after_restart
    if slower:
        out.append(Finding(
            name="slower_after_restart",
            figures=_figures(after_restart=[list(x) for x in slower]),
            claim=("the run is slower after a restart: " + "; ".join(
                f"{r:.0%} of the throughput before at step {fmt_num(s, 9)}"
                for s, r in slower[:3])),
            score=0.2, where=f"from step {fmt_num(slower[0][0], 9)}",
            evidence=["median tokens_per_second after each restart over the median before it"],
            fix=["compare the resumed run's settings with the first run's: processes, "
                 "devices, data-loader workers, compilation, precision"]))
    return out


def _eval_gap(d: Diagnosis) -> list[Finding]:
    """The held-out loss rises while it pulls away from the training loss: over-fitting. A gap
    that widens while the held-out loss still falls is reported (``eval_gap``), not a cause."""
    e = d.eval_gap
    if not (e.widening and e.eval_rising):
        return []
    claim = (f"over-fitting: the held-out loss rises from step {fmt_num(e.eval_min_step, 9)} "
             f"and pulls away from the training loss (the gap grows from step "
             f"{fmt_num(e.widens_from, 9)}, {e.min_gap:.3g} -> {e.last_gap:.3g})")
    return [Finding(
        name="eval_overfitting",
        figures=_figures(eval_min_step=e.eval_min_step, widens_from=e.widens_from,
                         min_gap=e.min_gap, last_gap=e.last_gap), claim=claim, score=0.45,
        where=f"from step {fmt_num(e.widens_from, 9)}",
        evidence=[f"{e.evals} evaluations; held-out minus the training loss's running mean: "
                  f"{e.first_gap:.3g} at the first, {e.min_gap:.3g} at its smallest, "
                  f"{e.last_gap:.3g} at the last (evaluation-to-evaluation noise "
                  f"{e.noise:.2g})"],
        fix=["the model fits the training data better than it generalises: the "
             f"checkpoint near step {fmt_num(e.eval_min_step, 9)} holds the lowest "
             "held-out loss; train fewer epochs, on more (deduplicated) data, or "
             "with more regularisation"])]


def _grad_norm(d: Diagnosis) -> list[Finding]:
    """Gradient-norm spikes that lead or come with the loss spikes, clipping at most steps,
    and a gradient norm that keeps rising."""
    g = d.grad_norm
    out: list[Finding] = []
    if g.lead.found:
        lag = g.lead.to_dict()["median_lag_points"]
        out.append(Finding(
            name="grad_norm_leads",
            figures=_aligned(g.lead),
            claim=(f"gradient-norm spikes lead the loss spikes: {g.lead.aligned} of "
                   f"{g.lead.cliffs} follow one by {lag} logged point(s) (median)"),
            score=0.5, where=f"gradient-norm spikes at steps {steps_text(g.spike_steps)}",
            evidence=[_alignment_text(g.lead, f"start 1-{LEAD_POINTS} logged points after a "
                                      "gradient-norm spike, none at the spike itself"),
                      f"{g.spikes} gradient-norm spike(s) over {g.points} points"],
            fix=["an update that blows up comes before the loss rises: clip gradients "
                 "(or clip harder) and lower the learning rate after warm-up",
                 "with fp16, use bf16 or a dynamic loss scaler"]))
    elif g.co_spikes.found:
        out.append(Finding(
            name="grad_norm_co_spikes",
            figures=_aligned(g.co_spikes),
            claim=(f"{g.co_spikes.aligned} of {g.co_spikes.cliffs} loss spikes come with a "
                   "gradient-norm spike at the same step"),
            score=0.2, where=f"at the loss spikes (steps {steps_text([c.step for c in d.cliffs])})",
            evidence=[_alignment_text(g.co_spikes, "have a gradient-norm spike at their first "
                                      "logged point or the next")],
            fix=["a spike of both at once lies in that step's batch or weights, not "
                 "in an earlier update: inspect those batches (very long, repeated, "
                 "truncated or corrupt samples, or the data after a save or resume); "
                 "clipping keeps them from moving the weights far"]))
    shown = _clip_shown(d)
    if g.clipped_often and shown:  # else the clip rate is context (the grad-norm line)
        out.append(Finding(
            name="grad_clipped_often",
            figures=_figures(clip_rate=g.clip_rate, clip=g.clip, median=g.median),
            claim=(f"the gradient is clipped at {g.clip_rate:.0%} of the steps (norm at or "
                   f"above the clip {g.clip:g}) and {shown}: the clip sets the step size, "
                   "not the lr"),
            score=0.3, where="the analysed steps",
            evidence=[f"median gradient norm {g.median:.3g} against the clipping norm "
                      f"{g.clip:g} ({g.clip_source}), over {g.logged} logged steps"],
            fix=["clipping should be the exception: lower the learning rate or raise "
                 "the clipping norm, so that the schedule, not the clip, sets the "
                 "step size"]))
    if g.no_update_often:
        out.append(Finding(
            name="no_update_steps",
            figures=_figures(zero_steps=g.zero_steps, logged=g.logged, share=g.zero_share),
            claim=(f"{g.zero_steps} of {g.logged} logged steps ({g.zero_share:.0%}) have a "
                   "gradient norm of 0: no update at those steps"),
            score=min(0.6, 0.2 + 0.5 * g.zero_share),
            where=f"at steps {steps_text(g.zero_first)}",
            evidence=["a gradient norm of exactly 0 means no trainable weight got a gradient; "
                      "the clip rate counts these steps, the spike and trend tests leave them "
                      "out"],
            fix=["check the loss mask of those steps' samples (labels all masked, "
                 "e.g. a supervised part cut at max_len: with few samples a step, one "
                 "such sample empties the step), and that the trainable weights are "
                 "in the graph (frozen adapters, detached outputs)"]))
    if g.rising and d.cliffs:  # alone, common in healthy runs as the lr decays: reported only
        out.append(Finding(
            name="grad_norm_rising",
            figures=_figures(rise=g.rise, tau=g.trend_tau, p_value=g.trend_p),
            claim=f"the gradient norm keeps rising: {g.rise:.3g} times its level at the start",
            score=0.25, where=_region(d),
            evidence=[f"Kendall's tau {g.trend_tau:.2f} of {TREND_BLOCKS} block medians "
                      f"(p={fmt_num(g.trend_p)})"],
            fix=["a steadily rising gradient norm often comes before loss spikes: "
                 "watch the loss, check the learning rate after warm-up and weight "
                 "decay, and clip gradients"]))
    return out


def _clip_shown(d: Diagnosis) -> str:
    """How the loss shows the clipping ("": it does not, the clip rate is context only)."""
    a = d.grad_norm.clipped_spikes
    if a.found:
        return f"{a.aligned} of {a.cliffs} loss spikes start at a clipped step"
    if d.stall.since is not None:
        return f"the loss has not moved since step {fmt_num(d.stall.since)}"
    return ""


def _stall(d: Diagnosis) -> list[Finding]:
    """A loss that has not moved over most of the log: the run does not learn (first)."""
    st = d.stall
    if st.since is None:
        return []
    return [Finding(
        name="not_learning",
        figures=_figures(since=st.since, level=st.level, spread=st.spread, moved=st.moved),
        claim=f"the loss has not moved since step {fmt_num(st.since)}: the run is not learning",
        score=0.95,
        where=f"from step {fmt_num(st.since)} to the end ({st.share:.0%} of the logged steps)",
        evidence=[f"over {st.rows} logged steps the loss stays at {st.level:.4g} "
                  f"+/- {st.spread:.2g}; its smoothed level moves by {st.moved:.2%} "
                  f"of itself"],
        fix=[
            "check that the optimizer updates the trainable weights: a learning rate of 0 or "
            "far too small, parameters frozen or not passed to the optimizer, adapters not "
            "attached, every label masked",
            "compare the loss at step 0 with ln(vocabulary size): a model that outputs "
            "uniform predictions sits there",
        ],
    )]


def _attr_evidence(d: Diagnosis) -> list[str]:
    a = d.attribution
    ev = []
    if a.bucket_r2 is not None:
        ev.append(f"the bucket explains {a.bucket_r2:.0%} of the step-to-step variance "
                  f"(R^2, permutation p={fmt_num(a.bucket_p_value or 1.0)}; "
                  f"{a.bucket_r2_chance or 0.0:.0%} by chance alone, "
                  f"{a.bucket_r2_adjusted or 0.0:.0%} beyond it)")
    if a.length_r2 is not None:
        ev.append(f"sequence length explains {a.length_r2:.0%} of it "
                  f"(eta^2 over deciles, p={fmt_num(a.length_p_value or 1.0)})")
    return ev


def _micro_levels(d: Diagnosis) -> Any:
    """The per-bucket levels of a per-micro-batch log (None: a step log)."""
    return d.attribution.levels if d.context.view == MICRO_VIEW else None


def _levels_found(d: Diagnosis) -> bool:
    """A per-micro-batch log whose length ranges sit at different loss levels."""
    levels = _micro_levels(d)
    return levels is not None and levels.found


def _banded(d: Diagnosis) -> bool:
    """Bands that are told as bands (not as a per-micro-batch log's levels)."""
    return (d.bands.count or 0) > 1 and not _levels_found(d)


def _confirm(d: Diagnosis) -> list[str]:
    a = d.attribution
    return [] if a.bucket_r2 is not None or a.length_r2 is not None else [
        "log `bucket` (and `real_tokens`, `samples`) per step to confirm"]


def _levels(d: Diagnosis) -> list[Finding]:
    """A per-micro-batch log at one loss level per length range: the composition of the logged
    micro-batch (each from one length bucket)."""
    bands, levels = d.bands, _micro_levels(d)
    if levels is not None and levels.p_value is None:
        return [_untested("per-bucket levels", levels.note)]
    if levels is None or not levels.found:
        return []

    def range_text(r: dict[str, Any]) -> str:
        ids = r["buckets"]
        ids_text = f"bucket {ids[0]}" if ids[0] == ids[1] else f"buckets {ids[0]}-{ids[1]}"
        where = f"lengths {r['lengths']} tokens ({ids_text})" if r["lengths"] else ids_text
        return (f"{where}: mean loss {r['mean_loss']:.4g} ({r['mean_offset']:+.3g} from the "
                f"trend), {r['lines']} micro-batches")

    n = len(levels.ranges)
    test = (f"{levels.share or 0.0:.0%} of the line-to-line variance, "
            f"{levels.beyond_chance or 0.0:.0%} beyond chance; permutation p="
            f"{fmt_num(levels.p_value or 0.0)}")
    if bands.count is not None and bands.count > 1:
        shape = (f"they form {bands.count} distinct bands (Silverman test "
                 f"p={fmt_num(bands.p_value or 0.0)} against {bands.count - 1})")
    else:
        shape = ("they overlap: the levels differ by less than the spread within one range, "
                 "so the lines show no distinct bands, a thick (\"fluffy\") curve")
    return [Finding(
        name="micro_batch_bands",
        figures=_figures(ranges=n, share=levels.share, beyond_chance=levels.beyond_chance,
                         p_value=levels.p_value),
        claim=(f"one loss level per length bucket: {n} length ranges explain {test}; each "
               "line is the loss of one micro-batch, drawn from one length bucket, so the "
               "levels are the composition of the logged micro-batch, not of the optimizer "
               "step"),
        score=max(levels.beyond_chance or 0.0, bands.between_share or 0.0),
        where=_region(d),
        evidence=[*(range_text(r) for r in levels.ranges), shape,
                  f"the lines of {n} ranges of adjacent buckets of about equal lines were "
                  f"compared ({levels.lines} lines)"],
        fix=["log the optimizer step's loss instead: the token-weighted mean over "
             "every micro-batch of the step on every rank (`StepLogger.step`, with "
             "`buckets` listing all of them); judge the order on that log",
             "the levels are there whatever the order (each padded micro-batch holds "
             "one bucket); the order decides whether they reach the step loss: "
             "steps that each hold every bucket's share (`lengthwise plan --order "
             "stratified`) average them out"])]


def _bands(d: Diagnosis) -> list[Finding]:
    """Loss bands: one length bucket per step when the logged bucket explains them (or none is)."""
    bands, attr = d.bands, d.attribution
    if bands.count is None:
        return [_untested("bands", bands.note)]
    if not _banded(d):
        return []
    logged, attr_ev, confirm = not _confirm(d), _attr_evidence(d), _confirm(d)
    centres = ", ".join(f"{c:.4g} ({s:.0%})" for c, s in zip(bands.centres, bands.shares,
                                                               strict=True))
    score = bands.between_share or 0.0
    if attr.bucket_r2 is not None:
        score = max(score, attr.bucket_r2)
    explained = attr.explains or not logged
    claim = (f"{bands.count} loss bands: each step's batch comes from one length bucket"
             if explained else f"{bands.count} loss bands (not explained by the logged bucket)")
    if explained and not logged:
        claim = f"{bands.count} loss bands: likely one length bucket per step (not logged)"
    return [Finding(
        name="single_bucket_batches" if explained else "bands_unexplained",
        figures=_figures(bands=bands.count, p_value=bands.p_value, centres=bands.centres,
                         shares=bands.shares, bucket_r2=attr.bucket_r2),
        claim=claim, score=score if explained else 0.5 * score, where=_region(d),
        evidence=[f"per-step loss is multimodal: {bands.count} bands at {centres}; "
                  f"Silverman test p={fmt_num(bands.p_value or 0.0)} against "
                  f"{bands.count - 1} band(s)", *attr_ev],
        fix=[_order_fix(d), "log per-bucket loss (`bucket_loss`) to follow each "
             "length range", *confirm] if explained else
        ["find the step feature that splits the bands (data source, task, "
         "packing) and log it"])]


def _periodicity(d: Diagnosis) -> list[Finding]:
    """A period in the detrended loss, named by the mechanism whose length it matches."""
    per = d.periodicity
    if per.p_value is None:
        return [_untested("periodicity", per.note)]
    if per.period is None:
        return []
    alone = not (_banded(d) or _levels_found(d))
    attr_ev, confirm = (_attr_evidence(d), _confirm(d)) if alone else ([], [])
    period = float(per.period)
    share = per.power_share or 0.0
    match = match_period(period, d.context)
    shown = with_error(period, per.period_error)
    ev = [f"the detrended loss repeats every {shown} steps (p={fmt_num(per.p_value)}, "
          f"{share:.0%} of its variance, autocorrelation {fmt_num(per.acf_at_period)} at that lag)",
          f"its length {match.arithmetic}"]
    runs = per.runs
    if runs is not None and runs.z < 0 and runs.p_value < 0.01:
        ev.append(f"low/high steps come in runs (mean {runs.mean_low:.3g}/{runs.mean_high:.3g}"
                  f" steps, runs test z={runs.z:.3g})")
    score = min(1.0, 2.0 * share)
    where, figures = _region(d), _figures(period=period, error=per.period_error,
                                          p_value=per.p_value, share=share)
    cause = PERIOD_CAUSES.get(match.mechanism or "")
    if cause is not None:
        name, claim, factor, fix = cause
        cycle = match.mechanism == "megabatch"  # the one the attribution's evidence confirms
        what = {"p": fmt_num(period), "what": match.mechanism}
        return [Finding(name=name.format(**what), figures=figures, claim=claim.format(**what),
                        score=factor * score, where=where, evidence=ev + attr_ev if cycle else ev,
                        fix=[f.format(**what) for f in fix] + (confirm if cycle else []))]
    fixes = [match.missing] if match.missing else []
    return [Finding(
        name="periodic_unknown", figures=figures,
        claim=f"a periodic component of unknown cause every {shown} steps "
        f"({share:.0%} of the detrended variance)",
        score=0.5 * score, where=where, evidence=ev + attr_ev,
        fix=[*fixes, "log `bucket`, `real_tokens` and `samples` per step to test "
             "batch composition", "look for anything that repeats with this period "
             "(data order, evaluation, logging, schedule)"])]


def _attribution(d: Diagnosis) -> list[Finding]:
    """The bucket or the length mix moving the loss, without bands, a period or levels (in a
    per-micro-batch log the length ranges' levels are the bucket's test)."""
    if _banded(d) or d.periodicity.period is not None or _levels_found(d):
        return []
    a, attr_ev, bucket = d.attribution, _attr_evidence(d), _micro_levels(d) is None
    if bucket and a.bucket_explains:
        share = f"{a.bucket_r2_adjusted or 0.0:.0%}"
        if a.single_bucket is not False:
            claim = "the length bucket of each step drives its loss (no distinct bands)"
        elif d.context.order == "stratified" and not d.context.one_micro_batch:
            # every step holds close to the data set's mix
            claim = (f"the small differences between the steps' mixes of length buckets explain "
                     f"{share} of the step-to-step loss variance beyond chance (the order is "
                     "stratified: each step holds close to the data set's mix; no distinct bands)")
        else:
            claim = (f"the mix of length buckets in each step explains {share} of its loss "
                     "variance beyond chance (no distinct bands)")
        return [Finding(
            name="composition_noise", claim=claim,
            figures=_figures(r2=a.bucket_r2, r2_beyond_chance=a.bucket_r2_adjusted,
                             p_value=a.bucket_p_value),
            score=a.bucket_r2_adjusted or 0.0, where=_region(d), evidence=attr_ev,
            fix=[_order_fix(d)])]
    weak = []
    if bucket and a.bucket_p_value is not None and a.bucket_p_value < REPORT_ALPHA:
        weak.append(("bucket", a.bucket_field or "bucket", a.bucket_r2_adjusted or 0.0,
                     a.bucket_p_value))
    if a.length_p_value is not None and a.length_p_value < LENGTH_ALPHA:
        weak.append(("length", a.length_field or "length", a.length_r2 or 0.0, a.length_p_value))
    if not weak:
        return []
    kind, name, r2, p = max(weak, key=lambda w: w[2])
    if kind == "bucket":
        return [Finding(
            name="composition_weak", figures=_figures(field=name, r2=r2, p_value=p),
            claim=f"`{name}` explains {r2:.0%} of the step-to-step variance (p={fmt_num(p)})",
            score=min(0.5, r2), where=_region(d), evidence=attr_ev,
            fix=[_order_fix(d)])]
    return [Finding(
        name="length_mix", figures=_figures(field=name, r2=r2, p_value=p),
        claim=f"`{name}` explains {r2:.0%} of the step-to-step variance (p={fmt_num(p)}): "
        "each step's length mix moves its loss per token",
        score=min(0.4, r2), where=_region(d), evidence=attr_ev,
        fix=[_order_fix(d, LENGTH_MIX_FIXES)])]


def _epochs(d: Diagnosis) -> list[Finding]:
    """The loss stepping down at epoch starts (multi-epoch memorisation)."""
    e = d.epochs
    if not e.found:
        return []
    drops = ", ".join(f"{x:+.3g} ({r:+.1%}) at step {fmt_num(s)}"
                      for x, r, s in zip(e.drops[:6], e.relative_drops[:6], e.starts[:6],
                                         strict=True))
    mean_rel = sum(e.relative_drops) / len(e.relative_drops)
    down = sum(x < 0 for x in e.drops)
    at = (f"each epoch start ({len(e.starts)} boundaries" if down == len(e.drops) else
          f"epoch starts ({down} of {len(e.drops)} boundaries")
    return [Finding(
        name="epoch_boundaries",
        figures=_figures(starts=e.starts, drops=e.drops, mean_relative_drop=mean_rel,
                         p_value=e.p_value),
        claim=f"loss steps down at {at}, {mean_rel:+.1%} on average)",
        score=min(0.9, 0.3 + 5 * abs(mean_rel)),
        where=f"epoch starts ({e.source}) at steps {steps_text(e.starts)}",
        evidence=[f"level change at the epoch starts: {drops}",
                  f"placebo test against every other step: "
                  f"p={fmt_num(e.p_value)}",
                  "usual reading: multi-epoch memorisation (the model has seen these samples "
                  "before), not noise and not cliffs"],
        fix=["watch the evaluation loss: if it rises after an epoch start, train "
             "fewer epochs or on more (deduplicated) data",
             "expected and harmless when the evaluation loss keeps falling",
             *(["found from the loss alone: pass --steps-per-epoch N to confirm the "
                "epoch length"] if (e.source or "").startswith("a regular") else [])])]


def _phase_text(cliffs: list[Cliff], d: Diagnosis) -> tuple[str, str]:
    counts = {p: sum(c.phase == p for c in cliffs) for p in PHASE_WORDS}
    n = len(cliffs)
    top = max(counts, key=lambda p: counts[p])
    if counts[top] == n:
        where = PHASE_WORDS[top]
    else:
        where = ", ".join(f"{k} {PHASE_WORDS[p]}" for p, k in counts.items() if k)
    note = ""
    if top != "stable" and counts[top] >= 0.75 * n:
        note = (f" ({counts[top]} of {n} {PHASE_WORDS[top]}, before step "
                f"{fmt_num(d.phases.start)})")
    return where, note


def _cliff_list(cliffs: list[Cliff], what: str = "cliff(s)", heights: bool = True) -> str:
    """``3 cliff(s) at steps 10, 20, 30 (heights +0.5, ...)``."""
    shown = " (heights " + ", ".join(f"+{c.height:.3g}" for c in cliffs[:5]) + ")"
    return f"{len(cliffs)} {what} at steps {steps_text([c.step for c in cliffs])}" + (
        shown if heights else "")


def _cliffs(d: Diagnosis) -> list[Finding]:
    """Loss cliffs: at checkpoint saves, a divergence, or spikes (those right after a resume
    are told with the resume)."""
    tied = {id(c) for c, _ in _resume_cliffs(d)}  # told with their resume, not as hard batches
    cliffs, ck = [c for c in d.cliffs if id(c) not in tied], d.checkpoint_association
    if not cliffs:
        return []
    out: list[Finding] = []
    rec = [c.recovery_steps for c in cliffs if c.recovery_steps is not None]
    rec_txt = f", recovering in {fmt_num(sorted(rec)[len(rec) // 2])} steps (median)" if rec else ""
    base_ev = _cliff_list(cliffs) + rec_txt
    if ck.associated:
        out.append(_checkpoint_cause(d, cliffs, base_ev))
        cliffs = [c for c in cliffs if not c.at_checkpoint]
        if len(cliffs) < 2:
            return out
        base_ev = _cliff_list(cliffs, "other cliff(s)", heights=False)
    never = [c for c in cliffs if c.recovery_steps is None]
    if never:
        out.append(_divergence_cause(never[0]))
        cliffs = [c for c in cliffs if c.recovery_steps is not None]
        if not cliffs:
            return out
        base_ev = _cliff_list(cliffs)
    out.append(_spike_cause(d, cliffs, base_ev))
    return out


def _checkpoint_cause(d: Diagnosis, cliffs: list[Cliff], base_ev: str) -> Finding:
    """Cliffs that start right after checkpoint saves (the association test passed)."""
    ck = d.checkpoint_association
    ev = [base_ev, f"{ck.aligned} of {ck.cliffs} start right after one of {ck.checkpoints} "
          f"checkpoints (expected {ck.expected_aligned:.2g} by chance; "
          f"permutation p={fmt_num(ck.p_value)})"]
    if ck.throughput_ratio is not None and ck.throughput_ratio < 0.9:
        ev.append(f"throughput right after saves is {ck.throughput_ratio:.0%} of normal")
    return Finding(
        name="checkpoint_disruption",
        figures=_figures(aligned=ck.aligned, cliffs=ck.cliffs, p_value=ck.p_value,
                         throughput_ratio=ck.throughput_ratio),
        claim="loss spikes at checkpoint saves",
        score=min(1.0, 0.4 + 0.6 * ck.aligned / max(ck.cliffs, 1)),
        where=_phase_text([c for c in cliffs if c.at_checkpoint], d)[0], evidence=ev,
        fix=[
            "move checkpoint saves off the training thread (asynchronous save)",
            "check that saving does not reset the data loader, RNG or optimizer state "
            "(a save that restarts workers re-reads the start of the epoch)",
        ],
    )


def _divergence_cause(c0: Cliff) -> Finding:
    """The first cliff that never recovered: the run diverged there."""
    return Finding(
        name="divergence", figures=_figures(step=c0.step, height=c0.height, level=c0.level),
        claim=f"loss jumped at step {fmt_num(c0.step)} and never came back to its level", score=0.9,
        where=f"from step {fmt_num(c0.step)} ({PHASE_WORDS[c0.phase]})",
        evidence=[f"+{c0.height:.3g} above the level {c0.level:.4g} before it, still "
                  "above it at the end of the log"],
        fix=[
            "lower the learning rate (or lengthen warm-up) and clip gradients",
            "with fp16, use bf16 or a dynamic loss scaler; resume from the last good "
            "checkpoint with a lower learning rate",
        ],
    )


def _spike_cause(d: Diagnosis, cliffs: list[Cliff], base_ev: str) -> Finding:
    ck = d.checkpoint_association
    ev = [base_ev]
    where, phase_note = _phase_text(cliffs, d)
    if ck.associated is False:
        ev.append(f"they do not line up with the {ck.checkpoints} checkpoints: {ck.aligned} of "
                  f"{ck.cliffs} near one, {ck.expected_aligned:.2g} expected by chance "
                  f"(permutation p={fmt_num(ck.p_value)})")
    elif ck.associated is None and ck.note:
        ev.append(f"checkpoints not tested: {ck.note}")
    buckets = [str(c.bucket) for c in cliffs if c.bucket is not None]
    if len(buckets) >= 3:
        common = max(set(buckets), key=buckets.count)
        share = buckets.count(common) / len(buckets)
        if share >= 0.6:
            ev.append(f"{share:.0%} of the cliffs are in bucket {common}")
    points = sorted(c.recovery_points or 0 for c in cliffs)
    quick = points[len(points) // 2] <= QUICK_RECOVERY
    unexplained = (f" not explained by checkpoints (p={fmt_num(ck.p_value)})"
                   if ck.associated is False else "")
    if quick:
        ev.append("they recover at the next logged step or the one after: single batches "
                  "that are hard for the model, not an unstable optimizer")
        claim = (f"{len(cliffs)} one-step loss spike(s){phase_note}{unexplained}: "
                 "hard or unusual batches")
        fixes = [
            "log sample ids per step and inspect the batches at the spike steps (very long, "
            "repeated, truncated or corrupt samples); the same steps spiking in another run "
            "with the same data order confirms it",
            "clip gradients so that such batches cannot move the weights far",
        ]
        score = min(0.6, 0.2 + 0.02 * len(cliffs))
    else:
        claim = (f"{len(cliffs)} loss spike(s){phase_note}{unexplained} with slow recovery: "
                 "unstable optimization")
        fixes = ["lower the learning rate after warm-up or clip gradients harder",
                 "log sample ids per step and inspect the batches at the cliff steps"]
        score = min(0.9, 0.35 + 0.05 * len(cliffs))
    if phase_note:
        fixes.insert(0, "spikes confined to early training usually settle by themselves; a "
                     "longer warm-up or gradient clipping removes most of them")
    return Finding(name="loss_spikes", claim=claim, score=score, where=where, evidence=ev,
                   figures=_figures(steps=[c.step for c in cliffs],
                                    heights=[c.height for c in cliffs], quick=quick),
                   fix=fixes)


def _input(d: Diagnosis) -> list[Finding]:
    """How the log was written: a second writer, or rows out of step order."""
    i = d.input
    found = [Finding(
        name="duplicate_writer", figures=_figures(rows=i.duplicate_rows),
        claim=f"{i.duplicate_rows} step(s) written twice in a row: more than one writer",
        evidence=[f"{i.duplicate_rows} of {i.loss_rows + i.duplicate_rows} loss rows repeat the "
                  "step of the row before; the last row of each step was kept (these are not "
                  "restarts)"],
        fix=["log from one process only (rank 0), or give each writer its own file"],
        score=0.1, where="the whole log")] if i.duplicate_rows else []
    if i.reordered_rows:
        found.append(Finding(
            name="out_of_order",
            figures=_figures(rows=i.reordered_rows, points=i.out_of_order_points),
            claim=f"rows out of step order: {i.reordered_rows} row(s) read in step order",
            evidence=[f"the step went back {i.out_of_order_points} time(s) to a step not logged "
                      "before (a log sorted another way, or rows merged from several files): "
                      "disorder, not restarts, which log a step again"],
            fix=["nothing to fix in training; keep the log in the order it was written, or "
                 "merge files by step"],
            score=0.1, where="the whole log"))
    return found


def _restart_text(r: Restart) -> str:
    """``step 8310 -> 8001 (steps 8001..8310 run again, after 601 s without rows)``."""
    a, b = fmt_num(r.step_after, 9), fmt_num(r.step_before, 9)
    back = f"step {a} logged again" if r.rolled_back == 0 else f"steps {a}..{b} run again"
    gap = f", after {r.gap_seconds:.3g} s without rows" if r.gap_seconds else ""
    return f"step {b} -> {a} ({back}{gap})"


def _shown_restarts(d: Diagnosis) -> list[Restart]:
    """The restarts the verdict names: all but exact resumes after a logged ``resume`` event
    (those too when the learning rate jumped); none when only exact resumes happened."""
    i = d.input
    if i.restart_count - i.logged_resumes <= 0 and not any(i.lr_jumped(r) for r in i.restarts):
        return []
    return [r for r in i.restarts if not r.logged or i.lr_jumped(r)]


def _resume_cliffs(d: Diagnosis) -> list[tuple[Cliff, float]]:
    """Loss cliffs that start at a resume the verdict names or up to :data:`RESUME_POINTS`
    logged points after it, each with its resume's step (cliffs that recover only: one that
    never does is a divergence)."""
    starts = sorted({r.step_after for r in _shown_restarts(d)} | set(d.context.epoch_resets))
    reach = RESUME_POINTS * d.context.interval
    out = []
    for c in d.cliffs:
        at = [x for x in starts if 0 <= c.step - x <= reach]
        if at and c.recovery_steps is not None:
            out.append((c, at[-1]))
    return out


def _resume_spikes(d: Diagnosis, starts: set[float], ev: list[str]) -> str:
    """The claim's note on the loss spikes right after the resumes at ``starts`` (and their
    evidence, appended to ``ev``); "" when there are none."""
    tied = [(c, x) for c, x in _resume_cliffs(d) if x in starts]
    if not tied:
        return ""
    ev.append("loss spike(s) right after a resume: " + "; ".join(
        f"+{c.height:.3g} at step {fmt_num(c.step, 9)}, {fmt_num(c.step - x, 9)} step(s) after "
        f"the resume at {fmt_num(x, 9)}, back to its level in {fmt_num(c.recovery_steps, 9)} "
        "steps" for c, x in tied[:5]) + ": the resumed run's first updates (an optimizer state "
        "or schedule that was not restored), not hard batches")
    return (f"; the loss spikes right after {len(tied)} of them (+"
            + ", +".join(f"{c.height:.3g}" for c, _ in tied[:3]) + ")")


def _restarts(d: Diagnosis) -> list[Finding]:
    """Resumed runs: the steps went back (the latest run kept); a jump of the learning rate at
    the re-logged steps is a schedule that restarted with the resume."""
    i = d.input
    jumped = [r for r in i.restarts if i.lr_jumped(r)]
    shown = _shown_restarts(d)
    if not shown:
        return []
    pts = [r.step_after for r in shown]
    total = max(i.restart_count - i.logged_resumes, 0) + sum(r.logged for r in jumped)
    claim = f"{total} resume(s) with rollback: " + "; ".join(_restart_text(r)
                                                             for r in shown[:3])
    if total > 3:
        claim += f" (+{total - 3} more)"
    ev = [f"steps went back at {'; '.join(i.place(r.line) for r in shown[:5])}"
          f"{' (+more)' if total > 5 else ''}; the latest run was kept, "
          f"{i.superseded_rows} superseded row(s) dropped"]
    fixes = ["check that resuming restores the optimizer, scheduler and data-loader position "
             "(the batch order)"]
    tested = [r for r in i.restarts if i.lr_jumped(r) is not None]
    if jumped:
        claim += (f"; the learning rate jumped at {len(jumped)} of them: the schedule "
                  "restarted")
        ev.append("learning rate at the step resumed from, earlier run -> resumed run: "
                  + "; ".join(f"step {fmt_num(r.step_after)}: {r.lr_before:.3g} -> "
                              f"{r.lr_after:.3g}" for r in jumped[:5]))
        fixes.insert(0, "load the scheduler's state with the checkpoint (or step it to the "
                     "resumed step): the resumed run starts its schedule over")
    elif tested:
        ev.append(f"the learning rate at the step resumed from matches the earlier run's at "
                  f"{len(tested)} of them (the schedule resumed)")
    claim += _resume_spikes(d, set(pts), ev)
    return [Finding(name="restarts", claim=claim, score=0.3 if jumped else 0.1,
                    figures=_figures(resumes=total, steps=pts, lr_jumped=len(jumped)),
                  where=f"at steps {steps_text(pts)}", evidence=ev, fix=fixes)]


def _resumes(d: Diagnosis) -> list[Finding]:
    """Resumes the steps do not show: the logged ``epoch`` falls back while the step goes on."""
    resets = d.context.epoch_resets
    if not resets:
        return []
    ev = [f"the logged `epoch` falls back at step(s) {steps_text(resets)} while the step keeps "
          "rising: a run resumed from a checkpoint whose data pass started over"]
    return [Finding(
        name="resumes", figures=_figures(steps=resets),
        claim=f"{len(resets)} resume(s) in the log (the epoch field falls back)"
        + _resume_spikes(d, set(resets), ev),
        score=0.1, where=f"at steps {steps_text(resets)}", evidence=ev,
        fix=["check that resuming restores the optimizer, scheduler and "
             "data-loader position (the batch order); a restarted data pass repeats "
             "samples already seen"],
    )]


#: the analyses, in the order their findings are listed before ranking (ties keep it)
ANALYSES: dict[str, Callable[[Diagnosis], list[Finding]]] = {
    "nonfinite": _nonfinite, "skipped": _skipped, "stall": _stall, "bands": _bands,
    "periodicity": _periodicity, "levels": _levels, "attribution": _attribution,
    "epochs": _epochs, "cliffs": _cliffs, "input": _input, "restarts": _restarts,
    "resumes": _resumes, "grad_norm": _grad_norm, "eval_gap": _eval_gap,
    "step_time": _step_time, "schedule": _schedule,
}


def diagnose(source: Source, **options: Any) -> Report:
    """Diagnose one training log: a log path (JSONL, ``.gz``, CSV, TensorBoard, W&B), a list
    of row dicts, or a :class:`RunLog`.

    The options are the fields of :class:`~lengthwise.doctor.diagnosis.DiagnoseOptions`
    (``lengthwise doctor``'s flags): the stable region (``start``/``end``), checkpoint steps,
    the lengths a period is matched against (``steps_per_epoch``, ``batch_size``,
    ``eval_every``, ``world_size``), the run's batch ``order`` and ``clip`` (default: the log's
    ``plan`` event and the config files beside it), ``seed``, and ``timing=False`` to leave the
    machine-dependent step times out.
    """
    opts = DiagnoseOptions(**options)
    d = Diagnosis(load(source, step_key=opts.step_key, loss_key=opts.loss_key), opts, source)
    findings = [replace(f, analysis=name) for name, analysis in ANALYSES.items()
                for f in analysis(d)]
    shown = {f.name for f in fields(Report)} - {"verdict"}
    return Report(**{name: getattr(d, name) for name in shown},
                  verdict=rank(findings, d.stats.loss_roughness))


def verdict_for(source: Source, **options: Any) -> Verdict:
    """The verdict of one log, as the command line, the demo and the API show it.

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> verdict_for([{"step": s, "loss": 2.0 + 0.5 * (s % 2) + 0.05 * rng.standard_normal()}
    ...              for s in range(1, 1501)]).clean
    False
    """
    return diagnose(source, **options).verdict
