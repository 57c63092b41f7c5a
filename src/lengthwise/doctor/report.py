"""The doctor's report: the types of its findings and verdict, and their JSON form.

Types only: :class:`Finding` (what one analysis claims), :class:`Verdict` (the
findings ranked, see :func:`lengthwise.doctor.render.rank`) and :class:`Report`
(every measurement of one run, its verdict, and the arrays for plotting).
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
from lengthwise.doctor.stall import Stall
from lengthwise.doctor.stats import EmptySteps, StableStats
from lengthwise.doctor.steptime import StepTimes


@dataclass(frozen=True)
class Finding:
    """What one analysis claims of a run: a name, a severity, the figures it rests on and a
    one-line claim, with where in the run, the evidence and the fix.

    ``score`` (0..1) ranks the causes of a run; ``figures`` holds plain data only.

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

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (one entry of the verdict's ``causes``)."""
        return {"cause": self.name, "analysis": self.analysis, "title": self.claim,
                "score": round(self.score, 3), "where": self.where, "figures": self.figures,
                "evidence": list(self.evidence), "prescription": list(self.fix)}


@dataclass(frozen=True)
class Verdict:
    """Findings, most likely first; ``clean`` is None when a core test could not run."""

    causes: list[Finding]
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


#: the report's JSON keys and the measurement each holds
_JSON_FIELDS = {"stable_region": "phases", "stats": "stats", "bands": "bands",
                "periodicity": "periodicity", "cliffs": "cliffs",
                "checkpoint_association": "checkpoint_association",
                "epoch_boundaries": "epochs", "attribution": "attribution", "noise": "noise",
                "stall": "stall", "skipped_steps": "skipped", "grad_norm": "grad_norm",
                "eval_gap": "eval_gap", "step_time": "step_time", "schedule": "schedule",
                "context": "context", "verdict": "verdict", "input": "input"}


@dataclass(frozen=True)
class Report:
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys (:data:`REPORT_KEYS`)."""
        out: dict[str, Any] = {}
        for key, name in _JSON_FIELDS.items():
            value = getattr(self, name)
            out[key] = (None if value is None else [c.to_dict() for c in value]
                        if isinstance(value, list) else value.to_dict())
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (no NaN: non-finite numbers become null)."""
        return json.dumps(json_ready(self.to_dict()), indent=indent)


#: top-level keys of ``Report.to_dict()``, in order
REPORT_KEYS: tuple[str, ...] = tuple(_JSON_FIELDS)
