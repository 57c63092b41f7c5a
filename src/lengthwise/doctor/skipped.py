"""Steps the trainer skipped because they held nothing to learn from (not divergence).

lengthwise's training loop applies no update in a step whose micro-batches hold
no supervised token, and logs it ``"skipped": true`` with a NaN (or null) loss; the
DFlash recipe also logs ``"slots": 0`` (no draft slot supervised). Such a loss is
the trainer's word that the step was empty, not a loss that went non-finite, so
these rows are counted here and left out of the non-finite losses. A skipped row
with a NaN loss is read as empty only when it says so (``slots`` or
``real_tokens`` 0): a step the spike guard skipped keeps its NaN in the
non-finite count.

Example::

    >>> import numpy as np
    >>> s, _ = empty_steps(np.arange(1.0, 5.0), np.array([2.0, np.nan, 1.9, np.nan]),
    ...                 {"skipped": np.array([0.0, 1.0, 0.0, 1.0]),
    ...                  "slots": np.array([9.0, 0.0, 9.0, 5.0])})
    >>> s.count, s.first_steps, s.field
    (1, [2.0], 'slots')
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numbers import num

__all__ = ["EmptySteps", "empty_mask", "empty_steps"]

#: the fields that say a step held nothing supervised (0), in the order they are trusted
EMPTY_FIELDS: tuple[str, ...] = ("slots", "real_tokens")


@dataclass(frozen=True)
class EmptySteps:
    """Steps skipped by the trainer because they held no supervised token."""

    count: int = 0
    rows: int = 0
    first_steps: list[float] = field(default_factory=list)
    #: the field that showed each step empty (``slots`` or ``real_tokens``)
    field: str | None = None

    @property
    def share(self) -> float:
        """Skipped empty steps over logged steps."""
        return self.count / self.rows if self.rows else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``skipped_steps`` key of the report)."""
        return {"count": self.count, "share": round(self.share, 6),
                "first_steps": [num(s) for s in self.first_steps], "field": self.field}


def empty_mask(loss: np.ndarray, columns: dict[str, np.ndarray]) -> tuple[np.ndarray, str | None]:
    """Rows logged skipped, with a non-finite loss and 0 in an :data:`EMPTY_FIELDS` field."""
    out = np.zeros(loss.size, dtype=bool)
    skipped = columns.get("skipped")
    if skipped is None:
        return out, None
    flagged = (skipped == 1.0) & ~np.isfinite(loss)
    for name in EMPTY_FIELDS:
        col = columns.get(name)
        if col is not None and flagged.any():
            hit = flagged & (col == 0)
            if hit.any():
                return hit, name
    return out, None


def empty_steps(step: np.ndarray, loss: np.ndarray,
                columns: dict[str, np.ndarray]) -> tuple[EmptySteps, np.ndarray]:
    """The :class:`EmptySteps` of a log (its steps, losses and columns) and their row mask."""
    mask, name = empty_mask(loss, columns)
    idx = np.flatnonzero(mask)
    return EmptySteps(count=int(idx.size), rows=int(step.size),
                      first_steps=[float(s) for s in step[idx[:5]]], field=name), mask
