"""The run's context: its log, the config files beside it, the mechanisms a period matches.

Steps per epoch, resumes and lr restarts come from the logged columns; world size, clip and
schedule from a config file beside the log; the batch order from the log's ``plan`` event. A
period names a mechanism only when its length, or its alias at the logging interval, lies
within 5 % of one (docs/doctor.md, Causes whose arithmetic fits).

Example::

    >>> import numpy as np
    >>> steps = np.arange(1.0, 1001.0)
    >>> ctx = run_context(steps, {"epoch": steps / 250.0})
    >>> ctx.steps_per_epoch, ctx.steps_per_epoch_source
    (250.0, 'epoch field')
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "training_args.json").write_text(json.dumps({"world_size": 4}))
    >>> world_size_beside(d / "train.jsonl")
    (4, 'training_args.json')
    >>> logged_plan([{"event": "plan", "order": "stratified"}, {"step": 1, "loss": 2.0}])
    {'event': 'plan', 'order': 'stratified'}
    >>> ctx = RunContext(first_step=10, last_step=10000, interval=10, steps_per_epoch=412.0,
    ...                  steps_per_epoch_source="epoch field")
    >>> m = match_period(50.0, ctx)
    >>> m.mechanism, m.expected
    ('megabatch', 50.0)
    >>> match_period(60.0, ctx).mechanism is None
    True
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.doctor.numeric import JsonForm, digits, each, num
from lengthwise.errors import ConfigError

#: an lr rise of at least this fraction of the peak between two logged steps is a restart
RESTART_FRACTION = 0.2
#: --steps-per-epoch within this fraction of the epoch field's length: the field places the starts
SAME_EPOCHS = 0.02


@dataclass(frozen=True)
class RunContext(JsonForm):
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

    JSON = {"log_interval": ("interval", num), "steps_per_epoch": digits(3),
            "steps_per_epoch_source": None, "epoch_starts": each(num, 50), "batch_size": None,
            "checkpoint_every": num, "checkpoint_source": None, "eval_every": num,
            "lr_restarts": each(num, 50), "world_size": None, "world_size_source": None,
            "epoch_resets": each(num, 50), "order": None, "view": None, "micro_batches": num}


def epochs_from_field(steps: np.ndarray, epoch: np.ndarray) -> tuple[float | None, list[float]]:
    """Steps per epoch and the first step of each epoch, from a logged ``epoch`` field: epoch
    indices (whole numbers), or progress (``step / steps_per_epoch``, rounded), where epoch
    ``k`` starts one step after progress reaches ``k``; a fall of the field starts a segment.

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


def run_context(steps: np.ndarray, columns: dict[str, np.ndarray], *, interval: float | None = None,
                steps_per_epoch: float | None = None, batch_size: int | None = None,
                checkpoint_every: float | None = None, checkpoint_steps: np.ndarray | None = None,
                checkpoint_source: str | None = None, eval_every: float | None = None,
                world_size: int | None = None, world_size_source: str | None = None,
                order: str | None = None, view: str | None = None) -> RunContext:
    """Collect the mechanism lengths known for a run logged at ``steps``."""
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
    return RunContext(first_step=first, last_step=last, interval=float(interval),
                      steps_per_epoch=per, steps_per_epoch_source=source, epoch_starts=starts,
                      batch_size=batch_size, checkpoint_every=ck_every,
                      checkpoint_source=checkpoint_source, eval_every=eval_every,
                      lr_restarts=lr_restarts(steps, columns.get("lr")), world_size=world_size,
                      world_size_source=world_size_source if world_size is not None else None,
                      epoch_resets=epoch_resets(steps, columns.get("epoch")), order=order,
                      view=view, micro_batches=_median(columns.get("micro_batches")),
                      epoch_logged="epoch" in columns)


def _median(col: np.ndarray | None) -> float | None:
    """The median of a column's finite values (None: not logged)."""
    if col is None or not np.isfinite(col).any():
        return None
    return float(np.median(col[np.isfinite(col)]))


CONFIG_FILES = ("training_args.json", "args.json", "config.json", "run_config.json")
WORLD_KEYS = ("world_size", "num_processes", "n_gpu", "num_gpus")
#: keys of the gradient-clipping norm (Hugging Face ``max_grad_norm``, lengthwise's ``clip``)
CLIP_KEYS = ("max_grad_norm", "clip", "grad_clip", "clip_grad_norm", "gradient_clipping")
NESTED = ("args", "training_args", "config")
#: files larger than this are not read for settings
MAX_BYTES = 4 << 20


def _setting(doc: Any, keys: tuple[str, ...], whole: bool) -> float | None:
    """The first of ``keys`` that ``doc`` holds as a positive number (an int when ``whole``)."""
    if not isinstance(doc, dict):
        return None
    for scope in (doc, *(doc.get(k) for k in NESTED)):
        if not isinstance(scope, dict):
            continue
        for key in keys:
            value = scope.get(key)
            if isinstance(value, dict):  # W&B config.yaml style {"value": ...}
                value = value.get("value")
            kinds = int if whole else int | float
            if isinstance(value, kinds) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _read(path: Path) -> Any:
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def setting_beside(log: str | os.PathLike[str], keys: tuple[str, ...],
                   whole: bool = False) -> tuple[float | None, str | None]:
    """The first of ``keys`` recorded with the log at ``log`` and the file it came from."""
    path = Path(log)
    folder = path if path.is_dir() else path.parent
    found = [path] if path.suffix == ".json" else []
    found += [folder / name for name in CONFIG_FILES if folder / name != path]
    for f in found:
        value = _setting(_read(f), keys, whole)
        if value is not None:
            return value, f.name
    return None, None


def world_size_beside(log: str | os.PathLike[str]) -> tuple[int | None, str | None]:
    """The world size recorded with the log at ``log`` and the file it came from."""
    value, name = setting_beside(log, WORLD_KEYS, whole=True)
    return (None, None) if value is None else (int(value), name)


def settings_beside(log: str | os.PathLike[str],
                    keys: dict[str, tuple[str, ...]]) -> tuple[dict[str, float], str | None]:
    """Each of ``keys`` (a name and its aliases) recorded with the log, and the first file
    one came from."""
    found: dict[str, float] = {}
    source = None
    for name, aliases in keys.items():
        value, where = setting_beside(log, aliases)
        if value is not None:
            found[name] = float(value)
            source = source or where
    return found, source


#: the event that names a log's batch order
PLAN_EVENT = "plan"
#: the ``view`` of a log whose lines are single micro-batches (its ``plan`` event)
MICRO_VIEW = "micro-batch"
#: lines read from the top of a log file for the plan event (it is written first)
HEAD_LINES = 64


def plan_text(plan: dict[str, Any], key: str) -> str | None:
    """A ``plan`` event's text field (``order``; ``view``, :data:`MICRO_VIEW` when every line
    holds one micro-batch's loss), or None.

    >>> plan_text({"event": "plan", "view": "micro-batch"}, "view")
    'micro-batch'
    """
    value = plan.get(key)
    return value if isinstance(value, str) and value else None


def logged_plan(source: Any) -> dict[str, Any]:
    """The first ``plan`` event of a JSONL log (a path or row dicts); ``{}`` when none."""
    rows: Iterable[Any]
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.isfile(path) or not path.endswith((".jsonl", ".json", ".jsonl.gz")):
            return {}
        rows = _head(path)
    elif isinstance(source, list):
        rows = source[:HEAD_LINES]
    else:
        return {}
    for row in rows:
        if isinstance(row, dict) and row.get("event") == PLAN_EVENT:
            return row
    return {}


def _head(path: str) -> list[Any]:
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            for _, line in zip(range(HEAD_LINES), fh, strict=False):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        return []  # the log reader reports an unreadable file itself
    return out


#: Hugging Face's largest mega-batch, in batches
HF_MEGABATCH = 50
#: relative tolerance of a match
TOLERANCE = 0.05
#: world sizes tried when the log does not say
COMMON_WORLD_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class PeriodMatch:
    """The mechanism a period matched (None: none) and the arithmetic that fits."""

    mechanism: str | None
    expected: float | None
    arithmetic: str
    missing: str = ""


def apparent_period(period: float, interval: float) -> float | None:
    """The period (in steps) a cycle of ``period`` steps shows in a log every ``interval`` steps.

    >>> apparent_period(50.0, 1.0), apparent_period(3.125, 10.0)
    (50.0, 50.0)
    """
    if period >= 2 * interval:
        return period
    f = interval / period
    folded = abs(f - round(f))
    return None if folded < 1e-9 else round(interval / folded, 6)


def _fits(found: float, length: float, interval: float) -> bool:
    seen = apparent_period(length, interval)
    if seen is None:
        return False
    return abs(found - seen) <= max(TOLERANCE * seen, 0.5 * interval)


def megabatch_steps(steps_per_epoch: float, world_size: int = 1) -> float:
    """Optimizer steps per Hugging Face mega-batch cycle: ``min(W * spe // 4, 50) / W``.

    >>> megabatch_steps(412), megabatch_steps(403, world_size=4), megabatch_steps(276, 10)
    (50.0, 12.5, 5.0)
    """
    batches = max(1, min(int(steps_per_epoch * world_size) // 4, HF_MEGABATCH))
    return batches / world_size


def candidates(ctx: RunContext) -> list[tuple[str, float, str]]:
    """``(mechanism, length in steps, how it was computed)`` for every known length."""
    out: list[tuple[str, float, str]] = []
    spe = ctx.steps_per_epoch
    if spe is not None:
        out.append(("epoch", spe, f"{spe:.4g} steps per epoch ({ctx.steps_per_epoch_source})"))
        batch = f"batch {ctx.batch_size} per process, " if ctx.batch_size else ""
        for w in (ctx.world_size,) if ctx.world_size else COMMON_WORLD_SIZES:
            mb = megabatch_steps(spe, w)
            if any(name == "megabatch" and length == mb for name, length, _ in out):
                continue
            world = (f"world size {w} ({ctx.world_size_source})" if ctx.world_size
                     else f"world size {w} assumed")
            out.append(("megabatch", mb,
                        f"Hugging Face length-grouped mega-batch: min(N // (4 * batch), 50) / W"
                        f" = min({w} x {int(spe)} // 4, 50) / {w} = {mb:g} steps ({batch}"
                        f"{world}, {spe:.4g} steps per epoch)"))
    if ctx.checkpoint_every:
        out.append(("checkpoint", ctx.checkpoint_every,
                    f"checkpoint every {ctx.checkpoint_every:.4g} steps ({ctx.checkpoint_source})"))
    if ctx.eval_every:
        out.append(("evaluation", ctx.eval_every, f"evaluation every {ctx.eval_every:.4g} steps"))
    if len(ctx.lr_restarts) >= 2:
        gaps = [b - a for a, b in zip(ctx.lr_restarts[:-1], ctx.lr_restarts[1:], strict=True)]
        gap = sorted(gaps)[len(gaps) // 2]
        out.append(("lr_restarts", gap, f"learning-rate restarts every {gap:.4g} steps"))
    return out


def match_period(period: float, ctx: RunContext) -> PeriodMatch:
    """The first mechanism whose length (or its alias in the log) matches ``period`` steps."""
    for name, length, how in candidates(ctx):
        if _fits(period, length, ctx.interval):
            seen = apparent_period(length, ctx.interval)
            alias = "" if seen == length else (
                f", seen as {seen:.4g} steps when logged every {ctx.interval:.4g}")
            return PeriodMatch(name, length, f"matches {how}{alias}")
    missing = [flag for flag, unknown in (
        ("--steps-per-epoch N (or log `epoch`)", ctx.steps_per_epoch is None),
        ("--batch-size B", ctx.batch_size is None and ctx.steps_per_epoch is None),
        ("--world-size W", ctx.world_size is None),
        ("--checkpoint-every N", ctx.checkpoint_every is None)) if unknown]
    tried = ", ".join(f"{n} {v:.4g}" for n, v, _ in candidates(ctx)) or "none known"
    hint = ("HF length grouping would give a 50-step cycle with 200+ steps per epoch"
            if ctx.steps_per_epoch is None and math.isclose(period, HF_MEGABATCH, rel_tol=0.05)
            else "")
    return PeriodMatch(None, None, f"matches no known mechanism (lengths tried: {tried})"
                       + (f"; {hint}" if hint else ""),
                       missing="pass " + ", ".join(missing) if missing else "")
