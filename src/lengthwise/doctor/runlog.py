"""The loss curve of one run as the readers hand it over, and where its step goes back.

A :class:`RunLog` holds one value per logged step in step order: rows out of order are
sorted, a second writer's rewrites are dropped, and a resumed run supersedes what the
earlier run logged from its resume point on.

Example::

    >>> import numpy as np
    >>> log = RunLog(source="demo", step=np.arange(3.0), loss=np.array([3.0, 2.5, 2.4]))
    >>> log.num_steps, log.step_interval
    (3, 1.0)
    >>> step = np.array([1.0, 2.0, 3.0, 2.0, 3.0])
    >>> lr = np.array([1.0, 0.9, 0.8, 0.1, 0.2])
    >>> r = describe_restarts([Restart(4, 3.0, 2.0)], step, np.arange(1, 6), lr, None)[0]
    >>> r.lr_before, r.lr_after, r.rolled_back
    (0.9, 0.1, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lengthwise.doctor.numeric import JsonForm, num

#: numeric per-step fields the doctor uses when a log has them
NUMERIC_FIELDS: tuple[str, ...] = ("lr", "grad_norm", "real_tokens", "samples", "seq_len",
                                   "tokens_per_second", "corrected_loss", "loss_sample_std",
                                   "loss_sample_neff", "epoch", "time", "micro_batches", "slots",
                                   "skipped", "eval_loss", "seconds")
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
class InputSummary(JsonForm):
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

    JSON = {"format": None, "lines": None, "loss_rows": None, "other_rows": None,
            "malformed": None, "malformed_lines": list, "restarts": "restart_count",
            "restart_points": None, "logged_resumes": None, "superseded_rows": None,
            "duplicate_rows": None, "out_of_order_points": None, "reordered_rows": None,
            "step_key": None, "loss_key": None, "truncated": None, "checkpoint_source": None,
            "constant_step": num}

    @property
    def restart_points(self) -> list[dict[str, Any]]:
        """The first 20 restarts as the report writes them."""
        return [{"line": r.line, "step_before": num(r.step_before),
                 "step_after": num(r.step_after), "logged_resume": r.logged,
                 "rolled_back": num(r.rolled_back), "lr_before": num(r.lr_before),
                 "lr_after": num(r.lr_after), "lr_jumped": self.lr_jumped(r),
                 "gap_seconds": num(r.gap_seconds)} for r in self.restarts[:20]]

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


def pauses(time: np.ndarray | None) -> np.ndarray | None:
    """Mask of the rows logged after a pause in wall time of at least ``PAUSE_FACTOR`` median
    gaps and ``PAUSE_SECONDS`` (None: no ``time`` logged).

    >>> pauses(np.array([0.0, 1.0, 2.0, 3.0, 400.0, 401.0])).tolist()
    [False, False, False, False, True, False]
    """
    if time is None or time.size < 3:
        return None
    gaps = np.diff(time)
    fine = np.isfinite(gaps) & (gaps > 0)
    if fine.sum() < 2:
        return None
    limit = max(PAUSE_SECONDS, PAUSE_FACTOR * float(np.median(gaps[fine])))
    out = np.zeros(time.size, dtype=bool)
    out[1:] = np.isfinite(gaps) & (np.abs(gaps) >= limit)
    return out


def describe_restarts(restarts: list[Restart], step: np.ndarray, lines: np.ndarray,
                      lr: np.ndarray | None, time: np.ndarray | None) -> list[Restart]:
    """``restarts`` with the learning rates around each and the wall-time gap before it, from
    the rows in read order (superseded rows included)."""
    if not restarts:
        return restarts
    row_of = {int(ln): i for i, ln in enumerate(lines.tolist())}
    out = []
    for r in restarts:
        i = row_of.get(int(r.line))
        out.append(r if not i else replace(r, lr_before=_earlier_lr(step, lr, i),
                                           lr_after=_value(lr, i), gap_seconds=_gap(time, i)))
    return out


def _value(col: np.ndarray | None, i: int) -> float | None:
    if col is None or not np.isfinite(col[i]):
        return None
    return float(col[i])


def _earlier_lr(step: np.ndarray, lr: np.ndarray | None, i: int) -> float | None:
    """The rate the earlier run logged at row ``i``'s step: read there, else interpolated
    between the earlier run's rows around it, else its last row before ``i``."""
    if lr is None:
        return None
    same = np.flatnonzero((step[:i] == step[i]) & np.isfinite(lr[:i]))
    if same.size:
        return float(lr[same[-1]])
    back = np.flatnonzero(np.diff(step[:i]) <= 0)  # the earlier run's rows start after these
    lo = int(back[-1]) + 1 if back.size else 0
    seg_s, seg_lr = step[lo:i], lr[lo:i]
    ok = np.isfinite(seg_lr)
    if ok.sum() >= 2 and seg_s[ok][0] <= step[i] <= seg_s[ok][-1]:
        return float(np.interp(step[i], seg_s[ok], seg_lr[ok]))
    return _value(lr, i - 1)


def _gap(time: np.ndarray | None, i: int) -> float | None:
    if time is None or not (np.isfinite(time[i]) and np.isfinite(time[i - 1])):
        return None
    return float(time[i] - time[i - 1])


def step_order(step: np.ndarray, summary: InputSummary) -> np.ndarray | None:
    """The order that reads rows out of step order in step order, or ``None`` if none are.

    A step that goes back to a step logged before is a restart (left for
    :func:`resolve_restarts`), else disorder: the rows between restarts are sorted by step
    (stably). ``summary`` counts the disorder points and moved rows.

        >>> s = InputSummary()
        >>> step_order(np.array([3.0, 2.0, 1.0]), s).tolist(), s.out_of_order_points
        ([2, 1, 0], 2)
        >>> step_order(np.array([1.0, 2.0, 3.0, 2.0, 3.0]), InputSummary()) is None  # a resume
        True
    """
    if step.size < 2:
        return None
    starts = np.flatnonzero(step[1:] < step[:-1]) + 1  # where an increasing run begins
    if starts.size == 0:
        return None
    _, first, inverse = np.unique(step, return_index=True, return_inverse=True)
    segment = np.zeros(step.size, dtype=np.int64)
    segment[starts] = 1
    segment = np.cumsum(segment)
    bounds = np.concatenate([[0], starts])
    # a row repeats a step logged before its run began
    repeats = first[inverse] < bounds[segment]
    restart = np.logical_or.reduceat(repeats, bounds)[1:]
    disorder = int((~restart).sum())
    if disorder == 0:
        return None
    run = np.cumsum(np.concatenate([[0], restart.astype(np.int64)]))[segment]
    order = np.lexsort((step, run))
    summary.out_of_order_points = disorder
    summary.reordered_rows = int((order != np.arange(step.size)).sum())
    return order


#: a step going back at most this many rows, again and again, is a second writer
WRITER_REWIND = 4
#: ... when such rewinds and steps written twice in a row reach this share of the rows
WRITER_SHARE = 0.1


def _rewound_from(s: np.ndarray, i: int) -> int:
    """The first of the rows before ``i`` (at most ``WRITER_REWIND + 1``) whose step row ``i``
    does not exceed."""
    j = i - 1
    while j >= 0 and i - j <= WRITER_REWIND + 1 and s[j] >= s[i]:
        j -= 1
    return j + 1


def _short_rewinds(s: np.ndarray, back: np.ndarray) -> np.ndarray:
    """Mask over ``back``: the step went back by at most ``WRITER_REWIND`` rows."""
    return np.array([i - _rewound_from(s, i) <= WRITER_REWIND for i in back.tolist()],
                    dtype=bool)


def _rewritten_throughout(points: int, rows: int) -> bool:
    """Whether ``points`` rewritten steps among ``rows`` rows are a second writer's (at least 3
    and :data:`WRITER_SHARE` of the rows), not a few resumes."""
    return points >= max(3, WRITER_SHARE * rows)


def _rewinds(step: np.ndarray, fresh: np.ndarray,
             dup: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows left once ``dup`` rows are dropped, the places among them where the step goes
    back (or does not rise at a ``fresh`` row), and which of those are short rewinds."""
    rest = np.flatnonzero(~dup)
    s, new_run = step[rest], fresh[rest]
    back = np.flatnonzero((s[1:] < s[:-1]) | (new_run[1:] & (s[1:] <= s[:-1]))) + 1
    return rest, back, _short_rewinds(s, back) & ~new_run[back]


def mark_logged_resumes(summary: InputSummary, lines: np.ndarray, resumes: list[int]) -> None:
    """Mark the restarts that follow a logged ``resume`` event (between the rows around it)."""
    if not resumes or not summary.restarts:
        return
    marks = np.sort(np.asarray(resumes, dtype=np.int64))
    ordered = np.sort(lines)
    out = []
    for r in summary.restarts:
        at = int(np.searchsorted(ordered, r.line))
        before = int(ordered[at - 1]) if at > 0 else 0
        hit = np.searchsorted(marks, before, side="right") < np.searchsorted(marks, r.line)
        out.append(Restart(r.line, r.step_before, r.step_after, logged=bool(hit)))
    summary.restarts = out
    summary.logged_resumes = sum(r.logged for r in out)


def resolve_restarts(
    step: np.ndarray, lines: np.ndarray, summary: InputSummary, *, fresh: np.ndarray | None = None,
    paused: np.ndarray | None = None,
) -> np.ndarray:
    """Mask of rows to keep: a second writer's rows collapse, then later rows supersede earlier.

    Steps written again on the next row or a few rows back, at least 3 of them and
    :data:`WRITER_SHARE` of the rows, are a second writer's (the last of each step kept, the
    others counted in ``duplicate_rows``); fewer are resumes. Any other step that goes back is
    a restart: a row survives only if every later row has a larger step. A step that does not
    rise at a ``fresh`` row (a new run folder) or a ``paused`` one is always a restart.
    """
    if step.size < 2:
        return np.ones(step.size, dtype=bool)
    fresh = np.zeros(step.size, dtype=bool) if fresh is None else fresh
    if paused is not None:
        fresh = fresh | paused
    dup = np.zeros(step.size, dtype=bool)
    dup[:-1] = (step[:-1] == step[1:]) & ~fresh[1:]
    rest, back, short = _rewinds(step, fresh, dup)
    if dup.any() and not _rewritten_throughout(int(dup.sum()) + int(short.sum()), step.size):
        fresh = fresh.copy()  # a step logged again now and then: a resumed run's first
        fresh[1:] |= dup[:-1]
        dup[:] = False
        rest, back, short = _rewinds(step, fresh, dup)
    s = step[rest]
    writers = _rewritten_throughout(int(short.sum()), s.size)
    real = back[~short] if writers else back
    keep = ~dup
    later_min = np.minimum.accumulate(s[::-1])[::-1]
    next_min = np.append(later_min[1:], np.inf)
    survive = s < next_min
    keep[rest[~survive]] = False
    superseded = ~survive
    if writers:  # rows rewritten by the second writer are duplicates, not superseded by a resume
        rewritten = np.zeros(s.size, dtype=bool)
        for i in back[short].tolist():
            rewritten[_rewound_from(s, i) : i] = True
        superseded &= ~rewritten
        dup[rest[~survive & rewritten]] = True
    summary.duplicate_rows = int(dup.sum())
    summary.restarts = [
        Restart(line=int(lines[rest[i]]), step_before=float(s[i - 1]), step_after=float(s[i]))
        for i in real[:1000]
    ]
    summary.restart_count = int(real.size)
    summary.superseded_rows = int(superseded.sum())
    return keep
