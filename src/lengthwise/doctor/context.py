"""What the doctor knows of a run's mechanisms: epoch length, batch, saves, schedule restarts.

A period in the loss is evidence of a mechanism only when its length matches
one (:mod:`lengthwise.doctor.mechanisms`); these are the lengths it is matched
against. Steps per epoch come from ``--steps-per-epoch``, else from the logged
``epoch`` field (the inverse of its slope over steps); learning-rate restarts
are jumps of the logged ``lr`` by at least a fifth of its peak.

Example::

    >>> import numpy as np
    >>> steps = np.arange(1.0, 1001.0)
    >>> ctx = run_context(steps, {"epoch": steps / 250.0})
    >>> ctx.steps_per_epoch, ctx.steps_per_epoch_source
    (250.0, 'epoch field')
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numbers import num
from lengthwise.errors import ConfigError

#: an lr rise of at least this fraction of the peak between two logged steps is a restart
RESTART_FRACTION = 0.2


@dataclass(frozen=True)
class RunContext:
    """Lengths of the run's known mechanisms, in steps (None: unknown)."""

    first_step: float
    last_step: float
    interval: float
    steps_per_epoch: float | None = None
    steps_per_epoch_source: str | None = None
    epoch_starts: list[float] = field(default_factory=list)
    batch_size: int | None = None
    checkpoint_every: float | None = None
    checkpoint_source: str | None = None
    eval_every: float | None = None
    lr_restarts: list[float] = field(default_factory=list)
    order: str | None = None  # the batch order the run uses (its log's ``plan`` event)

    @property
    def run_steps(self) -> float:
        """Steps the log covers (last minus first logged step)."""
        return self.last_step - self.first_step

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``context`` key of the report)."""
        return {
            "log_interval": num(self.interval),
            "steps_per_epoch": num(self.steps_per_epoch, 3),
            "steps_per_epoch_source": self.steps_per_epoch_source,
            "epoch_starts": [num(s) for s in self.epoch_starts[:50]],
            "batch_size": self.batch_size,
            "checkpoint_every": num(self.checkpoint_every),
            "checkpoint_source": self.checkpoint_source,
            "eval_every": num(self.eval_every),
            "lr_restarts": [num(s) for s in self.lr_restarts[:50]],
            "order": self.order,
        }


def epochs_from_field(steps: np.ndarray, epoch: np.ndarray) -> tuple[float | None, list[float]]:
    """Steps per epoch (from the slope of ``epoch`` over steps) and the first step of each epoch.

    >>> s = np.arange(1.0, 11.0)
    >>> epochs_from_field(s, np.floor((s - 1) / 4))
    (4.0, [5.0, 9.0])
    """
    ok = np.isfinite(epoch) & np.isfinite(steps)
    if ok.sum() < 3:
        return None, []
    s, e = steps[ok], epoch[ok]
    if float(e.max() - e.min()) <= 0:
        return None, []
    slope = float(np.polyfit(s, e, 1)[0])
    if slope <= 0:
        return None, []
    whole = np.floor(e + 1e-9)
    starts = [float(s[i]) for i in np.flatnonzero(np.diff(whole) > 0) + 1]
    if whole.size and (e == whole).all() and len(starts) >= 1:
        gaps = np.diff([float(s[0]), *starts])
        per = float(np.median(gaps)) if gaps.size else 1.0 / slope
        return per, starts
    return 1.0 / slope, starts


def lr_restarts(steps: np.ndarray, lr: np.ndarray | None) -> list[float]:
    """Steps where the learning rate jumps up by at least ``RESTART_FRACTION`` of its peak."""
    if lr is None:
        return []
    ok = np.isfinite(lr)
    if ok.sum() < 3:
        return []
    s, r = steps[ok], lr[ok]
    peak = float(np.max(r))
    if peak <= 0:
        return []
    jump = np.flatnonzero(np.diff(r) > RESTART_FRACTION * peak) + 1
    return [float(s[i]) for i in jump]


def run_context(
    steps: np.ndarray,
    columns: dict[str, np.ndarray],
    *,
    interval: float | None = None,
    steps_per_epoch: float | None = None,
    batch_size: int | None = None,
    checkpoint_every: float | None = None,
    checkpoint_steps: np.ndarray | None = None,
    checkpoint_source: str | None = None,
    eval_every: float | None = None,
    order: str | None = None,
) -> RunContext:
    """Collect the mechanism lengths known for a run logged at ``steps``."""
    if steps_per_epoch is not None and not steps_per_epoch > 0:
        raise ConfigError(f"--steps-per-epoch must be positive, got {steps_per_epoch}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be positive, got {batch_size}")
    if eval_every is not None and not eval_every > 0:
        raise ConfigError(f"--eval-every must be positive, got {eval_every}")
    first, last = float(steps[0]), float(steps[-1])
    if interval is None:
        interval = float(np.median(np.diff(steps))) if steps.size > 1 else 1.0
    per, starts, source = None, [], None
    if steps_per_epoch is not None:
        per, source = float(steps_per_epoch), "--steps-per-epoch"
        k0 = int(np.floor((first - 1) / per)) + 1
        starts = [1 + k * per for k in range(max(k0, 1), int((last - 1) // per) + 1)]
    elif "epoch" in columns:
        per, starts = epochs_from_field(steps, columns["epoch"])
        source = "epoch field" if per is not None else None
    ck_every = checkpoint_every
    if ck_every is None and checkpoint_steps is not None and checkpoint_steps.size >= 2:
        ck_every = float(np.median(np.diff(np.sort(checkpoint_steps))))
    return RunContext(
        first_step=first,
        last_step=last,
        interval=float(interval),
        steps_per_epoch=per,
        steps_per_epoch_source=source,
        epoch_starts=starts,
        batch_size=batch_size,
        checkpoint_every=ck_every,
        checkpoint_source=checkpoint_source,
        eval_every=eval_every,
        lr_restarts=lr_restarts(steps, columns.get("lr")),
        order=order,
    )
