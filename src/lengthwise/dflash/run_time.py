"""Seconds of a DFlash training run before it runs: the plan's exact work, priced per unit.

A run's step is ``grad_accum`` micro-batches per rank, each a frozen target forward over
its padded tokens and the draft's forward and backward over its block slots. Their
compute is counted exactly from the plan (:mod:`lengthwise.dflash.step_cost`, in FLOPs).
A :class:`DeviceProfile` prices it: seconds per micro-batch (what does not grow with its
size: collation, kernel launches, the optimizer's share) and seconds per GFLOP, fitted
on a few timed training steps of the run itself (:func:`fit_profile`), plus one
held-out evaluation and the run's start (loading the target, building the draft). The
slowest rank sets each step's time.

:func:`predict` gives every planned step's seconds; :class:`RunTime` sums them per
epoch and for the run and says it as a user reads it. A profile measured on one machine
is a JSON file (:meth:`DeviceProfile.save`) that prices a run planned on another
(``dflash estimate --time --device-profile FILE``).

Example::

    >>> prof = DeviceProfile(device="cpu", micro_batch=0.05, per_gflop=0.02)
    >>> work = StepWork(micro=np.array([[2], [2]]), gflop=np.array([[100.0], [110.0]]),
    ...                 epoch=np.array([0, 1]))
    >>> t = predict(work, prof, evals=0)
    >>> t.step_seconds.round(2).tolist()
    [2.1, 2.3]
    >>> t.render()
    'about 4 s for 2 epochs (2 steps: 2.2 s a step, 2.1-2.3 s an epoch) on cpu'
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError, DataError

__all__ = ["MAX_COST", "DeviceProfile", "RunTime", "StepWork", "check_costs", "duration",
           "fit_profile", "micro_work", "predict", "read_profile", "save_profile"]


@dataclass(frozen=True)
class StepWork:
    """The work of every planned step: ``micro[s, r]`` micro-batches and ``gflop[s, r]``
    GFLOPs of step ``s`` on rank ``r``, each step's ``epoch`` and, where counted, its
    padded tokens per rank (``tokens[s, r]``)."""

    micro: np.ndarray
    gflop: np.ndarray
    epoch: np.ndarray
    tokens: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return int(self.gflop.shape[0])


@dataclass(frozen=True)
class DeviceProfile:
    """Seconds per unit of a DFlash step's work on one device, and what it was fitted on.

    ``micro_batch``: seconds per micro-batch whatever its size; ``per_gflop``: seconds per
    GFLOP of the step (:func:`micro_work`); ``eval_seconds``: one held-out evaluation;
    ``start_seconds``: the run's start and end around its steps; ``fit``: the timed steps
    and how well the fit repeats them.
    """

    device: str
    micro_batch: float
    per_gflop: float
    eval_seconds: float = 0.0
    start_seconds: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict)

    def step_seconds(self, micro: Any, gflop: Any) -> np.ndarray:
        """Predicted seconds of steps of ``micro`` micro-batches and ``gflop`` GFLOPs."""
        return (self.micro_batch * np.asarray(micro, dtype=np.float64)
                + self.per_gflop * np.asarray(gflop, dtype=np.float64))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (``--save-profile``)."""
        save_profile(self, path)

    @classmethod
    def load(cls, path: str | Path) -> DeviceProfile:
        """A profile written by :meth:`save` (``--device-profile``); a clear error otherwise.

        Example::

            >>> import tempfile, os
            >>> f = os.path.join(tempfile.mkdtemp(), "p.json")
            >>> DeviceProfile("cpu", 0.1, 0.02).save(f)
            >>> DeviceProfile.load(f).per_gflop
            0.02
        """
        data = read_profile(path, kind="training", write="dflash estimate --time --save-profile",
                            required=("micro_batch", "per_gflop"),
                            costs=("micro_batch", "per_gflop", "eval_seconds", "start_seconds"),
                            priced=("micro_batch", "per_gflop"), timed="steps")
        known = {k: data[k] for k in ("device", "micro_batch", "per_gflop", "eval_seconds",
                                      "start_seconds", "fit") if k in data}
        return cls(**known)


def save_profile(profile: Any, path: str | Path) -> None:
    """Write a profile dataclass as JSON (``--save-profile``)."""
    Path(path).write_text(json.dumps(asdict(profile), indent=2) + "\n", encoding="utf-8")


#: the most seconds a profile may price one unit of work at: beyond it a time is no estimate
MAX_COST = 1e6
_JSON_KIND = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def read_profile(path: str | Path, *, kind: str, write: str, required: tuple[str, ...],
                 costs: tuple[str, ...], priced: tuple[str, ...], timed: str,
                 ) -> dict[str, Any]:
    """The JSON object of a ``kind`` profile file (``--device-profile``), checked as data
    before anything is priced by it; a one-line error naming the file and the field otherwise.

    It names its ``device`` and holds each of ``required``; each of ``costs`` (0 when absent)
    is seconds per unit from 0 to :data:`MAX_COST`, and not all of ``priced`` are 0 (that
    would price the work at 0 s); its ``fit``, where present, is an object whose count of
    ``timed`` work and relative errors are numbers. ``write``: the command that writes such
    a profile.

    Example::

        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "p.json")
        >>> _ = open(f, "w").write('{"device": "cpu", "per_step": true}')
        >>> try:
        ...     read_profile(f, kind="k", write="w", required=("per_step",),
        ...                  costs=("per_step",), priced=("per_step",), timed="steps")
        ... except DataError as e:
        ...     print(str(e).replace(f, "p.json"))
        --device-profile p.json: per_step must be a number of seconds from 0 to 1e+06, got True
    """
    where = f"--device-profile {path}"
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not a text file (byte {e.start} is not UTF-8)") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise DataError(f"{where}: not a profile (JSON nested too deep)") from None
    if not isinstance(data, dict):
        raise DataError(f"{where}: a JSON object is expected, got a JSON "
                        f"{_JSON_KIND.get(type(data), type(data).__name__)}")
    missing = [k for k in ("device", *required) if k not in data]
    if missing:
        raise DataError(f"{where}: not a {kind} profile (no {', '.join(missing)}); write one "
                        f"with {write}")
    if not isinstance(data["device"], str) or not data["device"].strip():
        raise DataError(f"{where}: device must be the name of a device, got "
                        f"{reprlib.repr(data['device'])}")
    check_costs(data, costs, where)
    if not any(data.get(k, 0) for k in priced):
        names = ", ".join(priced[:-1]) + " and " + priced[-1] if len(priced) > 1 else priced[0]
        raise DataError(f"{where}: {names} {'are both' if len(priced) == 2 else 'are all'} 0, "
                        f"which prices the work at 0 s; write a measured profile with {write}")
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise DataError(f"{where}: fit must be a JSON object (the timed work), got "
                        f"{reprlib.repr(fit)}")
    v = fit.get(timed, 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DataError(f"{where}: fit.{timed} must be a count >= 1, got {reprlib.repr(v)}")
    check_costs(fit, ("median_relative_error", "max_relative_error"), where, what="a number",
                section="fit.")
    return data


def check_costs(data: dict[str, Any], names: tuple[str, ...], where: str, *,
                what: str = "a number of seconds", section: str = "") -> None:
    """Each of ``names`` in ``data`` (0 when absent) is a real number from 0 to
    :data:`MAX_COST` (a JSON ``true`` is not one); ``where`` starts the error, ``section``
    the field's name."""
    for k in names:
        v = data.get(k, 0.0)
        if (isinstance(v, bool) or not isinstance(v, (int, float))
                or not 0 <= v <= MAX_COST):  # NaN fails both comparisons
            raise DataError(f"{where}: {section}{k} must be {what} from 0 to {MAX_COST:g}, got "
                            f"{reprlib.repr(v)}")


def micro_work(flops: Any, lengths: np.ndarray, anchors: np.ndarray,
               batches: list[list[list[int]]], *, pad_multiple: int = 1,
               capacity: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(FLOPs, padded tokens)`` of each micro-batch of ``batches`` (each a non-empty list of
    rows of sample positions), all counted at once.

    A padded micro-batch holds its samples at the longest, rounded up to ``pad_multiple``; a
    packed row (``capacity``) is priced as one sample of ``capacity`` tokens holding its
    samples' anchors (its attention over the whole row: an upper bound where kernels skip
    across samples).

    Example::

        >>> from lengthwise.dflash.step_cost import StepFlops
        >>> f = StepFlops(1.0, 0.0, 0.0, 10.0, 0.0, 0.0, block_size=2)
        >>> work, tokens = micro_work(f, np.array([4, 2]), np.array([3, 1]), [[[0], [1]], [[1]]])
        >>> work.tolist(), tokens.tolist()
        ([128.0, 22.0], [8, 2])
    """
    from lengthwise.dflash.step_cost import batch_flops
    from lengthwise.planning.cost import round_up

    rows = [row for batch in batches for row in batch]
    ids = np.fromiter((i for row in rows for i in row), dtype=np.int64)
    per_row = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    per_batch = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    if capacity is None:  # a micro-batch's samples, the longest padded
        sizes = np.add.reduceat(per_row, _starts(per_batch))
        lens, index, anc = lengths, ids, anchors
    else:  # each packed row one sample of capacity tokens
        sizes = per_batch
        lens = np.full(len(rows), int(capacity), dtype=np.int64)
        index = np.arange(len(rows))
        anc = np.add.reduceat(np.asarray(anchors, dtype=np.int64)[ids], _starts(per_row))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    work = batch_flops(flops, lens, index, offsets, anc, pad_multiple=pad_multiple)
    if capacity is None:
        longest = np.maximum.reduceat(np.asarray(lengths, dtype=np.int64)[ids], offsets[:-1])
        tokens = sizes * np.asarray(round_up(longest, pad_multiple), dtype=np.int64)
    else:
        tokens = per_batch * int(capacity)
    return work, tokens


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of consecutive groups of ``counts`` (each >= 1) items starts."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def fit_profile(micro: Any, gflop: Any, seconds: Any, *, device: str,
                eval_seconds: float = 0.0, start_seconds: float = 0.0) -> DeviceProfile:
    """Fit ``seconds = micro_batch * micro + per_gflop * gflop`` to timed steps.

    Non-negative least squares on relative residuals (each step counts alike). Where the
    timed steps' compute hardly varies (less than 5 % apart), the two terms cannot be told
    apart and the time is read as proportional to the compute alone.

    Example::

        >>> fit_profile([4, 4, 4], [10.0, 20.0, 30.0], [1.2, 2.2, 3.2], device="cpu").per_gflop
        0.1
    """
    m = np.asarray(micro, dtype=np.float64).ravel()
    g = np.asarray(gflop, dtype=np.float64).ravel()
    y = np.asarray(seconds, dtype=np.float64).ravel()
    if not (m.size == g.size == y.size) or y.size == 0:
        raise DataError("fit_profile: one micro-batch count, GFLOP count and time per step")
    if not (np.all(np.isfinite(y)) and np.all(y > 0) and np.all(g > 0)):
        raise DataError("fit_profile: every timed step needs a positive time and compute")
    w = 1.0 / y  # relative residuals
    coef = np.zeros(2)
    if y.size >= 2 and (g.max() - g.min()) > 0.05 * g.mean():
        from lengthwise.pytorch.calibrate import _nnls

        coef = _nnls(np.stack([m * w, g * w], axis=1), np.ones_like(y))
    if coef[1] <= 0:  # one time per unit of compute
        coef = np.array([0.0, float(np.sum(y * g * w * w) / np.sum(g * g * w * w))])
    pred = coef[0] * m + coef[1] * g
    err = np.abs(pred - y) / y
    return DeviceProfile(device=device, micro_batch=float(round(coef[0], 12)),
                         per_gflop=float(round(coef[1], 12)), eval_seconds=float(eval_seconds),
                         start_seconds=float(start_seconds),
                         fit={"steps": int(y.size), "seconds": y.round(4).tolist(),
                              "gflop": g.round(3).tolist(), "micro_batches": m.tolist(),
                              "median_relative_error": float(np.median(err)),
                              "max_relative_error": float(err.max())})


@dataclass(frozen=True)
class RunTime:
    """Predicted seconds of every step, the evaluations and the start, per epoch and in all."""

    step_seconds: np.ndarray
    epoch: np.ndarray
    eval_seconds: float
    evals: int
    start_seconds: float
    device: str

    @property
    def epochs(self) -> int:
        return int(np.unique(self.epoch).size)

    def epoch_seconds(self) -> list[float]:
        """Seconds of each epoch's steps (the evaluations spread by their steps' share)."""
        per_step = self.evals * self.eval_seconds / max(1, self.step_seconds.size)
        return [float(self.step_seconds[self.epoch == e].sum()
                      + per_step * int((self.epoch == e).sum()))
                for e in np.unique(self.epoch)]

    @property
    def total_seconds(self) -> float:
        return float(self.step_seconds.sum() + self.evals * self.eval_seconds
                     + self.start_seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "steps": int(self.step_seconds.size),
                "epochs": self.epochs, "step_seconds_mean": float(self.step_seconds.mean()),
                "epoch_seconds": self.epoch_seconds(), "evals": self.evals,
                "eval_seconds": self.eval_seconds, "start_seconds": self.start_seconds,
                "total_seconds": self.total_seconds}

    def render(self) -> str:
        """One line: the whole run, then a step and an epoch."""
        ep = self.epoch_seconds()
        n = self.epochs
        if max(ep) - min(ep) <= 0.05 * max(ep):  # one epoch, or epochs alike
            span = duration(float(np.mean(ep)), exact=True)
        else:
            span = (f"{duration(min(ep), exact=True, unit=False)}-"
                    f"{duration(max(ep), exact=True)}")
        extra = []
        if self.evals:
            extra.append(f"{self.evals} held-out evaluations of "
                         f"{duration(self.eval_seconds, exact=True)}")
        if self.start_seconds:
            extra.append(f"{duration(self.start_seconds, exact=True)} to start")
        return (f"about {duration(self.total_seconds)} for {n} epoch{'s' * (n != 1)} "
                f"({self.step_seconds.size:,} steps: "
                f"{duration(float(self.step_seconds.mean()), exact=True)} a step, {span} "
                f"an epoch{''.join('; ' + e for e in extra)}) on {self.device}")


def predict(work: StepWork, profile: DeviceProfile, *, evals: int) -> RunTime:
    """Every step's seconds (its slowest rank's), with ``evals`` held-out evaluations."""
    per_rank = profile.step_seconds(work.micro, work.gflop)
    return RunTime(step_seconds=per_rank.max(axis=1), epoch=np.asarray(work.epoch),
                   eval_seconds=profile.eval_seconds, evals=int(evals),
                   start_seconds=profile.start_seconds, device=profile.device)


def duration(seconds: float, *, exact: bool = False, unit: bool = True) -> str:
    """``seconds`` as a person says it: ``3 h 10 min``, ``12 min``, ``45 s``, ``2.2 s``.

    ``exact``: keep a decimal below 10 s (two digits below 1 s); ``unit=False``: a bare
    number where the unit is seconds (the first of a range).

    Example::

        >>> duration(11400), duration(725), duration(44.6), duration(2.24, exact=True)
        ('3 h 10 min', '12 min', '45 s', '2.2 s')
        >>> duration(0.0412, exact=True)
        '0.041 s'
    """
    s = float(seconds)
    if s >= 3600:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    if s >= 600:
        return f"{round(s / 60)} min"
    if s >= 60:
        m, r = divmod(round(s), 60)
        return f"{m} min {r} s" if r else f"{m} min"
    if exact and s < 1:
        text = f"{s:.2g}"
    else:
        text = f"{s:.1f}" if exact and s < 10 else f"{round(s)}"
    return text + (" s" if unit else "")
