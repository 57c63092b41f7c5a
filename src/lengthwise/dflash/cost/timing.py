"""Seconds of a DFlash training run, or of regeneration, before it runs: its plan priced per unit.

:func:`estimate_time` replays the plan ``dflash train`` makes (:func:`plan_work`: each step's
micro-batches and FLOPs per rank) and prices it by a :class:`DeviceProfile` fitted on a few of
the run's own steps; :func:`estimate_regenerate_time` replays regeneration's continuous
batch (:func:`decode_schedule`: each prefill and decode step, its answers drawn from the
target's) and prices it by a :class:`GenerateProfile` fitted on the forwards of a few of the
run's conversations regenerated. See docs/dflash.md.

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

import copy
import dataclasses
import json
import os
import reprlib
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lengthwise.cli.dflash._settings import run_flags
from lengthwise.dflash.cost import resident
from lengthwise.dflash.cost.flops import anchor_counts, batch_flops, step_flops
from lengthwise.dflash.generate import generate_responses
from lengthwise.dflash.prepared import open_prepared
from lengthwise.errors import ConfigError, DataError
from lengthwise.flag_field import flag_name
from lengthwise.planning.cost import round_up
from lengthwise.progress import progress
from lengthwise.pytorch.calibrate import _nnls
from lengthwise.pytorch.dist import launched_world
from lengthwise.train.config import PACKED
from lengthwise.train.device import cpu_model

__all__ = ["MAX_COST", "MAX_PLANNED", "PROFILE_CONVERSATIONS", "PROFILE_STEPS", "DecodeWork",
           "DeviceProfile", "GenerateProfile", "GenerateTime", "Profile", "RegeneratePrompts",
           "RunTime", "StepWork", "decode_schedule", "duration", "estimate_regenerate_time",
           "estimate_time", "evaluations", "fit_costs", "fit_generate_profile", "fit_profile",
           "measure_generate_profile", "measure_profile", "micro_work", "plan_work", "predict",
           "predict_generate", "regenerate_prompts", "run_samples", "train_command"]

#: the most seconds a profile may price one unit of work at: beyond it a time is no estimate
MAX_COST = 1e6
#: timed steps the profile is fitted on (one more before them warms up, one after evaluates)
PROFILE_STEPS = 4
#: conversations a regeneration profile regenerates at least (after a short warm-up)
PROFILE_CONVERSATIONS = 32
#: the most steps (times ranks) a plan is replayed for: each is counted one by one
MAX_PLANNED = 1_000_000
_CHUNK = 65536  # micro-batches whose work is counted in one pass
_JSON_KIND = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


class Profile:
    """A profile's JSON file: its kind, the command that writes it, its required fields, its
    seconds per unit (``costs``; not all of ``priced`` 0) and what its ``fit`` counts."""

    kind: ClassVar[str]
    write: ClassVar[str]
    required: ClassVar[tuple[str, ...]]
    costs: ClassVar[tuple[str, ...]]
    priced: ClassVar[tuple[str, ...]]
    timed: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (``--save-profile``)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """A profile written by :meth:`save` (``--device-profile``), checked as data.

        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "p.json")
        >>> _ = open(f, "w").write('{"device": "cpu", "micro_batch": 0, "per_gflop": true}')
        >>> try:
        ...     DeviceProfile.load(f)
        ... except DataError as e:
        ...     print(str(e).replace(f, "p.json"))
        --device-profile p.json: per_gflop must be a number of seconds from 0 to 1e+06, got True
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
        missing = [k for k in ("device", *cls.required) if k not in data]
        if missing:
            raise DataError(f"{where}: not a {cls.kind} profile (no {', '.join(missing)}); "
                            f"write one with {cls.write}")
        if not isinstance(data["device"], str) or not data["device"].strip():
            raise DataError(f"{where}: device must be the name of a device, got "
                            f"{reprlib.repr(data['device'])}")
        _check_numbers(data, cls.costs, where)
        priced = cls.priced
        if not any(data.get(k, 0) for k in priced):
            names = ", ".join(priced[:-1]) + " and " + priced[-1]
            raise DataError(f"{where}: {names} {'are both' if len(priced) == 2 else 'are all'} "
                            f"0, which prices the work at 0 s; write a measured profile with "
                            f"{cls.write}")
        fit = data.get("fit", {})
        if not isinstance(fit, dict):
            raise DataError(f"{where}: fit must be a JSON object (the timed work), got "
                            f"{reprlib.repr(fit)}")
        v = fit.get(cls.timed, 1)
        if not _count(v):
            raise DataError(f"{where}: fit.{cls.timed} must be a count >= 1, got "
                            f"{reprlib.repr(v)}")
        _check_numbers(fit, ("median_relative_error", "max_relative_error"), where,
                       what="a number", section="fit.")
        cls.check(data, where)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @classmethod
    def check(cls, data: dict[str, Any], where: str) -> None:
        """What a kind of profile checks beyond :meth:`load`'s."""


def _count(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _check_numbers(data: dict[str, Any], names: tuple[str, ...], where: str, *,
                   what: str = "a number of seconds", section: str = "") -> None:
    for k in names:
        v = data.get(k, 0.0)
        if (isinstance(v, bool) or not isinstance(v, (int, float))
                or not 0 <= v <= MAX_COST):  # NaN fails both comparisons
            raise DataError(f"{where}: {section}{k} must be {what} from 0 to {MAX_COST:g}, got "
                            f"{reprlib.repr(v)}")


def fit_costs(x: np.ndarray, seconds: np.ndarray, coef: np.ndarray | None = None,
              ) -> tuple[np.ndarray, dict[str, float]]:
    """``(seconds per unit of each column of x, how well they repeat seconds)``: the
    non-negative least squares fit on relative residuals, or ``coef`` when given.

    >>> coef, fit = fit_costs(np.array([[1.0, 2.0], [1.0, 4.0]]), np.array([3.0, 5.0]))
    >>> coef.round(6).tolist(), fit["max_relative_error"] < 1e-9
    ([1.0, 1.0], True)
    """
    if coef is None:
        coef = _nnls(x / seconds[:, None], np.ones_like(seconds))
    err = np.abs(x @ coef - seconds) / seconds
    return coef, {"median_relative_error": float(np.median(err)),
                  "max_relative_error": float(err.max())}


def _one_rate(units: np.ndarray, seconds: np.ndarray) -> float:
    """Seconds per unit of ``units`` alone, on relative residuals."""
    return float(np.sum(units / seconds) / np.sum((units / seconds) ** 2))


def check_one_process() -> None:
    """Refuse timing under a launcher of several processes: a profile is one device's."""
    if launched_world() is not None:
        raise ConfigError("--time measures a profile in one process: run the estimate "
                          "without torchrun, with --world N for the ranks of the run")


def device_name(device: str, threads: int | None) -> str:
    """The device a profile was measured on, as the estimate names it."""
    if str(device).startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"

    return f"this machine's CPU ({cpu_model()}, {threads or os.cpu_count()} thread(s))"


def duration(seconds: float, *, exact: bool = False, unit: bool = True) -> str:
    """``seconds`` as a person says it; ``exact``: a decimal below 10 s (two digits below
    1 s); ``unit=False``: a bare number of seconds (the first of a range).

    >>> duration(11400), duration(725), duration(44.6), duration(2.24, exact=True)
    ('3 h 10 min', '12 min', '45 s', '2.2 s')
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
    text = f"{s:.2g}" if exact and s < 1 else f"{s:.1f}" if exact and s < 10 else f"{round(s)}"
    return text + (" s" if unit else "")


@dataclass(frozen=True)
class StepWork:
    """``micro[s, r]`` micro-batches and ``gflop[s, r]`` GFLOPs of step ``s`` on rank ``r``,
    each step's ``epoch`` and, where counted, its padded tokens per rank (``tokens``)."""

    micro: np.ndarray
    gflop: np.ndarray
    epoch: np.ndarray
    tokens: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return int(self.gflop.shape[0])


@dataclass(frozen=True)
class DeviceProfile(Profile):
    """Seconds per unit of a DFlash step on one device: ``micro_batch`` per micro-batch,
    ``per_gflop`` per GFLOP; ``eval_seconds`` of a held-out evaluation; ``start_seconds``
    around the steps; ``fit``: the timed steps.

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "p.json")
    >>> DeviceProfile("cpu", 0.1, 0.02).save(f)
    >>> DeviceProfile.load(f).per_gflop
    0.02
    """

    kind = "training"
    write = "dflash estimate --time --save-profile"
    required = ("micro_batch", "per_gflop")
    costs = ("micro_batch", "per_gflop", "eval_seconds", "start_seconds")
    priced = ("micro_batch", "per_gflop")
    timed = "steps"

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


def micro_work(flops: Any, lengths: np.ndarray, anchors: np.ndarray,
               batches: list[list[list[int]]], *, pad_multiple: int = 1,
               capacity: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(FLOPs, padded tokens)`` of each micro-batch of ``batches`` (lists of rows of sample
    positions): its samples padded to the longest, rounded up to ``pad_multiple``; a packed
    row (``capacity``) is one sample of ``capacity`` tokens holding its samples' anchors.

    >>> from lengthwise.dflash.cost.flops import StepFlops
    >>> f = StepFlops(1.0, 0.0, 0.0, 10.0, 0.0, 0.0, block_size=2)
    >>> work, tokens = micro_work(f, np.array([4, 2]), np.array([3, 1]), [[[0], [1]], [[1]]])
    >>> work.tolist(), tokens.tolist()
    ([128.0, 22.0], [8, 2])
    """
    def starts(counts: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)

    rows = [row for batch in batches for row in batch]
    ids = np.fromiter((i for row in rows for i in row), dtype=np.int64)
    per_row = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    per_batch = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    if capacity is None:  # a micro-batch's samples, the longest padded
        sizes = np.add.reduceat(per_row, starts(per_batch))
        lens, index, anc = lengths, ids, anchors
    else:  # each packed row one sample of capacity tokens
        sizes = per_batch
        lens = np.full(len(rows), int(capacity), dtype=np.int64)
        index = np.arange(len(rows))
        anc = np.add.reduceat(np.asarray(anchors, dtype=np.int64)[ids], starts(per_row))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    work = batch_flops(flops, lens, index, offsets, anc, pad_multiple=pad_multiple)
    if capacity is not None:
        return work, per_batch * int(capacity)
    longest = np.maximum.reduceat(np.asarray(lengths, dtype=np.int64)[ids], offsets[:-1])
    return work, sizes * np.asarray(round_up(longest, pad_multiple), dtype=np.int64)


def fit_profile(micro: Any, gflop: Any, seconds: Any, *, device: str,
                eval_seconds: float = 0.0, start_seconds: float = 0.0) -> DeviceProfile:
    """Fit ``seconds = micro_batch * micro + per_gflop * gflop`` to timed steps; where their
    compute hardly varies (less than 5 % apart) the time is read as the compute's alone.

    >>> fit_profile([4, 4, 4], [10.0, 20.0, 30.0], [1.2, 2.2, 3.2], device="cpu").per_gflop
    0.1
    """
    m, g, y = (np.asarray(a, dtype=np.float64).ravel() for a in (micro, gflop, seconds))
    if not (m.size == g.size == y.size) or y.size == 0:
        raise DataError("fit_profile: one micro-batch count, GFLOP count and time per step")
    if not (np.all(np.isfinite(y)) and np.all(y > 0) and np.all(g > 0)):
        raise DataError("fit_profile: every timed step needs a positive time and compute")
    x = np.stack([m, g], axis=1)
    coef = np.zeros(2)
    if y.size >= 2 and (g.max() - g.min()) > 0.05 * g.mean():
        coef, _ = fit_costs(x, y)
    if coef[1] <= 0:  # one time per unit of compute
        coef = np.array([0.0, _one_rate(g, y)])
    coef, errors = fit_costs(x, y, coef)
    return DeviceProfile(device=device, micro_batch=float(round(coef[0], 12)),
                         per_gflop=float(round(coef[1], 12)), eval_seconds=float(eval_seconds),
                         start_seconds=float(start_seconds),
                         fit={"steps": int(y.size), "seconds": y.round(4).tolist(),
                              "gflop": g.round(3).tolist(), "micro_batches": m.tolist(),
                              **errors})


@dataclass(frozen=True)
class RunTime:
    """Predicted seconds of every step, the evaluations and the start."""

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
        """Seconds of each epoch (the evaluations spread over the steps)."""
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
        ep, n = self.epoch_seconds(), self.epochs
        if max(ep) - min(ep) <= 0.05 * max(ep):  # one epoch, or epochs alike
            span = duration(float(np.mean(ep)), exact=True)
        else:
            span = (f"{duration(min(ep), exact=True, unit=False)}-"
                    f"{duration(max(ep), exact=True)}")
        extra = ([f"{self.evals} held-out evaluations of "
                  f"{duration(self.eval_seconds, exact=True)}"] if self.evals else [])
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


def run_samples(data: Any, cfg: Any, run: Any, *,
                config: Any = None) -> tuple[np.ndarray, np.ndarray, Any]:
    """``(lengths, anchors, StepFlops)`` of the samples ``dflash train`` trains on ``data``,
    for the target's ``config`` (read from ``run.target`` when not given)."""
    from lengthwise.dflash.cost.memory import read_target_config
    from lengthwise.dflash.recipe import split_samples
    from lengthwise.dflash.target import check_causal_lm

    _, train_idx, _ = split_samples(data, cfg, run.eval_samples, seed=run.split_seed)
    lengths = np.minimum(data.lengths[train_idx], cfg.max_len)
    anchors = anchor_counts(lengths, num_anchors=cfg.num_anchors, block_size=cfg.block_size,
                            max_slots=cfg.slot_budget, max_tokens=cfg.max_tokens,
                            pairs=data.anchor_pairs(train_idx, cfg.max_len))
    if config is None:
        check_causal_lm(run.target)
        config = read_target_config(run.target)
    flops = step_flops(config, cfg)
    if run.features:  # the timed steps read the cache too (train_command passes --features)
        flops = dataclasses.replace(flops, target_token=0.0, target_pair=0.0)
    return lengths, anchors, flops


def plan_work(data: Any, cfg: Any, run: Any, *, world: int = 1, config: Any = None,
              samples: tuple[np.ndarray, np.ndarray, Any] | None = None,
              ) -> tuple[StepWork, Any]:
    """``(work of every step, the config the run trains with)`` of ``dflash train`` on
    ``data`` at ``world`` ranks (``samples``: :func:`run_samples`)."""
    from lengthwise.dflash.recipe import _with_epochs
    from lengthwise.train.loop import StepBatches, make_sampler

    lengths, anchors, flops = (samples if samples is not None
                               else run_samples(data, cfg, run, config=config))
    if run.epochs is not None:
        cfg = _with_epochs(cfg, run, lengths, 0, world)
    if cfg.steps * world > MAX_PLANNED:
        given = (f"--epochs {run.epochs:g}" if run.epochs is not None
                 else f"--steps {cfg.steps}")
        raise ConfigError(f"{given}: {cfg.steps:,} steps at {world} rank(s); the time estimate "
                          f"replays every planned step of every rank, at most {MAX_PLANNED:,}: "
                          "estimate a shorter run (--epochs 1 gives an epoch's time) and "
                          "scale it")
    capacity = cfg.max_len if run.order == PACKED else None
    ranks = [StepBatches(make_sampler(run.order, lengths, cfg, rank=r, world=world,
                                      check_world_size=False), cfg.grad_accum)
             for r in range(world)]
    micro = np.zeros((cfg.steps, world), dtype=np.int64)
    gflop = np.zeros((cfg.steps, world), dtype=np.float64)
    tokens = np.zeros((cfg.steps, world), dtype=np.int64)
    epoch = np.zeros(cfg.steps, dtype=np.int64)
    chunk = max(1, _CHUNK // (world * cfg.grad_accum))  # steps counted together
    for start in range(0, cfg.steps, chunk):
        stop = min(cfg.steps, start + chunk)
        batches: list[list[list[int]]] = []
        for s in range(start, stop):
            for r, rank in enumerate(ranks):
                step = rank.next()
                micro[s, r] = len(step)
                batches += step
            epoch[s] = ranks[0].sampler.epoch
        work, padded = micro_work(flops, lengths, anchors, batches,
                                  pad_multiple=cfg.pad_multiple, capacity=capacity)
        cells = np.concatenate([[0], np.cumsum(micro[start:stop].ravel())[:-1]])
        gflop[start:stop] = np.add.reduceat(work, cells).reshape(-1, world) / 1e9
        tokens[start:stop] = np.add.reduceat(padded, cells).reshape(-1, world)
    return StepWork(micro=micro, gflop=gflop, epoch=epoch, tokens=tokens), cfg


def evaluations(cfg: Any, run: Any) -> int:
    """Held-out evaluations a run makes (every ``eval_every`` steps, a tenth by default)."""
    every = run.eval_every if run.eval_every is not None else max(1, cfg.steps // 10)
    return cfg.steps // every if every and run.eval_samples else 0


def train_command(cfg: Any, run: Any, *, out: str | Path, steps: int) -> list[str]:
    """The ``dflash train`` command of the run ``(cfg, run)`` for ``steps`` steps into ``out``:
    the same target, data and settings, no checkpoints, one held-out evaluation at the end.

    >>> from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings
    >>> argv = train_command(DFlashTrainConfig(steps=9, block_size=4),
    ...                      RunSettings(target="t", data="d"), out="o", steps=6)
    >>> argv[3:9], "--block-size" in argv, argv[argv.index("--steps") + 1]
    (['dflash', 'train', '--target', 't', '--data', 'd'], True, '6')
    """
    fixed = {"steps": steps, "checkpoint_every": 0, "eval_every": steps}
    argv = [sys.executable, "-m", "lengthwise", "dflash", "train", "--target", str(run.target),
            "--data", str(run.data), "--out", str(out), "--overwrite", "--no-progress"]
    for name, kind in run_flags().items():
        if kind is bool or name in ("target", "data", "out", "epochs", "warmup",
                                    "wandb_project", "tensorboard"):
            continue
        value = fixed.get(name, getattr(run, name, getattr(cfg, name, None)))
        if value is None or (kind is int and not isinstance(value, int)):
            continue  # unset, or a default the flag cannot spell (buckets "auto")
        argv += [flag_name(name), str(value)]
    return argv


def measure_profile(cfg: Any, run: Any, *, steps: int = PROFILE_STEPS, data: Any = None,
                    samples: tuple[np.ndarray, np.ndarray, Any] | None = None,
                    ) -> DeviceProfile:
    """Fit a profile to the seconds the run's first ``steps + 2`` steps log, run as a
    ``dflash train`` command in a temporary folder (its start: the wall time around them)."""
    check_one_process()
    if steps < 2:
        raise ConfigError(f"--profile-steps must be at least 2, got {steps}")
    data = data if data is not None else open_prepared(run.data)
    timed = steps + 2
    print(f"lengthwise dflash estimate: timing {timed} training steps of this run on "
          f"{cfg.device} (the first warms up, the last also evaluates)", file=sys.stderr,
          flush=True)
    with tempfile.TemporaryDirectory(prefix="lengthwise-time-") as tmp:
        out = Path(tmp) / "run"
        env = {k: v for k, v in os.environ.items()
               if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        started = time.perf_counter()
        done = subprocess.run(train_command(cfg, run, out=out, steps=timed), env=env,
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if done.returncode:
            raise RuntimeError(f"the timed steps (dflash train) exited with {done.returncode}:"
                               f"\n{done.stderr[-3000:]}")
        with open(out / "train_log.jsonl", encoding="utf-8") as fh:
            records = [rec for rec in (json.loads(line) for line in fh if line.strip())
                       if "seconds" in rec and "event" not in rec]  # steps, not events
    if len(records) < timed:
        raise RuntimeError(f"the timed run logged {len(records)} of {timed} steps")
    r = dataclasses.replace(run, epochs=None, eval_every=timed)
    work, _ = plan_work(data, dataclasses.replace(cfg, steps=timed), r, samples=samples)
    seconds = np.array([float(rec["seconds"]) for rec in records[:timed]])
    fit = slice(1, timed - 1)
    prof = fit_profile(work.micro[fit, 0], work.gflop[fit, 0], seconds[fit],
                       device=device_name(cfg.device, cfg.threads))
    last = float(prof.step_seconds(work.micro[-1, 0], work.gflop[-1, 0]))
    evals = 1 if run.eval_samples else 0
    return dataclasses.replace(prof, eval_seconds=max(0.0, seconds[-1] - last) * evals,
                               start_seconds=max(0.0, wall - float(seconds.sum())))


def estimate_time(cfg: Any, run: Any, *, world: int = 1, profile: DeviceProfile | None = None,
                  steps: int = PROFILE_STEPS) -> tuple[RunTime, DeviceProfile]:
    """The run's predicted time at ``world`` ranks, priced by ``profile`` or one measured here."""
    data = open_prepared(run.data)
    samples = run_samples(data, cfg, run)  # once: the run's plan and the timed steps' share it
    work, trained = plan_work(data, cfg, run, world=world, samples=samples)
    if profile is None:
        profile = measure_profile(cfg, run, steps=steps, data=data, samples=samples)
    return predict(work, profile, evals=evaluations(trained, run)), profile


@dataclass(frozen=True)
class DecodeWork:
    """The forwards of one continuous batch: each prefill's prompt tokens run (``feed``)
    after the tokens its row's cache held (``have``); each decode step's ``rows`` and its
    cache ``width``."""

    feed: np.ndarray
    have: np.ndarray
    rows: np.ndarray
    width: np.ndarray


def decode_schedule(prompts: list[np.ndarray], written: list[np.ndarray], *, rows: int,
                    max_new_tokens: int, max_tokens: int | None = None) -> DecodeWork:
    """The forwards :func:`~lengthwise.dflash.generate.decode_conversations` runs when the
    conversations (in the order admitted) have turns whose prompts hold ``prompts[c][t]``
    tokens and whose answers are ``written[c][t]`` tokens long (the stop token included).

    A row keeps its conversation's tokens between turns: a later prompt runs only its tokens
    past the cache. Admission follows the decoder's: at most ``rows`` rows, and with
    ``max_tokens`` at most that many of ``rows x (longest prompt + max_new_tokens)``.

    >>> w = decode_schedule([np.array([5, 12]), np.array([7])], [np.array([3, 2]),
    ...                     np.array([4])], rows=2, max_new_tokens=4)
    >>> w.feed.tolist(), w.have.tolist()    # the second turn reuses 5 + 3 - 1 cached tokens
    ([5, 7, 5], [0, 0, 7])
    >>> w.rows.tolist(), w.width.tolist()
    ([2, 2, 2], [8, 9, 13])
    """
    n = len(prompts)
    conv = np.full(rows, -1, dtype=np.int64)  # each slot's conversation (-1: free)
    turn, seq, done, need = (np.zeros(rows, dtype=np.int64) for _ in range(4))
    feed: list[int] = []
    have: list[int] = []
    step_rows: list[int] = []
    step_width: list[int] = []

    def start(slot: int) -> None:
        c, t = conv[slot], turn[slot]
        length = int(prompts[c][t])
        cached = int(seq[slot]) - 1 if t else 0
        if cached >= length:  # nothing of the prompt past the cache: a whole prefill
            cached = 0
        feed.append(length - cached)
        have.append(cached)
        seq[slot], done[slot], need[slot] = length + 1, 1, length + max_new_tokens

    def settle(slot: int) -> None:
        """Start the slot's next turns while its turn has ended; free it after the last."""
        c = conv[slot]
        while done[slot] >= min(int(written[c][turn[slot]]), max_new_tokens):
            turn[slot] += 1
            if turn[slot] == len(prompts[c]):
                conv[slot] = -1
                return
            start(slot)

    waiting = [c for c in range(n - 1, -1, -1) if len(prompts[c])]  # popped from the end
    while True:
        widest = int(need[conv >= 0].max()) if (conv >= 0).any() else 0
        while waiting and (conv < 0).any():  # admit into free slots, a row at a time
            live = int(np.sum(conv >= 0))
            c = waiting[-1]
            if live and max_tokens is not None and (live + 1) * max(
                    widest, int(prompts[c][0]) + max_new_tokens) > max_tokens:
                break
            slot = int(np.argmax(conv < 0))
            waiting.pop()
            conv[slot], turn[slot] = c, 0
            start(slot)
            widest = max(widest, int(need[slot]))  # its first turn's, as the decoder counts
            settle(slot)
        active = conv >= 0
        if not active.any():
            break
        step_rows.append(int(active.sum()))
        step_width.append(int(seq[active].max()))
        seq[active] += 1
        done[active] += 1
        for slot in np.flatnonzero(active):
            settle(int(slot))
    return DecodeWork(*(np.asarray(x, dtype=np.int64) for x in (feed, have, step_rows,
                                                                 step_width)))


@dataclass(frozen=True)
class GenerateProfile(Profile):
    """Seconds per unit of regeneration's forwards on one device: a prefill costs
    ``per_prefill``, ``per_prefill_token`` per prompt token it runs and ``per_prefill_pair``
    per token pair it attends; a decode step ``per_step``, ``per_row`` per row and
    ``per_row_width`` per cached token a row attends. ``responses``: the lengths the target
    wrote (with the stop token, at most ``max_new_tokens``); ``start_seconds``: loading the
    target and rendering the prompts.

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> GenerateProfile("cpu", 0.01, 1e-4, 1e-8, 0.02, 1e-3, 1e-6, [5, 9], 16).save(f)
    >>> GenerateProfile.load(f).responses
    [5, 9]
    """

    kind = "regeneration"
    write = "dflash estimate --stage regenerate --time --save-profile"
    priced = ("per_prefill", "per_prefill_token", "per_prefill_pair", "per_step", "per_row",
              "per_row_width")
    required = (*priced, "responses", "max_new_tokens")
    costs = (*priced, "start_seconds")
    timed = "forwards"

    device: str
    per_prefill: float
    per_prefill_token: float
    per_prefill_pair: float
    per_step: float
    per_row: float
    per_row_width: float
    responses: list[int]
    max_new_tokens: int
    start_seconds: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def check(cls, data: dict[str, Any], where: str) -> None:
        cap, resp = data["max_new_tokens"], data["responses"]
        if not _count(cap):
            raise DataError(f"{where}: max_new_tokens must be a count >= 1, got "
                            f"{reprlib.repr(cap)}")
        if (not isinstance(resp, list) or not resp
                or not all(_count(x) and x <= cap for x in resp)):
            raise DataError(f"{where}: responses must be a list of lengths from 1 to "
                            f"max_new_tokens ({cap})")

    def seconds(self, work: DecodeWork) -> tuple[float, float]:
        """``(prefill seconds, decode seconds)`` of ``work``."""
        prefill = np.array([self.per_prefill, self.per_prefill_token, self.per_prefill_pair])
        step = np.array([self.per_step, self.per_row, self.per_row_width])
        return (float(np.sum(_prefill_units(work.feed, work.have) @ prefill)),
                float(np.sum(_step_units(work.rows, work.width) @ step)))

    def draw(self, turns: int, cap: int, rng: np.random.Generator,
             ) -> tuple[np.ndarray, np.ndarray]:
        """``(written, answer)`` of ``turns`` responses drawn from the timed ones cut at
        ``cap``: the tokens written, and those the next prompt holds (the stop token is not
        kept: the template writes its own end of turn).

        >>> prof = GenerateProfile("cpu", 0, 0, 0, 1, 0, 0, [5, 30], max_new_tokens=32)
        >>> [x.tolist() for x in prof.draw(4, 16, np.random.default_rng(0))]  # 30 cut at 16
        [[16, 16, 16, 5], [16, 16, 16, 4]]
        """
        resp = np.asarray(self.responses, dtype=np.int64)[rng.integers(0, len(self.responses),
                                                                      turns)]
        written = np.minimum(resp, cap)
        ended = (resp < self.max_new_tokens) & (resp <= cap)
        return written, written - ended


def _prefill_units(feed: Any, have: Any) -> np.ndarray:
    f, h = (np.asarray(a, dtype=np.float64) for a in (feed, have))
    return np.stack([np.ones_like(f), f, f * (h + (f + 1) / 2)], axis=-1)


def _step_units(rows: Any, width: Any) -> np.ndarray:
    r, w = (np.asarray(a, dtype=np.float64) for a in (rows, width))
    return np.stack([np.ones_like(r), r, r * w], axis=-1)


def fit_generate_profile(trace: Any, *, device: str, responses: list[int],
                         max_new_tokens: int, start_seconds: float = 0.0) -> GenerateProfile:
    """Fit a profile to a decoder's timed forwards: ``trace`` rows ``(0, feed, have,
    seconds)`` of a prefill and ``(1, rows, width, seconds)`` of a decode step, by
    non-negative least squares on their seconds (so that the fitted ones sum as timed).

    >>> trace = [(0, f, h, 0.01 + 1e-3 * f) for f, h in [(20, 0), (5, 30), (40, 0)]]
    >>> trace += [(1, r, w, 0.02 + 0.005 * r) for r, w in [(4, 30), (2, 40), (1, 41)]]
    >>> p = fit_generate_profile(trace, device="cpu", responses=[8], max_new_tokens=16)
    >>> round(p.per_prefill_token, 4), round(p.per_step, 3), round(p.per_row, 4)
    (0.001, 0.02, 0.005)
    """
    t = np.asarray(trace, dtype=np.float64).reshape(-1, 4)
    if t.size == 0 or not np.all(np.isin(t[:, 0], (0, 1))):
        raise DataError("fit_generate_profile: one (kind 0 or 1, size, size, seconds) row a "
                        "forward")
    if not (np.all(np.isfinite(t[:, 3])) and np.all(t[:, 3] > 0) and np.all(t[:, 1] > 0)):
        raise DataError("fit_generate_profile: every timed forward needs a positive time "
                        "and size")
    coefs, fits = [], {}
    for kind, units in ((0, _prefill_units), (1, _step_units)):
        mine = t[t[:, 0] == kind]
        if mine.size == 0:
            coefs.append(np.zeros(3))
            continue
        x, y = units(mine[:, 1], mine[:, 2]), mine[:, 3]
        # absolute residuals: the many small forwards and the few large ones add up as timed
        coef, errors = fit_costs(x, y, _nnls(x, y))
        if not np.any(coef > 0):  # nothing to tell apart: one rate per forward
            coef, errors = fit_costs(x, y, np.array([_one_rate(x[:, 0], y), 0.0, 0.0]))
        name = "prefills" if kind == 0 else "steps"
        coefs.append(coef)
        fits.update({name: int(y.size), f"{name}_seconds": round(float(y.sum()), 4),
                     f"{name}_fitted_seconds": round(float(np.sum(x @ coef)), 4),
                     **{f"{name}_{k}": v for k, v in errors.items()}})
    (a, b, c), (d, e, f) = (np.round(x, 15) for x in coefs)
    return GenerateProfile(
        device=device, per_prefill=float(a), per_prefill_token=float(b),
        per_prefill_pair=float(c), per_step=float(d), per_row=float(e), per_row_width=float(f),
        responses=[int(v) for v in responses], max_new_tokens=int(max_new_tokens),
        start_seconds=float(start_seconds), fit={"forwards": int(t.shape[0]), **fits})


@dataclass(frozen=True)
class GenerateTime:
    """Predicted seconds of regeneration, shard by shard; each figure of the run as a whole
    is its slowest rank's, the one the run waits for."""

    shard_prefill: np.ndarray  # seconds of each shard's prefills
    shard_decode: np.ndarray  # seconds of each shard's decode steps
    shard_prefills: np.ndarray
    shard_steps: np.ndarray
    responses: int
    longest_prompt: int
    world: int
    start_seconds: float
    device: str
    cut_share: float  # of the timed responses, the share cut at max_new_tokens

    @property
    def shard_seconds(self) -> np.ndarray:
        return self.shard_prefill + self.shard_decode

    def rank_sums(self, values: np.ndarray) -> np.ndarray:
        """``values`` of each shard summed by rank (rank ``k % world`` runs shard ``k``)."""
        rank = np.arange(values.size) % self.world
        return np.bincount(rank, weights=values, minlength=self.world)

    def rank_seconds(self) -> np.ndarray:
        """Seconds of each rank's shards."""
        return self.rank_sums(self.shard_seconds)

    def _slowest(self, values: np.ndarray) -> float:
        if not values.size:
            return 0.0
        return float(self.rank_sums(values)[int(np.argmax(self.rank_seconds()))])

    @property
    def generate_seconds(self) -> float:
        """The slowest rank's shards: what the run waits for."""
        return self._slowest(self.shard_seconds)

    @property
    def prefill_seconds(self) -> float:
        return self._slowest(self.shard_prefill)

    @property
    def decode_seconds(self) -> float:
        return self._slowest(self.shard_decode)

    @property
    def prefills(self) -> int:
        return round(self._slowest(self.shard_prefills))

    @property
    def steps(self) -> int:
        return round(self._slowest(self.shard_steps))

    @property
    def total_seconds(self) -> float:
        return self.generate_seconds + self.start_seconds

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "responses": self.responses, "steps": self.steps,
                "prefills": self.prefills, "shards": int(self.shard_seconds.size),
                "world": self.world, "prefill_seconds": self.prefill_seconds,
                "decode_seconds": self.decode_seconds, "generate_seconds": self.generate_seconds,
                "start_seconds": self.start_seconds, "total_seconds": self.total_seconds,
                "longest_prompt": self.longest_prompt, "cut_share": self.cut_share}

    def render(self) -> str:
        """One line: the whole regeneration, then where the slowest rank's time goes."""
        ranks = f" on each of {self.world} ranks" if self.world > 1 else ""
        slowest = "the slowest rank: " if self.world > 1 else ""
        extra = (f"; {duration(self.start_seconds, exact=True)} to start"
                 if self.start_seconds else "")
        return (f"about {duration(self.total_seconds, exact=True)} for {self.responses:,} "
                f"responses{ranks} ({slowest}{self.prefills:,} prefills, "
                f"{duration(self.prefill_seconds, exact=True)}; {self.steps:,} decode steps, "
                f"{duration(self.decode_seconds, exact=True)}{extra}) on {self.device}")


@dataclass(frozen=True)
class RegeneratePrompts:
    """Each conversation's prompts in regeneration: ``lengths[c][t]`` tokens in turn ``t``'s
    prompt with the data's earlier answers, ``answered[c][t]`` the tokens of those answers;
    each conversation's ``shard``; ``seconds``: the time rendering them took."""

    lengths: list[np.ndarray]
    answered: list[np.ndarray]
    shard: np.ndarray
    seconds: float

    def with_answers(self, c: int, answers: np.ndarray) -> np.ndarray:
        """Conversation ``c``'s prompt lengths with earlier answers of ``answers[t]`` tokens.

        >>> p = RegeneratePrompts([np.array([9, 40])], [np.array([0, 25])], np.array([0]), 0.0)
        >>> p.with_answers(0, np.array([6, 3])).tolist()
        [9, 21]
        """
        before = np.concatenate([[0], np.cumsum(answers)[:-1]]).astype(np.int64)
        return np.maximum(1, self.lengths[c] - self.answered[c] + before)


def predict_generate(prompts: RegeneratePrompts, profile: GenerateProfile, *, rows: int,
                     max_new_tokens: int | None = None, max_tokens: int | None = None,
                     world: int = 1, seed: int = 0) -> GenerateTime:
    """Regeneration's predicted seconds: each shard's continuous batch
    (:func:`decode_schedule`, its conversations with the most turns first) with responses
    drawn from the profile's (``seed``), priced by ``profile``. ``max_new_tokens`` (the
    profile's when not given) above the profile's is refused where the timed responses were
    cut at it.

    >>> prof = GenerateProfile("cpu", 0, 0, 0, per_step=0.01, per_row=0, per_row_width=0,
    ...                        responses=[10], max_new_tokens=64)
    >>> p = RegeneratePrompts([np.array([5]), np.array([9]), np.array([7])],
    ...                       [np.zeros(1, np.int64)] * 3, np.array([0, 0, 0]), 0.0)
    >>> t = predict_generate(p, prof, rows=2)
    >>> t.steps, round(t.generate_seconds, 2)    # rows of 2 then 1, 9 steps each
    (18, 0.18)
    >>> t.render()
    'about 0.18 s for 3 responses (3 prefills, 0 s; 18 decode steps, 0.18 s) on cpu'
    """
    cap = int(max_new_tokens if max_new_tokens is not None else profile.max_new_tokens)
    resp = np.asarray(profile.responses, dtype=np.int64)
    cut = float(np.mean(resp >= profile.max_new_tokens)) if resp.size else 0.0
    if cap > profile.max_new_tokens and cut > 0:
        raise ConfigError(f"--max-new-tokens {cap}: the profile timed responses of at most "
                          f"{profile.max_new_tokens} tokens and {100 * cut:.0f} % reached it, "
                          "so longer ones are not known; time the run with its own "
                          "--max-new-tokens")
    rng = np.random.default_rng(seed)
    shards = int(prompts.shard.max()) + 1 if prompts.shard.size else 0
    parts = np.zeros((4, shards))  # prefill s, decode s, prefills, steps
    longest = 0
    for k in range(shards):
        mine = np.flatnonzero(prompts.shard == k)
        order = mine[np.argsort([-prompts.lengths[c].size for c in mine], kind="stable")]
        lens, written = [], []
        for c in order:
            w, answer = profile.draw(prompts.lengths[c].size, cap, rng)
            lens.append(prompts.with_answers(int(c), answer))
            written.append(w)
        work = decode_schedule(lens, written, rows=rows, max_new_tokens=cap,
                               max_tokens=max_tokens)
        parts[:, k] = [*profile.seconds(work), work.feed.size, work.rows.size]
        longest = max([longest, *(int(x.max()) for x in lens if x.size)])
    return GenerateTime(
        *parts, responses=sum(x.size for x in prompts.lengths), longest_prompt=longest,
        world=max(1, int(world)), start_seconds=profile.start_seconds, device=profile.device,
        cut_share=float(np.mean(np.minimum(resp, cap) >= cap)))


def _conversations(source: str | Path, cfg: Any) -> list[list[dict[str, str]]]:
    """The conversations of ``source``, each ending with an assistant turn to write."""
    from lengthwise.dflash.chat import normalise
    from lengthwise.dflash.chat_files import ChatSource

    if not Path(source).exists():
        raise DataError(f"{source}: no such file or folder")
    chats = ChatSource(Path(source), field=cfg.field, split=cfg.split)
    if len(chats) == 0:
        raise DataError(f"{source}: no conversations")
    convs = []
    for _, where, raw in chats.rows():
        conv = normalise(raw, where=where, allow_empty_assistant=True)
        if conv[-1]["role"] != "assistant":
            conv.append({"role": "assistant", "content": ""})
        convs.append(conv)
    return convs


def regenerate_prompts(source: str | Path, renderer: Any, cfg: Any, *,
                       show: bool = True) -> RegeneratePrompts:
    """The length of every prompt regeneration of ``source`` gives the target."""
    from lengthwise.dflash.prepare import _render_or_name
    from lengthwise.dflash.regenerate import assistant_turns

    started = time.perf_counter()
    convs = _conversations(source, cfg)
    lengths: list[np.ndarray] = []
    answered: list[np.ndarray] = []
    for i, conv in enumerate(progress(convs, desc="dflash estimate: rendering prompts",
                                      unit="chat", total=len(convs), enable=show)):
        mine, before, so_far = [], [], 0  # so_far: tokens of the data's answers
        for j in assistant_turns(conv):
            ids = _render_or_name(lambda j=j, conv=conv: renderer.prompt_ids(conv[:j]),
                                  f"{source} row {i}")
            mine.append(len(ids))
            before.append(so_far)
            so_far += len(renderer.tokenizer.encode(conv[j]["content"],
                                                    add_special_tokens=False))
        lengths.append(np.asarray(mine, dtype=np.int64))
        answered.append(np.asarray(before, dtype=np.int64))
    return RegeneratePrompts(lengths=lengths, answered=answered,
                             shard=np.arange(len(convs), dtype=np.int64) // cfg.shard_rows,
                             seconds=time.perf_counter() - started)


def measure_generate_profile(source: str | Path, target: str | Path, cfg: Any, *,
                             prompts: RegeneratePrompts, conversations: int | None = None,
                             renderer: Any = None) -> GenerateProfile:
    """Fit a profile to the forwards of a regeneration of ``conversations`` of the run's
    conversations (spread over it; default the larger of :data:`PROFILE_CONVERSATIONS` and
    ``cfg.batch_size``), run as ``dflash prepare --regenerate`` runs it, after a warm-up."""
    import torch

    from lengthwise.dflash.regenerate import TurnGenerator, assistant_turns

    check_one_process()
    k = conversations if conversations is not None else max(PROFILE_CONVERSATIONS,
                                                            cfg.batch_size)
    if k < 1:
        raise ConfigError(f"--profile-steps must be at least 1 conversation, got {k}")
    renderer = renderer if renderer is not None else _renderer(target, cfg)
    convs = _conversations(source, cfg)
    picked = np.unique(np.linspace(0, len(convs) - 1, min(k, len(convs))).round()
                       ).astype(np.int64)
    print(f"lengthwise dflash estimate: timing the regeneration of {picked.size} of the "
          f"{len(convs):,} conversations on {cfg.device} (after a warm-up)", file=sys.stderr,
          flush=True)
    resident.follow_live_tensors(cfg.device)  # as dflash prepare --regenerate: its malloc's cost
    started = time.perf_counter()
    gen = TurnGenerator(target, renderer, cfg)
    if gen.backend != "hf":
        raise ConfigError("--time prices Hugging Face generate; this machine would regenerate "
                          f"with {gen.backend}: time it with --backend hf or price it there")
    loaded = time.perf_counter() - started
    first = convs[int(picked[0])]
    warm = np.asarray(renderer.prompt_ids(first[:assistant_turns(first)[0]]))
    generate_responses(gen.model, [warm], max_new_tokens=2, eos=gen.stops, temperature=0.0,
                       seed=0, batch_size=1, device=gen.device)
    gen.trace = []
    responses: list[int] = []
    for _ in gen.regenerate([copy.deepcopy(convs[int(i)]) for i in picked], seed=cfg.seed,
                            record=lambda turns: responses.extend(len(t[2]) for t in turns)):
        pass
    prof = fit_generate_profile(gen.trace, device=device_name(cfg.device,
                                                              torch.get_num_threads()),
                                responses=[max(1, n) for n in responses],
                                max_new_tokens=cfg.max_new_tokens,
                                start_seconds=loaded + prompts.seconds)
    return dataclasses.replace(prof, fit={**prof.fit, "conversations": int(picked.size),
                                          "load_seconds": round(loaded, 3),
                                          "render_seconds": round(prompts.seconds, 3)})


def _renderer(target: str | Path, cfg: Any) -> Any:
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.target import load_tokenizer

    return ChatRenderer(load_tokenizer(target), enable_thinking=cfg.enable_thinking,
                        name=f"--target {target}")


def estimate_regenerate_time(source: str | Path, target: str | Path, cfg: Any, *,
                             world: int = 1, profile: GenerateProfile | None = None,
                             conversations: int | None = None, show: bool = True,
                             ) -> tuple[GenerateTime, GenerateProfile, RegeneratePrompts]:
    """``(time, profile, prompts priced)`` of ``dflash prepare --regenerate`` of ``source`` at
    ``world`` ranks, priced by ``profile`` or by one measured here."""
    renderer = _renderer(target, cfg)
    prompts = regenerate_prompts(source, renderer, cfg, show=show)
    if profile is None:
        profile = measure_generate_profile(source, target, cfg, prompts=prompts,
                                           conversations=conversations, renderer=renderer)
    timing = predict_generate(prompts, profile, rows=cfg.batch_size,
                              max_new_tokens=cfg.max_new_tokens, max_tokens=cfg.max_tokens,
                              world=world, seed=cfg.seed)
    return timing, profile, prompts
