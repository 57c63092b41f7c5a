"""A DFlash run's planned work and a device profile timed on it (the torch side of run_time).

:func:`plan_work` replays the plan ``dflash train`` makes for a run (its samples, order,
budgets, epochs and ranks) and counts each step's micro-batches and FLOPs per rank
(:func:`lengthwise.dflash.run_time.micro_work`), with anchors from each sample's own
supervised positions. :func:`measure_profile` trains the run's first few steps for real,
as a ``dflash train`` command of its own in a temporary folder (the same target, data,
draft and settings: :func:`train_command`), reads each step's seconds from its log and
fits a :class:`~lengthwise.dflash.run_time.DeviceProfile`: the first step (warm-up) is
left out, the last one also evaluates the held-out set, and what the command spends
around its steps (starting Python, imports, loading the target, building the draft,
saving) is its start. :func:`estimate_time` puts them together.

Example::

    >>> from lengthwise.dflash.run_time import DeviceProfile
    >>> estimate_time(cfg, run, profile=DeviceProfile("cpu", 0.0, 0.02)).render()  # doctest: +SKIP
    'about 3 h 10 min for 2 epochs (1,200 steps: 9.5 s a step, 1 h 35 min an epoch; ...'
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.dflash.run_time import (
    DeviceProfile,
    RunTime,
    StepWork,
    fit_profile,
    micro_work,
    predict,
)
from lengthwise.errors import ConfigError

__all__ = ["MAX_PLANNED", "PROFILE_STEPS", "device_name", "estimate_time", "evaluations",
           "measure_profile", "plan_work", "run_samples", "step_flops", "train_command"]

#: timed steps the profile is fitted on (one more before them warms up, one after evaluates)
PROFILE_STEPS = 4
#: the most steps (times ranks) a plan is replayed for: each is counted one by one
MAX_PLANNED = 1_000_000
_CHUNK = 65536  # micro-batches whose work is counted in one pass


def step_flops(config: dict[str, Any], cfg: Any) -> Any:
    """The :class:`~lengthwise.dflash.step_cost.StepFlops` of a target's ``config.json`` and
    a run's draft (its layers sized as the target's, as :func:`~lengthwise.dflash.recipe.new_draft`
    builds it)."""
    from lengthwise.dflash.step_cost import StepFlops

    c = config.get("text_config") or config
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    kv = int(c.get("num_key_value_heads") or heads)
    layers = int(c["num_hidden_layers"])
    return StepFlops.of_shape(hidden=hidden, q_dim=heads * head_dim, kv_dim=kv * head_dim,
                              intermediate=int(c["intermediate_size"]),
                              vocab=int(c["vocab_size"]), target_layers=layers,
                              draft_layers=cfg.draft_layers,
                              num_features=cfg.num_features or cfg.draft_layers,
                              block_size=cfg.block_size)


def run_samples(data: Any, cfg: Any, run: Any, *,
                config: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
    """``(lengths, anchors, FLOPs per unit)`` of the samples ``dflash train`` trains on
    ``data``: each cut to ``max_len``, its anchors from its own supervised positions, and the
    :class:`~lengthwise.dflash.step_cost.StepFlops` of the target (``config``: its
    ``config.json``, read from ``run.target`` when not given), without the target's forward
    when the run reads a feature cache (``run.features``). Steps and epochs leave them as
    they are, so a plan of any length reads them once."""
    from lengthwise.dflash.recipe import split_samples
    from lengthwise.dflash.step_cost import anchor_counts
    from lengthwise.dflash.target import check_causal_lm

    _, train_idx, _ = split_samples(data, cfg, run.eval_samples, seed=run.split_seed)
    lengths = np.minimum(data.lengths[train_idx], cfg.max_len)
    anchors = anchor_counts(lengths, num_anchors=cfg.num_anchors, block_size=cfg.block_size,
                            max_slots=cfg.slot_budget, max_tokens=cfg.max_tokens,
                            pairs=data.anchor_pairs(train_idx, cfg.max_len))
    flops = step_flops(config if config is not None else check_causal_lm(run.target), cfg)
    if run.features:  # the timed steps read the cache too (train_command passes --features)
        flops = dataclasses.replace(flops, target_token=0.0, target_pair=0.0)
    return lengths, anchors, flops


def plan_work(data: Any, cfg: Any, run: Any, *, world: int = 1,
              config: dict[str, Any] | None = None,
              samples: tuple[np.ndarray, np.ndarray, Any] | None = None,
              ) -> tuple[StepWork, Any]:
    """``(work of every step, the config the run trains with)`` of ``dflash train`` on
    ``data`` (:func:`~lengthwise.dflash.prepared.open_prepared`) at ``world`` ranks.

    ``run.epochs`` sets the steps as training does; more than :data:`MAX_PLANNED` steps
    times ranks are refused before anything is counted. ``samples``: :func:`run_samples` of
    the run, read here when not given (``config`` is then the target's ``config.json``).
    """
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


def device_name(device: str, threads: int | None) -> str:
    """The device a profile was measured on, as the estimate names it."""
    if str(device).startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    from lengthwise.train.device import cpu_model

    return f"this machine's CPU ({cpu_model()}, {threads or os.cpu_count()} thread(s))"


def train_command(cfg: Any, run: Any, *, out: str | Path, steps: int) -> list[str]:
    """The ``dflash train`` command of the run ``(cfg, run)`` for ``steps`` steps into ``out``:
    the same target, data and settings, no checkpoints, one held-out evaluation at the end.

    Example::

        >>> from lengthwise.dflash.recipe import RunSettings
        >>> from lengthwise.dflash.train_config import DFlashTrainConfig
        >>> argv = train_command(DFlashTrainConfig(steps=9, block_size=4),
        ...                      RunSettings(target="t", data="d"), out="o", steps=6)
        >>> argv[3:9], "--block-size" in argv, argv[argv.index("--steps") + 1]
        (['dflash', 'train', '--target', 't', '--data', 'd'], True, '6')
    """
    from lengthwise.cli.dflash._settings import FLAGS

    fixed = {"steps": steps, "checkpoint_every": 0, "eval_every": steps}
    argv = [sys.executable, "-m", "lengthwise", "dflash", "train", "--target", str(run.target),
            "--data", str(run.data), "--out", str(out), "--overwrite", "--no-progress"]
    for name, kind, _ in FLAGS:
        if name in ("epochs", "warmup", "wandb_project", "tensorboard"):
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
    temporary folder and fit a profile to the seconds its log records.

    Its start is the command's wall time around its steps (Python, imports, loading the
    target, building the draft). Prints one line to stderr; the command's output is held
    back and shown only if it fails. Refused under a launcher of several processes: the
    profile is one device's. ``samples``: :func:`run_samples` of the run, where read already.
    """
    import subprocess

    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.pytorch.dist import launched_world

    if launched_world() is not None:
        raise ConfigError("--time measures a profile in one process: run the estimate "
                          "without torchrun, with --world N for the ranks of the run")
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
