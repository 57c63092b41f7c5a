"""The doctor's report: findings, verdict and measurements, their JSON form and their text.

:func:`rank` orders the findings into a :class:`Verdict`; :func:`render_text` shows one
report and :func:`render_comparison` several side by side; ``Report.to_dict()`` has the keys
of :data:`REPORT_KEYS` (docs/doctor.md documents each field).

Example::

    >>> v = Verdict(causes=[], clean=None, summary="not tested", untested=["bands"])
    >>> v.to_dict()["clean"] is None
    True
    >>> from lengthwise.doctor import diagnose
    >>> text = render_text(diagnose([{"step": s, "loss": 2.0 + 0.01 * (s % 7)}
    ...                              for s in range(1, 801)]))
    >>> text.splitlines()[0]
    'lengthwise doctor: <records>'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.doctor.attribution import Attribution, BucketLevels, Noise
from lengthwise.doctor.bands import Bands
from lengthwise.doctor.cliffs import CheckpointAssociation, Cliff
from lengthwise.doctor.context import RunContext
from lengthwise.doctor.curve import EmptySteps, Phases, StableStats, Stall
from lengthwise.doctor.epochs import EpochBoundaries
from lengthwise.doctor.numeric import JsonForm, json_ready, steps_text, with_error
from lengthwise.doctor.numeric import fmt_num as _g
from lengthwise.doctor.periodicity import Periodicity
from lengthwise.doctor.runlog import InputSummary
from lengthwise.doctor.signals import EvalGap, GradNorm, Schedule, StepTimes


@dataclass(frozen=True)
class Finding(JsonForm):
    """What one analysis claims of a run: a name, a ``score`` (0..1) that ranks it, a one-line
    claim, the figures it rests on (plain data), where in the run, the evidence and the fix.

    >>> Finding(name="loss_spikes", claim="3 one-step loss spike(s)", score=0.26).to_dict()["title"]
    '3 one-step loss spike(s)'
    """

    name: str
    claim: str
    score: float
    figures: dict[str, Any] = field(default_factory=dict)
    where: str = ""
    evidence: list[str] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    kind: str = "cause"  # or "untested": a core test that could not run, and why
    analysis: str = ""  # the registry entry that made it

    JSON = {"cause": "name", "analysis": None, "title": "claim", "score": lambda s: round(s, 3),
            "where": None, "figures": None, "evidence": list, "prescription": ("fix", list)}


@dataclass(frozen=True)
class Verdict(JsonForm):
    """Findings, most likely first; ``clean`` is None when a core test could not run."""

    causes: list[Finding]
    clean: bool | None
    summary: str
    untested: list[str] = field(default_factory=list)

    JSON = {"summary": None, "clean": None, "untested": list, "causes": None}


@dataclass
class Series:
    """The arrays behind the report, kept for plotting (not serialised)."""

    step: np.ndarray
    loss: np.ndarray
    trend: np.ndarray
    region: np.ndarray
    cliff_mask: np.ndarray
    bucket_codes: np.ndarray | None = None
    bucket_names: list[Any] = field(default_factory=list)
    checkpoints: np.ndarray = field(default_factory=lambda: np.zeros(0))
    grad_norm: np.ndarray | None = None
    evals: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))


@dataclass(frozen=True)
class Report(JsonForm):
    """The measurements of one log, the verdict ranked from its findings, and the series."""

    source: str
    input: InputSummary
    context: RunContext
    phases: Phases
    stats: StableStats
    bands: Bands
    periodicity: Periodicity
    cliffs: list[Cliff]
    checkpoint_association: CheckpointAssociation
    epochs: EpochBoundaries
    attribution: Attribution
    noise: Noise | None
    stall: Stall
    skipped: EmptySteps
    grad_norm: GradNorm
    eval_gap: EvalGap
    step_time: StepTimes
    schedule: Schedule
    verdict: Verdict
    series: Series | None = field(default=None, repr=False)

    #: the report's JSON keys and the measurement each holds
    JSON = {"stable_region": "phases", "stats": None, "bands": None, "periodicity": None,
            "cliffs": None, "checkpoint_association": None, "epoch_boundaries": "epochs",
            "attribution": None, "noise": None, "stall": None, "skipped_steps": "skipped",
            "grad_norm": None, "eval_gap": None, "step_time": None, "schedule": None,
            "context": None, "verdict": None, "input": None}

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (no NaN: non-finite numbers become null)."""
        return json.dumps(json_ready(self.to_dict()), indent=indent)


#: top-level keys of ``Report.to_dict()``, in order
REPORT_KEYS: tuple[str, ...] = tuple(Report.JSON)


def rank(findings: list[Finding], loss_roughness: float) -> Verdict:
    """The verdict of a run's findings: its causes by score, what was not tested, whether
    it is clean (None: a core test could not run) and the one-line summary.

    >>> rank([], 0.01).summary
    'clean: no bands, no period, no cliffs (loss_roughness 0.01)'
    """
    causes = sorted((f for f in findings if f.kind == "cause"), key=lambda c: -c.score)
    untested = [f.claim for f in findings if f.kind == "untested"]
    not_tested = f"not tested: {'; '.join(untested)}"
    if causes:
        top = causes[0].claim + (f" -> {causes[0].fix[0]}" if causes[0].fix else "")
        summary = "; ".join([top, *(c.claim for c in causes[1:3])]) + (
            f" ({not_tested})" if untested else "")
    elif untested:
        summary = f"{not_tested}; no cliffs"
    else:
        summary = f"clean: no bands, no period, no cliffs (loss_roughness {loss_roughness:.3g})"
    return Verdict(causes=causes, clean=False if causes else (None if untested else True),
                   summary=summary, untested=untested)


def _input_line(r: Report) -> str:
    i = r.input
    parts = [f"{i.format}, {i.lines:,} lines, {i.loss_rows:,} loss steps"]
    if r.series is not None and r.series.step.size:
        parts[0] += f" ({_g(float(r.series.step[0]), 8)}..{_g(float(r.series.step[-1]), 8)})"
    if i.malformed:
        parts.append(f"{i.malformed} malformed ({', '.join(map(i.place, i.malformed_lines))}"
                     f"{', ...' if i.malformed > len(i.malformed_lines) else ''})")
    for logged in (True, False):
        shown = [p for p in i.restarts if p.logged is logged]
        count = i.logged_resumes if logged else i.restart_count - i.logged_resumes
        if count <= 0:
            continue
        pts = "; ".join(f"{i.place(p.line)}: step {_g(p.step_before, 8)} -> {_g(p.step_after, 8)}"
                        for p in shown[:3])
        what = ("exact resume(s) (a logged `resume` event)" if logged
                else "resume(s) with rollback")
        parts.append(f"{count} {what} ({pts}{', ...' if count > 3 else ''}), "
                     "latest segment kept")
    if i.reordered_rows:
        parts.append(f"rows out of step order (the step went back {i.out_of_order_points} "
                     "time(s) to steps not logged before: not restarts), read in step order "
                     f"({i.reordered_rows} row(s) moved)")
    if i.duplicate_rows:
        parts.append(f"{i.duplicate_rows} duplicate row(s) (a step written again on the next "
                     "row: a second writer), last kept")
    if i.truncated:
        parts.append("file ends in a truncated record")
    if i.constant_step is not None:
        parts.append(f"the step field is {_g(i.constant_step, 8)} on every row (no step "
                     "counter): row index used")
    elif i.step_key == "row index":
        parts.append("no step field: row index used")
    return "; ".join(parts)


def render_text(r: Report) -> str:
    """The full report of one run as text."""
    lines = [f"lengthwise doctor: {r.source}", f"  input        {_input_line(r)}"]
    if r.stall.since is not None:
        lines.append(f"  stall        the loss has not moved since step {_g(r.stall.since, 8)} "
                     f"({r.stall.level:.4g} +/- {r.stall.spread:.2g} over {r.stall.rows} rows)")
    if r.skipped.count:
        lines.append(f"  skipped      {r.skipped.count} step(s) skipped by the trainer, no "
                     f"supervised token (`{r.skipped.field}` 0) at steps "
                     f"{steps_text(r.skipped.first_steps, total=True)}"
                     f"{' ...' if r.skipped.count > 5 else ''}")
    lines.append(f"  phases       {_phases_line(r)}")
    lines.append(f"  context      {_context_line(r)}")
    lines.extend(_stats_lines(r))
    lines.append(f"  bands        {_bands_line(r)}")
    lines.extend(_periodicity_lines(r))
    lines += [f"  {label:<13}{line(r)}" for label, line in (
        ("cliffs", _cliffs_line), ("checkpoints", _checkpoints_line),
        ("grad norm", _grad_norm_line), ("held-out", _eval_line), ("step time", _step_time_line),
        ("schedule", _schedule_line), ("epochs", _epoch_line))]
    lines.extend(_attribution_lines(r))
    lines.extend(_noise_lines(r))
    lines.extend(_verdict_lines(r))
    return "\n".join(lines)


def _schedule_line(r: Report) -> str:
    """The logged learning rate against the configured peak and warm-up."""
    sc = r.schedule
    if sc.logged_peak is None or sc.note:
        return sc.note
    if sc.mismatches:
        return "; ".join(sc.mismatches) + f" ({sc.source})"
    what = " and ".join(w for w, v in (("peak", sc.peak), ("warm-up", sc.warmup)) if v is not None)
    return f"{what} as configured ({sc.source})"


def _step_time_line(r: Report) -> str:
    """Slow steps, their period and cost, and the throughput after each restart."""
    t = r.step_time
    parts = []
    if t.median_seconds is None:
        parts.append(t.note)
    else:
        parts.append(f"median {_g(t.median_seconds, 3)} s ({t.source}); {t.slow} slow step(s)")
        if t.slow:
            parts[-1] += f" costing {t.cost_share:.1%} of the time"
        if t.period is not None:
            parts.append(f"every {_g(t.period, 8)} steps"
                         + (f" ({t.matches})" if t.matches else ""))
    late = t.stragglers
    if late is not None and late.rank is not None:
        parts.append(f"slowest rank {late.rank} of {late.ranks} at {late.slowest_share:.0%} of "
                     f"steps ({late.excess:+.0%} on the median, p={_g(late.p_value, 3)})")
    for step, ratio in t.after_restarts:
        parts.append(f"throughput after the restart at step {_g(step, 8)}: {ratio:.0%} of before")
    return "; ".join(parts)


def _eval_line(r: Report) -> str:
    """The held-out loss's gap to the training loss and where it widens."""
    e = r.eval_gap
    if e.first_gap is None:
        return e.note
    line = (f"{e.evals} evaluations; held-out minus training loss {_g(e.first_gap, 3)} -> "
            f"{_g(e.last_gap, 3)} (smallest {_g(e.min_gap, 3)}; noise {_g(e.noise, 2)})")
    if e.widening:
        line += f"; widens from step {_g(e.widens_from, 8)}"
        if not e.eval_rising:
            line += " (the held-out loss still falls: not over-fitting)"
    if e.eval_rising:
        line += f"; the held-out loss rises from its minimum at step {_g(e.eval_min_step, 8)}"
    return line


def _grad_norm_line(r: Report) -> str:
    """The gradient-norm spikes, their alignment with the loss spikes, clip rate and trend."""
    g = r.grad_norm
    zero = f"norm 0 (no update) at {g.zero_steps} steps ({g.zero_share:.1%})"
    if g.median is None:
        return "; ".join([g.note, zero] if g.zero_steps else [g.note])
    parts = [f"median {_g(g.median)}, {g.spikes} spike(s)"]
    for name, a in (("with a spike at the same step", g.co_spikes),
                    ("after a spike 1-5 points earlier", g.lead)):
        if a.p_value is not None:
            parts.append(f"{a.aligned} of {a.cliffs} loss spikes {name} (p={_g(a.p_value, 3)})")
    if g.clip_rate is not None:
        parts.append(f"clipped at {g.clip_rate:.1%} of {g.logged} logged steps (clip "
                     f"{g.clip:g}, {g.clip_source})")
        if g.clipped_often and all(c.name != "grad_clipped_often" for c in r.verdict.causes):
            parts.append("context, not a cause: no loss spike starts at a clipped step and "
                         "the loss moves")
    if g.zero_steps:
        parts.append(zero)
    if g.rise is not None:
        parts.append(f"trend x{_g(g.rise, 3)} (Kendall p={_g(g.trend_p, 3)})")
    if g.note:
        parts.append(g.note)
    return "; ".join(parts)


def _phases_line(r: Report) -> str:
    """The warm-up end and the stable region."""
    p, st = r.phases, r.stats
    warm = ("no warm-up found" if p.warmup_end is None
            else f"warm-up ends at step {_g(p.warmup_end, 8)} (from {p.warmup_source})")
    return (f"{warm}; stable region {_g(p.start, 8)}..{_g(p.end, 8)} "
            f"({p.chosen_by}; {p.points:,} points, {st.cliff_points} cliff points left out)")


def _stats_lines(r: Report) -> list[str]:
    """The stable region's statistics, and the non-finite losses if any."""
    st = r.stats
    lines = [f"  stats        mean {_g(st.mean)}  median {_g(st.median)}  std {_g(st.std)}  "
             f"min {_g(st.min)}  max {_g(st.max)}  loss_roughness {_g(st.loss_roughness)}"
             + (f"  (corrected_loss: {_g(st.corrected_roughness)})"
                if st.corrected_roughness is not None else "")]
    nf = st.nonfinite
    if nf.count:
        lines.append(f"  non-finite   {nf.count} NaN/inf loss(es) at steps "
                     f"{steps_text(nf.first_steps, total=True)}"
                     + (f"; diverged at step {_g(nf.diverged_at, 8)}" if nf.diverged_at else ""))
    return lines


def _bands_line(r: Report) -> str:
    """The bands found, or why there are none."""
    b = r.bands
    if b.count is None:
        return b.note
    if b.count > 1:
        centres = ", ".join(f"{_g(c)} ({s:.0%})" for c, s in zip(b.centres, b.shares, strict=True))
        return (f"{b.count} bands at {centres}; Silverman test "
                f"p={_g(b.p_value, 3)} against {b.count - 1}; separation "
                f"{_g(b.separation, 3)} widths")
    return (f"none: unimodal (Silverman test p={_g(b.p_value, 3)})"
            + (f"; {b.note}" if b.note else ""))


def _periodicity_lines(r: Report) -> list[str]:
    """The period found (or the strongest candidate), and the runs test if computed."""
    per = r.periodicity
    if per.p_value is None:
        lines = [f"  periodicity  {per.note}"]
    elif per.period is not None:
        lines = [f"  periodicity  period {with_error(per.period, per.period_error)} steps "
                 f"(p={_g(per.p_value, 3)}, "
                 f"{_g((per.power_share or 0) * 100, 3)}% of detrended variance, "
                 f"autocorrelation {_g(per.acf_at_period, 3)})"]
    else:
        lines = [f"  periodicity  none (strongest candidate {_g(per.best_period)} steps, "
                 f"p={_g(per.p_value, 3)})"]
    if per.period is not None and per.test.startswith("predicted"):
        lines.append(f"               {per.test}")
    gated = [part for part in per.note.split("; ") if "fails the AR(1) surrogate" in part]
    if per.period is None and gated:
        lines.append(f"               {gated[0]}")
    if per.runs is not None:
        ru = per.runs
        lines.append(f"  runs         {ru.runs:,} runs of high/low steps vs {_g(ru.expected, 6)} "
                     f"expected (z={_g(ru.z, 3)}); mean run {_g(ru.mean_low, 3)} low, "
                     f"{_g(ru.mean_high, 3)} high; longest {ru.max_low} low, {ru.max_high} high")
    return lines


def _cliffs_line(r: Report) -> str:
    """The first six cliffs with their heights and recoveries."""
    if not r.cliffs:
        return "none"
    shown = "; ".join(
        f"step {_g(c.step, 8)} +{_g(c.height, 3)}"
        + (f" (recovered in {_g(c.recovery_steps, 6)})" if c.recovery_steps is not None
           else " (no recovery)")
        for c in r.cliffs[:6])
    more = f"; ... ({len(r.cliffs)} in all)" if len(r.cliffs) > 6 else ""
    return f"{len(r.cliffs)}: {shown}{more}"


def _checkpoints_line(r: Report) -> str:
    """The checkpoint association test, or why it was not run."""
    ck = r.checkpoint_association
    if ck.associated is None:
        return f"{ck.checkpoints} known; not tested: {ck.note}"
    verdict = "associated" if ck.associated else "not associated"
    return (f"{ck.checkpoints} ({ck.source}); {ck.aligned} of {ck.cliffs} "
            f"cliffs start within {_g(ck.window[0])}..+{_g(ck.window[1])} steps of one "
            f"({_g(ck.expected_aligned, 3)} expected); permutation p={_g(ck.p_value, 3)}"
            f" -> {verdict}")


def _noise_lines(r: Report) -> list[str]:
    """The noise budget summary and the sampling floor."""
    noise = r.noise.summary if r.noise is not None else "not computed: too few points"
    lines = [f"  noise        {noise}"]
    if r.noise is not None and r.noise.excess is not None:
        lines.append(f"               sampling floor {_g(r.noise.sampling_floor, 3)}; "
                     f"loss_roughness is {_g(r.noise.excess, 3)}x it")
    return lines


def _verdict_lines(r: Report) -> list[str]:
    """The verdict: each cause with its evidence and fixes, or the clean summary."""
    v = r.verdict
    lines = ["verdict"]
    if not v.causes:
        lines.append(f"  {v.summary}")
        return lines
    for n, c in enumerate(v.causes, 1):
        lines.append(f"  {n}. {c.claim}  [score {c.score:.2f}]")
        if c.where:
            lines.append(f"     where: {c.where}")
        lines.extend(f"     evidence: {e}" for e in c.evidence)
        lines.extend(f"     fix: {f}" for f in c.fix)
    if v.untested:
        lines.append(f"  not tested: {'; '.join(v.untested)}")
    return lines


def _context_line(r: Report) -> str:
    c = r.context
    parts = []
    if c.steps_per_epoch is not None:
        parts.append(f"{_g(c.steps_per_epoch, 5)} steps per epoch ({c.steps_per_epoch_source})")
    elif c.epoch_logged:
        parts.append("steps per epoch unknown: the logged `epoch` spans less than one whole "
                     "epoch (pass --steps-per-epoch N)")
    else:
        parts.append("steps per epoch unknown (log `epoch` or pass --steps-per-epoch)")
    parts += [text for known, text in (
        (c.batch_size, f"batch {c.batch_size}"),
        (c.world_size, f"world size {c.world_size} ({c.world_size_source})"),
        (c.epoch_resets, f"{len(c.epoch_resets)} resume(s) (epoch field fell back)"),
        (c.checkpoint_every, f"checkpoint every {_g(c.checkpoint_every, 6)}"),
        (c.lr_restarts, f"{len(c.lr_restarts)} lr restart(s)")) if known]
    return "; ".join(parts)


def _epoch_line(r: Report) -> str:
    e = r.epochs
    if e.found is None:
        return f"not tested: {e.note}"
    drops = ", ".join(f"{d:+.3g} at {_g(s, 8)}" for d, s in zip(e.drops[:4], e.starts[:4],
                                                                  strict=True))
    word = "step-down at epoch starts" if e.found else "no significant step at epoch starts"
    return f"{word} (placebo p={_g(e.p_value, 3)}; {drops})"


def _attribution_lines(r: Report) -> list[str]:
    a = r.attribution
    out = []
    if a.bucket_r2 is not None:
        per = ", ".join(f"{row['bucket']}: {_g(row['mean_loss'])}" for row in a.per_bucket[:8])
        out.append(f"  attribution  `{a.bucket_field}` explains {a.bucket_r2:.0%} of the "
                   f"step-to-step variance (R^2, permutation p={_g(a.bucket_p_value, 3)}); "
                   f"mean loss per bucket: {per}")
    elif a.note:
        out.append(f"  attribution  {a.note}")
    if a.length_r2 is not None:
        out.append(f"  attribution  `{a.length_field}` explains {a.length_r2:.0%} "
                   f"(eta^2 over deciles, p={_g(a.length_p_value, 3)})")
    out.extend(_levels_lines(a.levels))
    if not out:
        if a.likely_cause:
            out.append(f"  attribution  no bucket or length logged; likely cause: {a.likely_cause}")
            out.extend(f"               log: {t}" for t in a.to_log)
        else:
            out.append("  attribution  no bucket or length field logged")
    return out


def _levels_lines(lv: BucketLevels | None) -> list[str]:
    """The length ranges' levels of a per-micro-batch log (none for a step log)."""
    if lv is None:
        return []
    if lv.p_value is None:
        return [f"  levels       {lv.note}"]
    ranges = ", ".join(f"{r['lengths'] or r['buckets']}: {_g(r['mean_offset'], 3)}"
                       for r in lv.ranges)
    found = "levels found" if lv.found else "no levels at 0.01"
    return [f"  levels       {len(lv.ranges)} length ranges explain {lv.share or 0.0:.0%} of "
            f"the line-to-line variance ({lv.chance or 0.0:.0%} by chance; shuffles "
            f"p={_g(lv.p_value, 3)}, {found}); offset from the trend per range: {ranges}"
            + (f"; {lv.note}" if lv.note else "")]


def render_comparison(reports: dict[str, Report]) -> str:
    """Several runs side by side: one column per run."""
    names = list(reports)
    yes_no = {True: "yes", False: "no", None: "-"}
    rows = [(label, [cell(r) for r in reports.values()]) for label, cell in (
        ("steps", lambda r: f"{r.input.loss_rows:,}"),
        ("stable region", lambda r: f"{_g(r.phases.start, 8)}..{_g(r.phases.end, 8)}"),
        ("mean loss", lambda r: _g(r.stats.mean)),
        ("loss_roughness", lambda r: _g(r.stats.loss_roughness)),
        ("bands", lambda r: "not tested" if r.bands.count is None
         else "none" if r.bands.count <= 1 else str(r.bands.count)),
        ("period (steps)", lambda r: "not tested" if r.periodicity.p_value is None
         else _g(r.periodicity.period) if r.periodicity.period else "none"),
        ("cliffs", lambda r: str(len(r.cliffs))),
        ("at checkpoints", lambda r: yes_no[r.checkpoint_association.associated] + (
            f" (p={_g(r.checkpoint_association.p_value, 2)})"
            if r.checkpoint_association.p_value is not None else "")),
        ("bucket R^2", lambda r: _g(r.attribution.bucket_r2, 3)),
        ("non-finite", lambda r: str(r.stats.nonfinite.count)),
        ("epoch step-down", lambda r: yes_no[r.epochs.found]),
        ("noise excess", lambda r: _g(r.noise.excess, 3) if r.noise is not None else "-"),
        ("top cause", lambda r: r.verdict.causes[0].name if r.verdict.causes
         else {True: "clean", None: "not tested", False: "-"}[r.verdict.clean]))]
    short = [n if len(n) <= 36 else "..." + n[-33:] for n in names]
    widths = [max(len(s), *(len(v[i]) for _, v in rows)) for i, s in enumerate(short)]
    label_w = max(len(lbl) for lbl, _ in rows)
    out = ["  ".join([" " * label_w, *(s.ljust(w) for s, w in zip(short, widths, strict=True))])]
    for label, values in rows:
        out.append("  ".join([label.ljust(label_w),
                              *(v.ljust(w) for v, w in zip(values, widths, strict=True))]))
    out.append("")
    for name, r in reports.items():
        out.append(f"{name}: {r.verdict.summary}")
    return "\n".join(line.rstrip() for line in out)
