"""The loss curve of one run as the readers hand it to the analyses.

A :class:`RunLog` holds one value per logged optimizer step, in increasing step
order: rows out of step order (a log sorted by descending step, files merged in
the wrong order) are read in step order, and restarts are resolved (later writes
of a step win, and a resumed run supersedes what the earlier run logged from its
resume point on). It also says what was odd about the input: malformed lines,
restart points, reordered rows, rows that carried no loss.

Example::

    >>> import numpy as np
    >>> log = RunLog(source="demo", step=np.arange(3.0), loss=np.array([3.0, 2.5, 2.4]))
    >>> log.num_steps, log.step_interval
    (3, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.doctor.numbers import num

#: numeric per-step fields the doctor uses when a log has them
NUMERIC_FIELDS: tuple[str, ...] = (
    "lr",
    "grad_norm",
    "real_tokens",
    "samples",
    "seq_len",
    "tokens_per_second",
    "corrected_loss",
    "loss_sample_std",
    "loss_sample_neff",
    "epoch",
    "time",
    "micro_batches",
    "slots",
    "skipped",
    "eval_loss",
    "seconds",
)
#: per-step list fields of one number per data-parallel rank: each rank's step time
RANK_FIELDS: tuple[str, ...] = ("rank_seconds",)
#: per-step bucket fields: ``bucket`` (one id) or ``buckets`` (the ids of the step's batches)
BUCKET_FIELDS: tuple[str, ...] = ("bucket", "buckets")
#: record numbers of a directory's n-th TensorBoard event file start at ``n * RECORDS_PER_FILE``
RECORDS_PER_FILE = 1_000_000
#: the event a training loop writes when it resumes from a checkpoint (lengthwise's loop does)
RESUME_EVENT = "resume"
#: event names that mark a checkpoint save
CHECKPOINT_EVENTS: frozenset[str] = frozenset(
    {"checkpoint", "checkpoint_begin", "checkpoint_end", "checkpoint_start", "save_checkpoint"}
)


#: a resumed run whose learning rate differs from the earlier run's by this share of the peak
#: restarted its schedule (a resumed scheduler logs the same rate, to rounding)
LR_JUMP = 0.05
#: a wall-time gap of this many median step times (and at least ``PAUSE_SECONDS``) is a pause
PAUSE_FACTOR = 20.0
PAUSE_SECONDS = 30.0


@dataclass(frozen=True)
class Restart:
    """A point where the logged step did not increase: a resumed or restarted run."""

    line: int
    step_before: float
    step_after: float
    #: the trainer logged a ``resume`` event here (an exact resume from a checkpoint)
    logged: bool = False
    #: the learning rate the earlier run logged at ``step_after`` (else the row before the restart)
    lr_before: float | None = None
    #: the learning rate the resumed run logged at ``step_after``
    lr_after: float | None = None
    #: seconds of wall time between the row before the restart and the first row after it
    gap_seconds: float | None = None

    @property
    def rolled_back(self) -> float:
        """Steps the run went back: ``step_before - step_after`` (0: a step logged again)."""
        return self.step_before - self.step_after

    def lr_jumped(self, peak: float) -> bool | None:
        """Whether the learning rate differs from the earlier run's at the same step by at least
        :data:`LR_JUMP` of the run's ``peak`` (None: no learning rate logged)."""
        if self.lr_before is None or self.lr_after is None or not peak > 0:
            return None
        return abs(self.lr_after - self.lr_before) >= LR_JUMP * peak


@dataclass
class InputSummary:
    """What reading the log found, good and bad."""

    format: str = "jsonl"
    lines: int = 0
    loss_rows: int = 0
    other_rows: int = 0
    malformed: int = 0
    malformed_lines: list[int] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    restart_count: int = 0
    #: restarts the trainer marked with a ``resume`` event (exact resumes, not problems)
    logged_resumes: int = 0
    superseded_rows: int = 0
    duplicate_rows: int = 0
    #: points where the step went back to a step not logged before (disorder, not a restart)
    out_of_order_points: int = 0
    #: rows read at another place than their place in the file, to be in step order
    reordered_rows: int = 0
    step_key: str = "step"
    loss_key: str = "loss"
    truncated: bool = False
    checkpoint_source: str | None = None
    #: the one value the step field held on every row (then the row index is the step)
    constant_step: float | None = None
    #: the peak logged learning rate, the scale of a restart's learning-rate jump
    lr_peak: float | None = None

    #: how many malformed line numbers are kept for the report
    MAX_LINES_SHOWN = 5

    def place(self, line: int) -> str:
        """Where row ``line`` is: ``line N``, or ``event file F, record R`` in TensorBoard input.

        >>> InputSummary(format="tensorboard").place(2_000_004)
        'event file 3, record 4'
        """
        if self.format == "tensorboard":
            return f"event file {line // RECORDS_PER_FILE + 1}, record {line % RECORDS_PER_FILE}"
        return f"line {line}"

    def add_malformed(self, line: int) -> None:
        """Count one malformed line, remembering the first few line numbers."""
        self.malformed += 1
        if len(self.malformed_lines) < self.MAX_LINES_SHOWN:
            self.malformed_lines.append(int(line))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (restart points capped at 20)."""
        return {
            "format": self.format,
            "lines": self.lines,
            "loss_rows": self.loss_rows,
            "other_rows": self.other_rows,
            "malformed": self.malformed,
            "malformed_lines": list(self.malformed_lines),
            "restarts": self.restart_count,
            "restart_points": [
                {"line": r.line, "step_before": num(r.step_before),
                 "step_after": num(r.step_after), "logged_resume": r.logged,
                 "rolled_back": num(r.rolled_back), "lr_before": num(r.lr_before),
                 "lr_after": num(r.lr_after), "lr_jumped": self.lr_jumped(r),
                 "gap_seconds": num(r.gap_seconds)}
                for r in self.restarts[:20]
            ],
            "logged_resumes": self.logged_resumes,
            "superseded_rows": self.superseded_rows,
            "duplicate_rows": self.duplicate_rows,
            "out_of_order_points": self.out_of_order_points,
            "reordered_rows": self.reordered_rows,
            "step_key": self.step_key,
            "loss_key": self.loss_key,
            "truncated": self.truncated,
            "checkpoint_source": self.checkpoint_source,
            "constant_step": num(self.constant_step),
        }

    def lr_jumped(self, r: Restart) -> bool | None:
        """Whether the learning rate jumped at restart ``r`` (None: no learning rate logged)."""
        return r.lr_jumped(self.lr_peak or 0.0)


@dataclass
class RunLog:
    """One run's per-step series (steps increasing, one row per step)."""

    source: str
    step: np.ndarray
    loss: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    buckets: list[Any] | None = None
    bucket_loss: dict[str, float] | None = None
    checkpoints: np.ndarray = field(default_factory=lambda: np.zeros(0))
    checkpoint_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    input: InputSummary = field(default_factory=InputSummary)
    #: ``(step, eval_loss)`` rows of the held-out evaluations, in step order
    evals: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    #: each row's step time on each rank (``rank_seconds``; NaN where not logged), or None
    rank_seconds: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        """Number of logged steps."""
        return int(self.step.size)

    @property
    def step_interval(self) -> float:
        """Median spacing of logged steps (10 for a run logged every 10 steps)."""
        if self.step.size < 2:
            return 1.0
        return float(np.median(np.diff(self.step)))

