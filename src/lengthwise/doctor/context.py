"""What the doctor knows of a run's mechanisms: epoch length, batch, saves, schedule restarts.

A period in the loss is evidence of a mechanism only when its length matches
one (:mod:`lengthwise.doctor.mechanisms`); these are the lengths it is matched
against. Steps per epoch come from ``--steps-per-epoch``, else from the logged
``epoch`` field (the inverse of its slope over steps); epoch starts from the
field where it has them (also with ``--steps-per-epoch`` when the two lengths
agree within 2 %: the trainer's record places them exactly), else every
``--steps-per-epoch`` steps from step 1; learning-rate restarts
are jumps of the logged ``lr`` by at least a fifth of its peak.

Example::

    >>> import numpy as np
    >>> steps = np.arange(1.0, 1001.0)
    >>> ctx = run_context(steps, {"epoch": steps / 250.0})
    >>> ctx.steps_per_epoch, ctx.steps_per_epoch_source
    (250.0, 'epoch field')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numbers import num
from lengthwise.errors import ConfigError

#: an lr rise of at least this fraction of the peak between two logged steps is a restart
RESTART_FRACTION = 0.2
#: --steps-per-epoch within this fraction of the epoch field's length: the field places the starts
SAME_EPOCHS = 0.02


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
    world_size: int | None = None
    world_size_source: str | None = None
    epoch_resets: list[float] = field(default_factory=list)
    order: str | None = None  # the batch order the run uses (its log's ``plan`` event)
    view: str | None = None  # "micro-batch": each line is one micro-batch (``plan`` event)
    #: micro-batches in a logged step (the median of its ``micro_batches`` field; None: unlogged)
    micro_batches: float | None = None
    #: whether the log has an ``epoch`` field (known steps per epoch or not)
    epoch_logged: bool = False

    @property
    def one_micro_batch(self) -> bool:
        """Every step holds one micro-batch (of one length bucket): no order mixes a step."""
        return self.micro_batches == 1

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
            "world_size": self.world_size,
            "world_size_source": self.world_size_source,
            "epoch_resets": [num(s) for s in self.epoch_resets[:50]],
            "order": self.order,
            "view": self.view,
            "micro_batches": num(self.micro_batches),
        }


def epochs_from_field(steps: np.ndarray, epoch: np.ndarray) -> tuple[float | None, list[float]]:
    """Steps per epoch and the first step of each epoch, from a logged ``epoch`` field.

    Whole-number values are epoch indices (an epoch starts at the first row of
    a new index). Fractional values are progress, as trainers write it after
    each step (``step / steps_per_epoch``, rounded): epoch ``k`` starts one
    step after progress reaches ``k``, so a row that reads exactly ``k.0``
    still ends epoch ``k - 1``. Where progress rises in a straight line the
    crossing is read from that line (rounding averages out), else between
    the rows around it. A fall of the field (a resume) starts a new segment;
    see :func:`epoch_resets`.

    >>> s = np.arange(1.0, 11.0)
    >>> epochs_from_field(s, np.floor((s - 1) / 4))
    (4.0, [5.0, 9.0])
    >>> s = np.arange(10.0, 101.0, 10.0)
    >>> epochs_from_field(s, s / 30.0)           # 30.0 reads 1.0: epoch 1 starts at 31
    (30.0, [31.0, 61.0, 91.0])
    """
    ok = np.isfinite(epoch) & np.isfinite(steps)
    if ok.sum() < 3:
        return None, []
    s, e = steps[ok], epoch[ok]
    if float(e.max() - e.min()) <= 0:
        return None, []
    half = _rounding(e)
    if np.all(np.abs(e - np.round(e)) < 1e-9):
        return _indexed_epochs(s, e)
    starts: list[float] = []
    rates: list[tuple[float, float]] = []
    cuts = [0, *(np.flatnonzero(np.diff(e) < -2 * half - 1e-9) + 1).tolist(), s.size]
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        seg_s, seg_e = s[lo:hi], e[lo:hi]
        if seg_s.size < 2 or float(seg_e[-1] - seg_e[0]) <= 0:
            continue
        slope, icpt = np.polyfit(seg_s, seg_e, 1)
        if slope <= 0:
            continue
        rates.append((float(slope), float(seg_s[-1] - seg_s[0])))
        linear = float(np.max(np.abs(seg_e - (slope * seg_s + icpt)))) <= 2 * half + 1e-6
        first = int(np.floor(seg_e[0] + half + 1e-9)) + 1
        for k in range(first, int(np.floor(seg_e[-1] + 1e-9)) + 1):
            if linear:
                cross = (k - icpt) / slope
            else:
                b = int(np.argmax(seg_e >= k - 1e-9))
                a = max(b - 1, 0)
                gap = float(seg_e[b] - seg_e[a])
                frac = (k - seg_e[a]) / gap if gap > 0 else 1.0
                cross = float(seg_s[a] + frac * (seg_s[b] - seg_s[a]))
            starts.append(float(np.round(cross) + 1))  # epochs end on a whole step
    if not rates:
        return None, []
    starts = [x for x in starts if x <= float(s[-1])]  # an epoch that ends the log starts none
    weight = sum(w for _, w in rates)
    slope = sum(r * w for r, w in rates) / weight if weight > 0 else rates[0][0]
    return round(1.0 / slope, 6), starts


def _rounding(epoch: np.ndarray) -> float:
    """Half the last decimal place the values are written to (0 for full precision)."""
    for d in range(7):
        if np.all(np.abs(epoch * 10**d - np.round(epoch * 10**d)) < 1e-6):
            return 0.5 * 10.0**-d
    return 0.0


def _indexed_epochs(s: np.ndarray, e: np.ndarray) -> tuple[float | None, list[float]]:
    """Epoch starts of whole-number epoch indices: the first row of each new index."""
    starts = [float(s[i]) for i in np.flatnonzero(np.diff(e) > 0) + 1]
    if not starts:
        return None, []
    gaps = np.diff([float(s[0]), *starts])
    return float(np.median(gaps)), starts


def epoch_resets(steps: np.ndarray, epoch: np.ndarray | None) -> list[float]:
    """Steps where the logged ``epoch`` falls back (beyond its rounding): resumed runs.

    A run resumed from a checkpoint whose data loader starts over logs an
    ``epoch`` (or ``global_step``) that falls back while its step goes on.

    >>> epoch_resets(np.arange(1.0, 7.0), np.array([0.1, 0.2, 0.3, 0.0, 0.1, 0.2]))
    [4.0]
    """
    if epoch is None:
        return []
    ok = np.isfinite(epoch) & np.isfinite(steps)
    s, e = steps[ok], epoch[ok]
    if e.size < 2:
        return []
    fall = np.flatnonzero(np.diff(e) < -2 * _rounding(e) - 1e-9) + 1
    return [float(s[i]) for i in fall]


def lr_restarts(steps: np.ndarray, lr: np.ndarray | None) -> list[float]:
    """Steps where the learning rate jumps up by at least ``RESTART_FRACTION`` of its peak
    after it had fallen by as much: a warm-up's rise (the rate has not fallen yet) is none.

    >>> s = np.arange(10.0, 101.0, 10.0)   # a 30-step warm-up logged every 10 steps
    >>> lr_restarts(s, np.array([0.33, 0.67, 1.0, 0.9, 0.8, 0.7, 1.0, 0.9, 0.8, 0.7]))
    [70.0]
    """
    if lr is None:
        return []
    ok = np.isfinite(lr)
    if ok.sum() < 3:
        return []
    s, r = steps[ok], lr[ok]
    peak = float(np.max(r))
    if peak <= 0:
        return []
    out: list[float] = []
    last = 0  # the row of the last restart (or the first row)
    for i in (np.flatnonzero(np.diff(r) > RESTART_FRACTION * peak) + 1).tolist():
        if float(np.max(r[last:i])) - r[i - 1] >= RESTART_FRACTION * peak:
            out.append(float(s[i]))
            last = i
    return out


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
    world_size: int | None = None,
    world_size_source: str | None = None,
    order: str | None = None,
    view: str | None = None,
) -> RunContext:
    """Collect the mechanism lengths known for a run logged at ``steps``.

    ``world_size`` is the number of data-parallel processes (None: unknown).
    """
    if steps_per_epoch is not None and not 0 < steps_per_epoch < math.inf:
        raise ConfigError(f"--steps-per-epoch must be a finite positive number, got "
                          f"{steps_per_epoch}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be positive, got {batch_size}")
    if world_size is not None and world_size < 1:
        raise ConfigError(f"--world-size must be positive, got {world_size}")
    if eval_every is not None and not 0 < eval_every < math.inf:
        raise ConfigError(f"--eval-every must be a finite positive number, got {eval_every}")
    first, last = float(steps[0]), float(steps[-1])
    if interval is None:
        interval = float(np.median(np.diff(steps))) if steps.size > 1 else 1.0
    per, starts, source = None, [], None
    if steps_per_epoch is not None:
        per, source = float(steps_per_epoch), "--steps-per-epoch"
        k0 = int(np.floor((first - 1) / per)) + 1
        starts = [1 + k * per for k in range(max(k0, 1), int((last - 1) // per) + 1)]
        logged, logged_starts = (epochs_from_field(steps, columns["epoch"])
                                 if "epoch" in columns else (None, []))
        if logged_starts and logged and abs(logged - per) <= SAME_EPOCHS * per:
            # the same epochs: the trainer's own record places their starts exactly
            starts, source = logged_starts, "--steps-per-epoch, starts from the epoch field"
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
        world_size=world_size,
        world_size_source=world_size_source if world_size is not None else None,
        epoch_resets=epoch_resets(steps, columns.get("epoch")),
        order=order,
        view=view,
        micro_batches=_median(columns.get("micro_batches")),
        epoch_logged="epoch" in columns,
    )


def _median(col: np.ndarray | None) -> float | None:
    """The median of a column's finite values (None: not logged)."""
    if col is None or not np.isfinite(col).any():
        return None
    return float(np.median(col[np.isfinite(col)]))
