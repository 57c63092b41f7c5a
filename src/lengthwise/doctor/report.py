"""The doctor's report: every finding of one run, and its JSON form.

``Report.to_dict()`` has the keys ``stable_region``, ``stats``, ``bands``,
``periodicity``, ``cliffs``, ``checkpoint_association``, ``attribution``,
``verdict`` and ``input`` (what reading the log found); docs/doctor.md
documents each field.

Example::

    >>> from lengthwise.doctor import diagnose
    >>> rows = [{"step": i, "loss": 2.0 + (i % 2) * 0.01} for i in range(300)]
    >>> sorted(diagnose(rows).to_dict())[:3]
    ['attribution', 'bands', 'checkpoint_association']
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
from lengthwise.doctor.periodicity import Periodicity
from lengthwise.doctor.phases import Phases
from lengthwise.doctor.runlog import InputSummary
from lengthwise.doctor.stats import StableStats
from lengthwise.doctor.verdict import Verdict

#: top-level keys of ``Report.to_dict()``, in order
REPORT_KEYS: tuple[str, ...] = (
    "stable_region",
    "stats",
    "bands",
    "periodicity",
    "cliffs",
    "checkpoint_association",
    "attribution",
    "verdict",
    "input",
)


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


@dataclass
class Report:
    """All findings for one log."""

    source: str
    input: InputSummary
    phases: Phases
    stats: StableStats
    bands: Bands
    periodicity: Periodicity
    cliffs: list[Cliff]
    checkpoint_association: CheckpointAssociation
    attribution: Attribution
    verdict: Verdict | None = None
    series: Series | None = field(default=None, repr=False)

    @property
    def stable_region(self) -> Phases:
        """Alias of ``phases``: the stable region and warm-up."""
        return self.phases

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys."""
        return {
            "stable_region": self.phases.to_dict(),
            "stats": self.stats.to_dict(),
            "bands": self.bands.to_dict(),
            "periodicity": self.periodicity.to_dict(),
            "cliffs": [c.to_dict() for c in self.cliffs],
            "checkpoint_association": self.checkpoint_association.to_dict(),
            "attribution": self.attribution.to_dict(),
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "input": self.input.to_dict(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (no NaN: non-finite numbers become null)."""
        return json.dumps(_finite(self.to_dict()), indent=indent)

    def one_line(self) -> str:
        """Same as :func:`lengthwise.doctor.one_line_verdict`."""
        from lengthwise.doctor.verdict import one_line_verdict

        return one_line_verdict(self)


def _finite(obj: Any) -> Any:
    """Replace NaN/inf floats by None and numpy scalars by Python numbers, recursively."""
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj
