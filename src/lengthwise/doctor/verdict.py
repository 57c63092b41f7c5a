"""Verdict: the likely causes of what the analyses found, ranked, with evidence and a fix.

Each cause gets a score in [0, 1] from the size of its effect (share of
variance explained, share of cliffs at checkpoints, ...), and the causes are
listed by score. :func:`one_line_verdict` condenses a report into one line.

Example::

    >>> v = Verdict(causes=[])
    >>> v.summary
    'clean: no bands, no period, no cliffs'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lengthwise.doctor.report import Report

#: cliffs whose median recovery takes at most this many logged points are one-step spikes
QUICK_RECOVERY = 2
STRATIFY = "interleave or stratify length buckets: `lengthwise plan --order stratified`"


@dataclass
class Cause:
    """One likely cause with its evidence and prescriptions."""

    name: str
    title: str
    score: float
    evidence: list[str] = field(default_factory=list)
    prescription: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "cause": self.name,
            "title": self.title,
            "score": round(self.score, 3),
            "evidence": self.evidence,
            "prescription": self.prescription,
        }


@dataclass
class Verdict:
    """Causes, most likely first, and a one-line summary."""

    causes: list[Cause]
    summary: str = ""

    def __post_init__(self) -> None:
        self.causes.sort(key=lambda c: -c.score)
        if not self.summary:
            self.summary = (
                "; ".join(c.title for c in self.causes[:3])
                if self.causes
                else "clean: no bands, no period, no cliffs"
            )

    @property
    def clean(self) -> bool:
        """True when nothing was found."""
        return not self.causes

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``verdict`` key of the report)."""
        return {
            "summary": self.summary,
            "clean": self.clean,
            "causes": [c.to_dict() for c in self.causes],
        }


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _steps(values: list[float], limit: int = 5) -> str:
    shown = ", ".join(_fmt(v) for v in values[:limit])
    return shown + (f" (+{len(values) - limit} more)" if len(values) > limit else "")


def build_verdict(report: Report) -> Verdict:
    """Rank the causes behind the findings of ``report``."""
    causes: list[Cause] = []
    nf = report.stats.nonfinite if report.stats is not None else None
    if nf is not None and nf.count:
        diverged = nf.diverged_at is not None
        causes.append(
            Cause(
                name="nonfinite_loss",
                title=(f"loss diverged to NaN/inf at step {_fmt(nf.diverged_at)}" if diverged
                       else f"{nf.count} NaN/inf loss value(s)"),
                score=1.0 if diverged else 0.6,
                evidence=[f"{nf.count} non-finite losses ({nf.nan} NaN, {nf.inf} inf), first at "
                          f"steps {_steps(nf.first_steps)}"],
                prescription=[
                    "lower the learning rate after warm-up and clip gradients (e.g. max norm 1.0)",
                    "with fp16, use bf16 or a dynamic loss scaler; check the batches at those "
                    "steps for empty or corrupt samples",
                ],
            )
        )
    causes.extend(_composition_causes(report))
    causes.extend(_cliff_causes(report))
    if report.input.restart_count:
        pts = [r.step_after for r in report.input.restarts]
        causes.append(
            Cause(
                name="restarts",
                title=f"{report.input.restart_count} restart(s) in the log",
                score=0.1,
                evidence=[f"steps went back at line(s) "
                          f"{_steps([float(r.line) for r in report.input.restarts])} "
                          f"(to steps {_steps(pts)}); the latest segment was kept, "
                          f"{report.input.superseded_rows} superseded row(s) dropped"],
                prescription=["check that resuming restores the optimizer, scheduler and "
                              "data-loader position (the batch order)"],
            )
        )
    return Verdict(causes=causes)


def _composition_causes(report: Report) -> list[Cause]:
    out: list[Cause] = []
    bands, per, attr = report.bands, report.periodicity, report.attribution
    banded = bands is not None and bands.count is not None and bands.count > 1
    periodic = per is not None and per.period is not None
    logged = attr.bucket_r2 is not None or attr.length_r2 is not None
    attr_ev = []
    if attr.bucket_r2 is not None:
        attr_ev.append(f"the bucket explains {attr.bucket_r2:.0%} of the step-to-step variance "
                       f"(R^2, permutation p={_fmt(attr.bucket_p_value or 1.0)})")
    if attr.length_r2 is not None:
        attr_ev.append(f"sequence length explains {attr.length_r2:.0%} of it "
                       f"(eta^2 over deciles, p={_fmt(attr.length_p_value or 1.0)})")
    confirm = [] if logged else ["log `bucket` (and `real_tokens`, `samples`) per step to confirm"]
    if banded:
        assert bands is not None
        centres = ", ".join(f"{c:.4g} ({s:.0%})" for c, s in zip(bands.centres, bands.shares,
                                                                   strict=True))
        score = bands.between_share or 0.0
        if attr.bucket_r2 is not None:
            score = max(score, attr.bucket_r2)
        explained = attr.explains or not logged
        title = (f"{bands.count} loss bands: each step's batch comes from one length bucket"
                 if explained else f"{bands.count} loss bands (not explained by the logged bucket)")
        out.append(
            Cause(
                name="single_bucket_batches" if explained else "bands_unexplained",
                title=title,
                score=score if explained else 0.5 * score,
                evidence=[f"per-step loss is multimodal: {bands.count} bands at {centres}; "
                          f"Silverman test p={_fmt(bands.p_value or 0.0)} against "
                          f"{bands.count - 1} band(s)", *attr_ev],
                prescription=[STRATIFY, "log per-bucket loss (`bucket_loss`) to follow each "
                              "length range", *confirm] if explained else
                ["find the step feature that splits the bands (data source, task, "
                 "packing) and log it"],
            )
        )
    if periodic:
        assert per is not None
        runs = per.runs
        ev = [f"the detrended loss repeats every {_fmt(per.period or 0)} steps "
              f"(p={_fmt(per.p_value or 0)}, {(per.power_share or 0):.0%} of its variance)"]
        if runs is not None and runs.z < 0 and runs.p_value < 0.01:
            ev.append(f"low/high steps come in runs (mean {runs.mean_low:.3g}/{runs.mean_high:.3g}"
                      f" steps, runs test z={runs.z:.3g})")
        out.append(
            Cause(
                name="sorted_batches_cycle",
                title=f"loss cycles every {_fmt(per.period or 0)} steps: batches sorted by length "
                "within mega-batches (e.g. group_by_length)",
                score=min(1.0, 2.0 * (per.power_share or 0.0)),
                evidence=ev + ([] if banded else attr_ev),
                prescription=[
                    "draw batches in random or stratified order instead of sorted runs: "
                    "`lengthwise plan --order stratified`",
                    *([] if banded else confirm),
                ],
            )
        )
    if not banded and not periodic and attr.bucket_explains:
        out.append(
            Cause(
                name="composition_noise",
                title="the length bucket of each step drives its loss (no distinct bands)",
                score=attr.bucket_r2 or 0.0,
                evidence=attr_ev,
                prescription=[STRATIFY],
            )
        )
    return out


def _cliff_causes(report: Report) -> list[Cause]:
    cliffs, ck = report.cliffs, report.checkpoint_association
    if not cliffs:
        return []
    out: list[Cause] = []
    steps = [c.step for c in cliffs]
    heights = ", ".join(f"+{c.height:.3g}" for c in cliffs[:5])
    rec = [c.recovery_steps for c in cliffs if c.recovery_steps is not None]
    rec_txt = f", recovering in {_fmt(sorted(rec)[len(rec) // 2])} steps (median)" if rec else ""
    base_ev = f"{len(cliffs)} cliff(s) at steps {_steps(steps)} (heights {heights}){rec_txt}"
    if ck.associated:
        ev = [base_ev, f"{ck.aligned} of {ck.cliffs} start right after one of {ck.checkpoints} "
              f"checkpoints (expected {ck.expected_aligned:.2g} by chance; "
              f"permutation p={_fmt(ck.p_value or 0)})"]
        if ck.throughput_ratio is not None and ck.throughput_ratio < 0.9:
            ev.append(f"throughput right after saves is {ck.throughput_ratio:.0%} of normal")
        out.append(
            Cause(
                name="checkpoint_disruption",
                title="loss spikes at checkpoint saves",
                score=min(1.0, 0.4 + 0.6 * ck.aligned / max(ck.cliffs, 1)),
                evidence=ev,
                prescription=[
                    "move checkpoint saves off the training thread (asynchronous save)",
                    "check that saving does not reset the data loader, RNG or optimizer state "
                    "(a save that restarts workers re-reads the start of the epoch)",
                ],
            )
        )
        rest = [c for c in cliffs if not c.at_checkpoint]
        if len(rest) < 2:
            return out
        cliffs = rest
        steps = [c.step for c in cliffs]
        base_ev = f"{len(cliffs)} other cliff(s) at steps {_steps(steps)}"
    never = [c for c in cliffs if c.recovery_steps is None]
    if never:
        c0 = never[0]
        out.append(
            Cause(
                name="divergence",
                title=f"loss jumped at step {_fmt(c0.step)} and never came back to its level",
                score=0.9,
                evidence=[f"+{c0.height:.3g} above the level {c0.level:.4g} before it, still "
                          "above it at the end of the log"],
                prescription=[
                    "lower the learning rate (or lengthen warm-up) and clip gradients",
                    "with fp16, use bf16 or a dynamic loss scaler; resume from the last good "
                    "checkpoint with a lower learning rate",
                ],
            )
        )
        cliffs = [c for c in cliffs if c.recovery_steps is not None]
        if not cliffs:
            return out
        steps = [c.step for c in cliffs]
        heights = ", ".join(f"+{c.height:.3g}" for c in cliffs[:5])
        base_ev = f"{len(cliffs)} cliff(s) at steps {_steps(steps)} (heights {heights})"
    ev = [base_ev]
    if ck.associated is False:
        ev.append(f"they do not line up with the {ck.checkpoints} checkpoints: {ck.aligned} of "
                  f"{ck.cliffs} near one, {ck.expected_aligned:.2g} expected by chance "
                  f"(permutation p={_fmt(ck.p_value or 1)})")
    elif ck.associated is None and ck.checkpoints == 0:
        ev.append("no checkpoint steps known: log checkpoint events or pass --checkpoint-every N "
                  "to test them against saves")
    buckets = [str(c.bucket) for c in cliffs if c.bucket is not None]
    if len(buckets) >= 3:
        common = max(set(buckets), key=buckets.count)
        share = buckets.count(common) / len(buckets)
        if share >= 0.6:
            ev.append(f"{share:.0%} of the cliffs are in bucket {common}")
    points = sorted(c.recovery_points or 0 for c in cliffs)
    quick = points[len(points) // 2] <= QUICK_RECOVERY
    unexplained = " not explained by checkpoints" if ck.associated is False else ""
    if quick:
        ev.append("they recover at the next logged step or the one after: single batches "
                  "that are hard for the model, not an unstable optimizer")
        title = f"{len(cliffs)} one-step loss spike(s){unexplained}: hard or unusual batches"
        fixes = [
            "log sample ids per step and inspect the batches at the spike steps (very long, "
            "repeated, truncated or corrupt samples); the same steps spiking in another run "
            "with the same data order confirms it",
            "clip gradients so that such batches cannot move the weights far",
        ]
        score = min(0.6, 0.2 + 0.02 * len(cliffs))
    else:
        title = (f"{len(cliffs)} loss spike(s){unexplained} with slow recovery: "
                 "unstable optimization")
        fixes = [
            "lower the learning rate after warm-up or clip gradients harder",
            "log sample ids per step and inspect the batches at the cliff steps",
        ]
        score = min(0.9, 0.35 + 0.05 * len(cliffs))
    out.append(Cause(name="loss_spikes", title=title, score=score, evidence=ev,
                     prescription=fixes))
    return out


def one_line_verdict(report: Report) -> str:
    """One line saying what the loss curve shows and what to do first.

    Example: ``"3 loss bands: each step's batch comes from one length bucket -> interleave or
    stratify length buckets: `lengthwise plan --order stratified`; 4 loss spike(s) not
    explained by checkpoints (p=0.62)"``.
    """
    v = report.verdict
    if v is None or v.clean:
        r = report.stats.loss_roughness if report.stats is not None else float("nan")
        return f"clean: no bands, no period, no cliffs (loss_roughness {r:.3g})"
    parts = []
    for i, c in enumerate(v.causes[:3]):
        text = c.title
        if c.name == "loss_spikes" and report.checkpoint_association.p_value is not None:
            text += f" (p={report.checkpoint_association.p_value:.2g})"
        if i == 0 and c.prescription:
            text += f" -> {c.prescription[0]}"
        parts.append(text)
    return "; ".join(parts)
