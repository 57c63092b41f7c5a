"""Turn parsed log rows (dicts) into a :class:`~lengthwise.doctor.runlog.RunLog`.

Every reader feeds its rows here in chunks. The loss and step fields are found automatically
unless named (``loss``, ``train/loss``, ...; ``step``, ``global_step``, ...); without a step
field the row index is the step.

Example::

    >>> b = ColumnBuilder("demo")
    >>> b.add([{"step": 1, "loss": 2.0}, {"event": "checkpoint", "step": 1},
    ...        {"step": 2, "loss": 1.9}], range(1, 4))
    >>> log = b.build()
    >>> log.loss.tolist(), log.checkpoints.tolist()
    ([2.0, 1.9], [1.0])
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from lengthwise.doctor.errors import EmptyLogError, UnreadableLogError
from lengthwise.doctor.runlog import (
    BUCKET_FIELDS,
    CHECKPOINT_EVENTS,
    NUMERIC_FIELDS,
    RANK_FIELDS,
    RESUME_EVENT,
    InputSummary,
    RunLog,
    describe_restarts,
    mark_logged_resumes,
    pauses,
    resolve_restarts,
    step_order,
)

LOSS_ALIASES: tuple[str, ...] = ("loss", "train/loss", "train_loss", "training_loss", "loss/train",
                                 "train/loss_step", "lm_loss")
STEP_ALIASES: tuple[str, ...] = ("step", "global_step", "train/global_step", "trainer/global_step",
                                 "iteration", "iter", "_step", "Step")
#: a finite loss beyond this size is malformed: no float32 or bfloat16 loss reaches 3.4e38,
#: and the analyses' sums of squares overflow float64 from about 1e154
MAX_LOSS = 1e100
#: rows that all log one step value: the step field does not count (row index used)
CONSTANT_STEP_ROWS = 3
#: the held-out loss of an evaluation (Hugging Face's log_history, lengthwise's step log)
EVAL_KEY = "eval_loss"
#: names of the held-out loss in an evaluation row or tag, in the order they are looked for
#: (``eval/loss``: Hugging Face's TensorBoard and W&B callbacks)
EVAL_KEYS: tuple[str, ...] = (EVAL_KEY, "eval/loss", "val/loss", "val_loss", "validation/loss",
                              "valid/loss")
#: numeric fields written as JSON true/false
FLAG_FIELDS: frozenset[str] = frozenset({"skipped"})
NUMERIC_ALIASES: dict[str, tuple[str, ...]] = {
    "lr": ("lr", "learning_rate", "train/learning_rate", "train/lr"),
    "grad_norm": ("grad_norm", "train/grad_norm", "gradient_norm"),
}


class ColumnBuilder:
    """Accumulates rows chunk by chunk and builds the cleaned :class:`RunLog`."""

    def __init__(self, source: str, *, step_key: str | None = None, loss_key: str | None = None,
                 fmt: str = "records") -> None:
        self.source = source
        self.summary = InputSummary(format=fmt)
        #: name of the loss field as the source spells it (a CSV header, a TensorBoard tag)
        self.loss_label: str | None = None
        self._step_key = step_key
        self._loss_key = loss_key
        self._step_explicit = step_key is not None
        self._loss_explicit = loss_key is not None
        self._field_keys: dict[str, str] = {}
        self._lines: list[np.ndarray] = []
        self._steps: list[list[Any]] = []
        self._losses: list[list[Any]] = []
        self._optional: dict[str, dict[int, list[Any]]] = {}
        self._sizes: list[int] = []
        self._ckpt: dict[str, list[float]] = {"begin": [], "end": [], "plain": []}
        self._ckpt_seconds: list[float] = []
        self._bucket_loss: dict[str, float] | None = None
        self._keys_seen: set[str] = set()
        self._restart_lines: list[int] = []
        self._resume_lines: list[int] = []
        self._evals: list[tuple[float, float]] = []  # (step, eval_loss) of rows without a loss

    # ----------------------------------------------------------------- input
    def use_keys(self, *, step_key: str | None, loss_key: str | None) -> None:
        """Fix the field names that rows will carry (readers that rename columns use this)."""
        self._step_key, self._loss_key = step_key, loss_key

    def mark_restart(self, line: int) -> None:
        """The row at ``line`` starts a new run (a run folder): a repeated step there restarts."""
        self._restart_lines.append(int(line))

    def add_all(self, rows: Iterable[Any], chunk: int = 50_000) -> int:
        """Add rows numbered from 1, ``chunk`` at a time (see :meth:`add`); how many there were."""
        it, done = iter(rows), 0
        while part := list(itertools.islice(it, chunk)):
            self.add(part, range(done + 1, done + 1 + len(part)))
            done += len(part)
        return done

    def add(self, objs: list[Any], lines: Sequence[int]) -> None:
        """Add parsed rows with their 1-based line numbers (non-dict rows are malformed)."""
        if not objs:
            return
        if not all(type(o) is dict for o in objs):
            for o, ln in zip(objs, lines, strict=True):
                if not isinstance(o, dict):
                    self.summary.add_malformed(ln)
            lines = [ln for o, ln in zip(objs, lines, strict=True) if isinstance(o, dict)]
            objs = [o for o in objs if isinstance(o, dict)]
            if not objs:
                return
        if len(self._keys_seen) < 200:
            self._keys_seen.update(objs[0].keys())
            self._keys_seen.update(objs[-1].keys())
        if self._loss_key is None:  # found once, in the first rows that hold one
            self._loss_key = _first_alias(objs, LOSS_ALIASES)
        if self._step_key is None:
            self._step_key = _first_alias(objs, STEP_ALIASES)
        lk, sk = self._loss_key, self._step_key
        losses = [o.get(lk) for o in objs] if lk is not None else [None] * len(objs)
        if None in losses:
            objs, losses, lines = self._split_rows(objs, losses, lines, lk, sk)
            if not objs:
                return
        steps = [o.get(sk) for o in objs] if sk is not None else [None] * len(objs)
        chunk = len(self._sizes)
        self._sizes.append(len(objs))
        self._lines.append(np.asarray(lines, dtype=np.int64))
        self._steps.append(steps)
        self._losses.append(losses)
        probes = (objs[0], objs[len(objs) // 2], objs[-1])
        for name in (*NUMERIC_FIELDS, *BUCKET_FIELDS, *RANK_FIELDS):
            key = self._field_key(name, objs[0])
            if not any(key in p for p in probes):
                continue
            col = [o.get(key) for o in objs]
            if col.count(None) != len(col):
                self._optional.setdefault(name, {})[chunk] = col
        if "bucket_loss" in objs[-1] or "bucket_loss" in objs[0]:
            for o in reversed(objs):
                value = o.get("bucket_loss")
                if isinstance(value, dict):
                    self._bucket_loss = {str(k): v for k, v in value.items()}
                    break

    def _field_key(self, name: str, sample: dict[str, Any]) -> str:
        key = self._field_keys.get(name)
        if key is None:
            key = next((a for a in NUMERIC_ALIASES.get(name, ()) if a in sample), name)
            if key in sample or name not in NUMERIC_ALIASES:
                self._field_keys[name] = key
        return key

    def _split_rows(self, objs: list[dict[str, Any]], losses: list[Any], lines: Sequence[int],
                    lk: str | None,
                    sk: str | None) -> tuple[list[dict[str, Any]], list[Any], list[int]]:
        """Separate loss rows from events and other rows; a null loss is kept as NaN."""
        keep: list[int] = []
        for i, value in enumerate(losses):
            o = objs[i]
            # an event line (a checkpoint, a skipped spike, ...) is never a step record,
            # even when it carries the step's loss
            event = o.get("event")
            if not isinstance(event, str):
                if value is not None:
                    keep.append(i)
                    continue
                if lk is not None and lk in o:
                    losses[i] = math.nan
                    keep.append(i)
                    continue
            self.summary.other_rows += 1
            key = next((k for k in EVAL_KEYS if k in o), None)
            if key is not None:
                self.add_eval(o.get(sk or "step", o.get("step")), o[key])
            if isinstance(event, str) and event in CHECKPOINT_EVENTS:
                self._add_checkpoint(event, o, sk)
            elif event == RESUME_EVENT:
                self._resume_lines.append(int(lines[i]))
        return [objs[i] for i in keep], [losses[i] for i in keep], [lines[i] for i in keep]

    def add_eval(self, step: Any, value: Any) -> None:
        """Keep one held-out loss at ``step`` (numbers only; anything else is left out)."""
        if type(step) in (int, float) and type(value) in (int, float) \
                and math.isfinite(step) and math.isfinite(value):
            self._evals.append((float(step), float(value)))

    def _add_checkpoint(self, event: str, row: dict[str, Any], sk: str | None) -> None:
        step = row.get(sk or "step", row.get("step"))
        try:
            value = float(step)
        except (TypeError, ValueError):
            return
        if not math.isfinite(value):
            return
        kind = {"checkpoint_begin": "begin", "checkpoint_start": "begin", "checkpoint_end": "end"}
        self._ckpt[kind.get(event, "plain")].append(value)
        seconds = row.get("seconds")
        if event == "checkpoint_end" and isinstance(seconds, int | float):
            self._ckpt_seconds.append(float(seconds))

    # ----------------------------------------------------------------- output
    def build(self) -> RunLog:
        """Assemble the columns, drop bad rows, resolve restarts; raise if nothing is left."""
        s = self.summary
        s.loss_key = self.loss_label or self._loss_key or "loss"
        if not self._sizes:
            raise self._no_loss_error()
        lines = np.concatenate(self._lines)
        loss, bad_loss = _to_float(_flatten(self._losses))
        bad_loss |= np.isfinite(loss) & (np.abs(loss) > MAX_LOSS)  # inf stays non-finite
        step, bad_step = self._step_column(loss.size)
        s.step_key = self._step_key if self._step_key is not None else "row index"
        bad = bad_loss | bad_step
        s.malformed_lines += lines[bad][: s.MAX_LINES_SHOWN - len(s.malformed_lines)].tolist()
        s.malformed += int(bad.sum())
        s.malformed_lines.sort()
        good = ~bad
        columns, buckets = self._optional_columns()
        step, loss, lines = step[good], loss[good], lines[good]
        columns, buckets = _take(good, columns, buckets)
        if step.size == 0:
            raise EmptyLogError(
                f"{self.source}: no usable loss rows "
                f"({s.lines} lines read, {s.malformed} malformed{self._why_bad(bad_loss)})"
            )
        order = step_order(step, s)
        if order is not None:  # rows out of step order: read them in step order
            step, loss, lines = step[order], loss[order], lines[order]
            columns, buckets = _take(order, columns, buckets)
        fresh = np.isin(lines, self._restart_lines) if self._restart_lines else None
        paused = pauses(columns.get("time"))
        keep = resolve_restarts(step, lines, s, fresh=fresh, paused=paused)
        mark_logged_resumes(s, lines, self._resume_lines)
        s.restarts = describe_restarts(s.restarts, step, lines, columns.get("lr"),
                                       columns.get("time"))
        if "lr" in columns and np.isfinite(columns["lr"]).any():
            s.lr_peak = float(np.nanmax(columns["lr"]))
        if not keep.all():
            step, loss = step[keep], loss[keep]
            columns, buckets = _take(keep, columns, buckets)
        s.loss_rows = int(step.size)
        checkpoints = self._checkpoint_steps()
        if checkpoints.size:
            s.checkpoint_source = "events"
        evals = _held_out(self._evals, step, columns.get(EVAL_KEY))
        rank_seconds = columns.pop("rank_seconds", None)  # rows x ranks, not a column
        return RunLog(source=self.source, step=step, loss=loss, columns=columns, buckets=buckets,
                      bucket_loss=self._bucket_loss, checkpoints=checkpoints,
                      checkpoint_seconds=np.asarray(self._ckpt_seconds, dtype=np.float64), input=s,
                      evals=evals, rank_seconds=rank_seconds)

    def _why_bad(self, bad_loss: np.ndarray) -> str:
        """``; line N: 'loss' is [2.5] (a list), not a number``: the first bad value shown."""
        lines = np.concatenate(self._lines)
        for key, values, bad in ((self._loss_key, self._losses, bad_loss),
                                 (self._step_key, self._steps, None)):
            flat = _flatten(values)
            if bad is None:
                bad = _to_float(flat)[1]
            rows = np.flatnonzero(bad)
            if rows.size:
                value = flat[int(rows[0])]
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                if _too_large(value):
                    return (f"; line {int(lines[rows[0]])}: {key!r} is {shown}, "
                            f"beyond {MAX_LOSS:g}: too large a loss to analyse (its squares "
                            "overflow float64); divide the loss by a constant")
                comma = isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d*,\d+\s*", value)
                hint = (": a decimal comma; the doctor reads numbers written with a decimal "
                        "point (e.g. pandas' to_csv(decimal='.'))") if comma else ""
                return (f"; line {int(lines[rows[0]])}: {key!r} is {shown} "
                        f"(a {type(value).__name__}), not a number{hint}")
        return ""

    def _no_loss_error(self) -> EmptyLogError:
        """The error for a log where no row holds the loss field, naming the fields seen."""
        s = self.summary
        if s.lines and s.malformed >= s.lines and not self._keys_seen:
            return EmptyLogError(
                f"{self.source}: not a log the doctor reads: no line is a JSON object "
                f"({s.lines} lines read, {s.malformed} malformed; a binary file? logs are JSON "
                "lines, JSON, CSV or TensorBoard)")
        seen = ", ".join(sorted(self._keys_seen)[:12]) or "none"
        what = f"a {self._loss_key!r} field" if self._loss_explicit else "a loss field"
        hint = "" if self._loss_explicit else "; name it with --loss-key NAME"
        return EmptyLogError(
            f"{self.source}: no row with {what} ({s.lines} lines read, "
            f"{s.malformed} malformed; fields seen: {seen}){hint}"
        )

    def _step_column(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The step of each row (the row number when no step field) and rows without one."""
        if self._step_key is None:
            return np.arange(1, rows + 1, dtype=np.float64), np.zeros(rows, dtype=bool)
        raw = _flatten(self._steps)
        step, bad_step = _to_float(raw)
        bad_step |= ~np.isfinite(step)
        self._check_exact_steps(raw, step, bad_step)
        if self._step_explicit and bad_step.all():
            seen = ", ".join(sorted(self._keys_seen)[:12])
            raise EmptyLogError(f"{self.source}: no row has a numeric {self._step_key!r} "
                                f"step field (fields seen: {seen})")
        good = step[~bad_step]
        if good.size >= CONSTANT_STEP_ROWS and good.min() == good.max():
            # a step field that never counts: no step counter at all (not one step written
            # again by many writers); the row index is the step
            self.summary.constant_step = float(good[0])
            self._step_key = None
            return np.arange(1, rows + 1, dtype=np.float64), np.zeros(rows, dtype=bool)
        return step, bad_step

    def _check_exact_steps(self, raw: list[Any], step: np.ndarray, bad: np.ndarray) -> None:
        """Refuse integer steps that float64 cannot hold (above 2**53): they would merge."""
        good = step[~bad]
        if good.size == 0 or np.abs(good).max() < 2.0**53:
            return
        for i in np.flatnonzero(~bad & (np.abs(step) >= 2.0**53)).tolist():
            value = raw[i]
            if isinstance(value, int) and int(step[i]) != value:
                raise UnreadableLogError(
                    f"{self.source}: step {value} is above 2**53, where float64 steps "
                    "cannot be told apart (neighbouring steps would read as one); log "
                    "steps below 2**53, or subtract an offset")

    def _optional_columns(self) -> tuple[dict[str, np.ndarray], list[Any] | None]:
        """The optional numeric columns (NaN where a row lacks one) and the bucket labels."""
        columns: dict[str, np.ndarray] = {}
        buckets: list[Any] | None = None
        offsets = np.concatenate([[0], np.cumsum(self._sizes)])
        for name, chunks in self._optional.items():
            if name in RANK_FIELDS or name in BUCKET_FIELDS:
                raw: list[Any] = [None] * int(offsets[-1])
                for c, col in chunks.items():
                    raw[offsets[c] : offsets[c + 1]] = col
                if name in RANK_FIELDS:
                    columns[name] = _per_rank(raw)
                else:
                    buckets = _merge_buckets(buckets, raw)
                continue
            arr = np.full(int(offsets[-1]), np.nan)
            for c, col in chunks.items():
                if name in FLAG_FIELDS:  # true/false flags read as 1/0
                    col = [float(v) if type(v) is bool else v for v in col]
                arr[offsets[c] : offsets[c + 1]] = _to_float(col)[0]
            columns[name] = arr
        return columns, buckets

    def _checkpoint_steps(self) -> np.ndarray:
        """Checkpoint steps: begin events (else end events) plus plain checkpoint events."""
        marks = self._ckpt["begin"] or self._ckpt["end"]
        return np.unique(np.asarray(marks + self._ckpt["plain"], dtype=np.float64))


def _too_large(value: Any) -> bool:
    """Whether ``value`` is a finite number beyond ``MAX_LOSS`` (a malformed loss)."""
    if type(value) is bool or not isinstance(value, int | float):
        return False
    return abs(value) > MAX_LOSS and (isinstance(value, int) or math.isfinite(value))


def _per_rank(raw: list[Any]) -> np.ndarray:
    """Rows x ranks of a list field (one number per rank), NaN where a row lacks a number."""
    width = max((len(v) for v in raw if isinstance(v, list)), default=0)
    out = np.full((len(raw), width), np.nan)
    for i, v in enumerate(raw):
        if isinstance(v, list):
            for j, x in enumerate(v):
                if type(x) in (int, float):
                    out[i, j] = float(x)
    return out


def _held_out(rows: list[tuple[float, float]], step: np.ndarray,
              column: np.ndarray | None) -> np.ndarray:
    """``(step, eval_loss)`` pairs in step order, one per step (the last written wins), from
    evaluation rows and from step rows that carry an ``eval_loss``."""
    pairs = list(rows)
    if column is not None:
        ok = np.isfinite(column)
        pairs += list(zip(step[ok].tolist(), column[ok].tolist(), strict=True))
    if not pairs:
        return np.zeros((0, 2))
    latest = dict(pairs)
    return np.array(sorted(latest.items()), dtype=np.float64)


def find_field(names: Sequence[str], wanted: Sequence[str], *, suffix: bool = True) -> int | None:
    """Index of the first of ``wanted`` among ``names``, else (``suffix``) of the first name
    that ends in ``/`` and one of them, in any case, and is no evaluation's (``eval/...``).

    >>> find_field(["step", "eval/loss", "train/loss"], ("loss", "train_loss"))
    2
    """
    for want in wanted:
        if want in names:
            return list(names).index(want)
    for want in wanted if suffix else ():
        for i, name in enumerate(names):
            low = name.lower()
            if low.endswith("/" + want.lower()) and not low.startswith(("eval", "val", "test")):
                return i
    return None


def _first_alias(objs: list[dict[str, Any]], aliases: Sequence[str]) -> str | None:
    """The first of ``aliases`` that some row in ``objs`` holds (None: none does)."""
    return next((cand for cand in aliases if any(cand in o for o in objs)), None)


def _take(
    rows: np.ndarray, columns: dict[str, np.ndarray], buckets: list[Any] | None
) -> tuple[dict[str, np.ndarray], list[Any] | None]:
    """The optional columns and bucket labels of ``rows`` (a mask, or indices in a new order)."""
    columns = {k: v[rows] for k, v in columns.items()}
    if buckets is not None:
        if rows.dtype == bool:
            buckets = [b for b, g in zip(buckets, rows.tolist(), strict=True) if g]
        else:
            buckets = [buckets[i] for i in rows.tolist()]
    return columns, buckets


def _flatten(chunks: list[list[Any]]) -> list[Any]:
    return list(itertools.chain.from_iterable(chunks))


def _to_float(col: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Convert to float64 (None -> NaN); second array flags values that are not numbers.

    Booleans are not numbers here: a JSON ``true`` loss is malformed, not 1.0.
    """
    if not any(type(v) is bool for v in col):
        try:
            arr = np.array(col, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):  # an int beyond float64: one by one
            arr = None
        if arr is not None and arr.ndim == 1:  # lists of one number each would pass as 2-D
            return arr, np.zeros(len(col), dtype=bool)
    out = np.full(len(col), np.nan)
    bad = np.zeros(len(col), dtype=bool)
    for i, value in enumerate(col):
        if type(value) is bool:
            bad[i] = True
        elif value is not None:
            try:
                out[i] = float(value)
            except (TypeError, ValueError, OverflowError):
                bad[i] = True
    return out, bad


def _merge_buckets(current: list[Any] | None, raw: list[Any]) -> list[Any]:
    """Per-row bucket label: ``bucket`` wins; a ``buckets`` list becomes a tuple of ids."""
    if current is None:
        return [tuple(b) if isinstance(b, list) else b for b in raw]
    return [c if c is not None else (tuple(b) if isinstance(b, list) else b)
            for c, b in zip(current, raw, strict=True)]
