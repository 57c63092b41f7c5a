"""The doctor's report: the types of its findings and verdict, and their JSON form.

Types only: :class:`Cause`, :class:`Verdict`, :class:`Findings` (every analysis
of one run) and :class:`Report` (the findings, the verdict built from them by
:func:`lengthwise.doctor.verdict.build_verdict`, and the arrays for plotting).
``Report.to_dict()`` has the keys of :data:`REPORT_KEYS`; docs/doctor.md
documents each field.

Example::

    >>> v = Verdict(causes=[], clean=None, summary="not tested", untested=["bands"])
    >>> v.to_dict()["clean"] is None
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.doctor.attribution import Attribution
from lengthwise.doctor.bands import Bands
from lengthwise.doctor.checkpoints import CheckpointAssociation
from lengthwise.doctor.cliffs import Cliff
from lengthwise.doctor.context import RunContext
from lengthwise.doctor.epochs import EpochBoundaries
from lengthwise.doctor.evalgap import EvalGap
from lengthwise.doctor.gradnorm import GradNorm
from lengthwise.doctor.noise import Noise
from lengthwise.doctor.numbers import json_ready
from lengthwise.doctor.periodicity import Periodicity
from lengthwise.doctor.phases import Phases
from lengthwise.doctor.runlog import InputSummary
from lengthwise.doctor.schedule import Schedule
from lengthwise.doctor.skipped import EmptySteps
from lengthwise.doctor.stall import Stall
from lengthwise.doctor.stats import StableStats
from lengthwise.doctor.steptime import StepTimes

#: top-level keys of ``Report.to_dict()``, in order
REPORT_KEYS: tuple[str, ...] = (
    "stable_region",
    "stats",
    "bands",
    "periodicity",
    "cliffs",
    "checkpoint_association",
    "epoch_boundaries",
    "attribution",
    "noise",
    "stall",
    "skipped_steps",
    "grad_norm",
    "eval_gap",
    "step_time",
    "schedule",
    "context",
    "verdict",
    "input",
)


@dataclass(frozen=True)
class Cause:
    """One likely cause: what was found, where in the run, the evidence and the fix."""

    name: str
    title: str
    score: float
    evidence: list[str] = field(default_factory=list)
    prescription: list[str] = field(default_factory=list)
    where: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "cause": self.name,
            "title": self.title,
            "score": round(self.score, 3),
            "where": self.where,
            "evidence": list(self.evidence),
            "prescription": list(self.prescription),
        }


@dataclass(frozen=True)
class Verdict:
    """Causes, most likely first; ``clean`` is None when a core test could not run."""

    causes: list[Cause]
    clean: bool | None
    summary: str
    untested: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``verdict`` key of the report)."""
        return {
            "summary": self.summary,
            "clean": self.clean,
            "untested": list(self.untested),
            "causes": [c.to_dict() for c in self.causes],
        }


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
class Findings:
    """Every analysis of one run, each built once and complete."""

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
    stall: Stall = field(default_factory=lambda: Stall(since=None))
    skipped: EmptySteps = field(default_factory=EmptySteps)
    grad_norm: GradNorm = field(default_factory=GradNorm)
    eval_gap: EvalGap = field(default_factory=EvalGap)
    step_time: StepTimes = field(default_factory=StepTimes)
    schedule: Schedule = field(default_factory=Schedule)


@dataclass(frozen=True)
class Report(Findings):
    """The findings of one log, their verdict, and the series for plots."""

    verdict: Verdict = field(default_factory=lambda: Verdict([], None, ""))
    series: Series | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys."""
        return {
            "stable_region": self.phases.to_dict(),
            "stats": self.stats.to_dict(),
            "bands": self.bands.to_dict(),
            "periodicity": self.periodicity.to_dict(),
            "cliffs": [c.to_dict() for c in self.cliffs],
            "checkpoint_association": self.checkpoint_association.to_dict(),
            "epoch_boundaries": self.epochs.to_dict(),
            "attribution": self.attribution.to_dict(),
            "noise": None if self.noise is None else self.noise.to_dict(),
            "stall": self.stall.to_dict(),
            "skipped_steps": self.skipped.to_dict(),
            "grad_norm": self.grad_norm.to_dict(),
            "eval_gap": self.eval_gap.to_dict(),
            "step_time": self.step_time.to_dict(),
            "schedule": self.schedule.to_dict(),
            "context": self.context.to_dict(),
            "verdict": self.verdict.to_dict(),
            "input": self.input.to_dict(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (no NaN: non-finite numbers become null)."""
        return json.dumps(json_ready(self.to_dict()), indent=indent)

    def one_line(self) -> str:
        """The verdict's one-line summary (the same line everywhere)."""
        return self.verdict.summary
