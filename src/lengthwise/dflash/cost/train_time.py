"""Seconds of a DFlash training run before it runs: the plan's exact work, priced per unit.

:func:`plan_work` replays the plan ``dflash train`` makes (samples, order, budgets, epochs,
ranks) and counts each step's micro-batches and FLOPs per rank (:func:`micro_work`, by
:mod:`~lengthwise.dflash.cost.flops`). A :class:`DeviceProfile` prices them: seconds per
micro-batch and per GFLOP, fitted on a few of the run's own steps trained here
(:func:`measure_profile`), plus an evaluation and the start. The slowest rank sets each
step's time; :func:`estimate_time` puts it together. See docs/dflash.md, "Time before launch".

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

import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.dflash.cost.profile import (
    Profile,
    check_one_process,
    device_name,
    duration,
    fit_costs,
)
from lengthwise.errors import ConfigError, DataError

__all__ = ["MAX_PLANNED", "PROFILE_STEPS", "DeviceProfile", "RunTime", "StepWork",
           "estimate_time", "evaluations", "fit_profile", "measure_profile", "micro_work",
           "plan_work", "predict", "run_samples", "train_command"]

#: timed steps the profile is fitted on (one more before them warms up, one after evaluates)
PROFILE_STEPS = 4
#: the most steps (times ranks) a plan is replayed for: each is counted one by one
MAX_PLANNED = 1_000_000
_CHUNK = 65536  # micro-batches whose work is counted in one pass


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
class DeviceProfile(Profile):
    """Seconds per unit of a DFlash step's work on one device: ``micro_batch`` per
    micro-batch whatever its size, ``per_gflop`` per GFLOP; ``eval_seconds`` of one
    held-out evaluation; ``start_seconds`` around the steps; ``fit``: the timed steps.

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
    """``(FLOPs, padded tokens)`` of each micro-batch of ``batches`` (each a non-empty list
    of rows of sample positions), all counted at once: a padded micro-batch holds its
    samples at the longest, rounded up to ``pad_multiple``; a packed row (``capacity``) is
    one sample of ``capacity`` tokens holding its samples' anchors.

    Example::

        >>> from lengthwise.dflash.cost.flops import StepFlops
        >>> f = StepFlops(1.0, 0.0, 0.0, 10.0, 0.0, 0.0, block_size=2)
        >>> work, tokens = micro_work(f, np.array([4, 2]), np.array([3, 1]), [[[0], [1]], [[1]]])
        >>> work.tolist(), tokens.tolist()
        ([128.0, 22.0], [8, 2])
    """
    from lengthwise.dflash.cost.flops import batch_flops
    from lengthwise.planning.cost import round_up

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
        coef = np.array([0.0, float(np.sum(g / y) / np.sum((g / y) ** 2))])
    coef, errors = fit_costs(x, y, coef)
    return DeviceProfile(device=device, micro_batch=float(round(coef[0], 12)),
                         per_gflop=float(round(coef[1], 12)), eval_seconds=float(eval_seconds),
                         start_seconds=float(start_seconds),
                         fit={"steps": int(y.size), "seconds": y.round(4).tolist(),
                              "gflop": g.round(3).tolist(), "micro_batches": m.tolist(),
                              **errors})


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
    """``(lengths, anchors, FLOPs per unit)`` of the samples ``dflash train`` trains on
    ``data``: each cut to ``max_len``, its anchors from its own supervised positions, and
    the :class:`~lengthwise.dflash.cost.flops.StepFlops` of the target (``config``: its
    ``transformers`` config, read from ``run.target`` when not given), without the target's
    forward when the run reads a feature cache (``run.features``)."""
    from lengthwise.dflash.cost.flops import anchor_counts, step_flops
    from lengthwise.dflash.cost.target_config import read_target_config
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
    ``data`` at ``world`` ranks; ``samples``: :func:`run_samples`, read here when not given.
    More than :data:`MAX_PLANNED` steps times ranks are refused before anything is counted."""
    from lengthwise.dflash.recipe import _with_epochs
    from lengthwise.train.config import PACKED
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
    """Held-out evaluations a run makes: every ``eval_every`` steps (a tenth of the run by
    default), none without held-out samples."""
    every = run.eval_every if run.eval_every is not None else max(1, cfg.steps // 10)
    return cfg.steps // every if every and run.eval_samples else 0


def train_command(cfg: Any, run: Any, *, out: str | Path, steps: int) -> list[str]:
    """The ``dflash train`` command of the run ``(cfg, run)`` for ``steps`` steps into ``out``:
    the same target, data and settings, no checkpoints, one held-out evaluation at the end.

    Example::

        >>> from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings
        >>> argv = train_command(DFlashTrainConfig(steps=9, block_size=4),
        ...                      RunSettings(target="t", data="d"), out="o", steps=6)
        >>> argv[3:9], "--block-size" in argv, argv[argv.index("--steps") + 1]
        (['dflash', 'train', '--target', 't', '--data', 'd'], True, '6')
    """
    from lengthwise.cli.dflash._settings import run_flags

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
        argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def measure_profile(cfg: Any, run: Any, *, steps: int = PROFILE_STEPS, data: Any = None,
                    samples: tuple[np.ndarray, np.ndarray, Any] | None = None,
                    ) -> DeviceProfile:
    """Run the run's first ``steps + 2`` steps as a ``dflash train`` command of its own in a
    temporary folder and fit a profile to the seconds its log records; its start is the
    command's wall time around its steps. Prints one line to stderr; the command's output
    is shown only if it fails."""
    import subprocess

    from lengthwise.dflash.prepared import open_prepared

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
    """The run's predicted time at ``world`` ranks: priced by ``profile``, else by one
    measured here (:func:`measure_profile`)."""
    from lengthwise.dflash.prepared import open_prepared

    data = open_prepared(run.data)
    samples = run_samples(data, cfg, run)  # once: the run's plan and the timed steps' share it
    work, trained = plan_work(data, cfg, run, world=world, samples=samples)
    if profile is None:
        profile = measure_profile(cfg, run, steps=steps, data=data, samples=samples)
    return predict(work, profile, evals=evaluations(trained, run)), profile
