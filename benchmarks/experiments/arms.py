"""What the batch order does to the model, free of its confounds: two arms, two schedules.

Giving every order the same real tokens under a padded-token budget per micro-batch lets
the order that pads most also take the most optimizer steps. This experiment trains every
order of a *cell* (arm x schedule x global batch) with several paired seeds, in one of two
arms:

* ``data`` (same steps, same data): every order trains the same number of optimizer
  steps, ``k`` per epoch, every sample once per epoch, and each step holds the same real
  tokens (an epoch's tokens over ``k``; a step ends at the sample that brings it closest,
  so steps differ by less than one sample). A step takes the order's planned micro-batches
  in turn, the one at its end cut between samples; whatever an order pads costs it
  compute (more micro-batches per step), never data. ``k`` is the epoch's micro-batches
  of ``random`` over the global batch, so ``random``'s steps are about ``batch``
  micro-batches. The planner's steps of ``batch`` micro-batches then no longer line up
  with the arm's: an order that pads less fills a step with fewer micro-batches, so a
  bucketed order's step may span two of its planned steps.
* ``compute`` (same compute): steps of ``batch`` planned micro-batches (an epoch's
  incomplete last step skipped, as :class:`~lengthwise.train.loop.StepBatches` does)
  until the run has spent the compute budget, counted by
  :func:`~lengthwise.demo.flops.train_flops` (machine-independent); the last step stops
  at the micro-batch that reaches it. The budget is what ``random``'s planned
  micro-batches of ``epochs`` epochs cost, so the order that pads more sees less data.

The learning rate follows each arm's own axis (steps, or FLOPs): a linear warm-up over
``warmup_share``, then a cosine to zero at the end (``cosine``) or the peak held
(``constant``). The planner's ``sorted`` order plans the same micro-batches every epoch
(the bucketed orders re-form theirs), so both arms keep ``sorted``'s steps fixed across
epochs. The held-out loss is measured ``eval_points`` times at equal shares of the arm's
axis, overall and per length stratum, with the steps, real tokens, FLOPs and seconds
there; :func:`unigram_loss` is the level a model that learned only token frequencies
reaches.

Example::

    >>> lr_share(0.5, "constant", lr=1.0, warmup_share=0.1), lr_share(1.0, "cosine", lr=1.0)
    (1.0, 0.0)
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError

from experiments.data import held_out, set_lr

__all__ = ["ARMS", "SCHEDULES", "ArmsConfig", "ArmsDesign", "EqualCompute", "EqualData",
           "arm_steps", "batch_shape", "budgets", "drive_arm", "lr_share", "micro_flops_bound",
           "plan_budgets", "run_arm", "unigram_loss"]

#: the arms: same steps and same real tokens per step, or the same FLOPs
ARMS: tuple[str, ...] = ("data", "compute")
#: the learning-rate schedules after the warm-up
SCHEDULES: tuple[str, ...] = ("cosine", "constant")


def _orders() -> tuple[str, ...]:
    from lengthwise.planning.vocabulary import ORDERS

    return tuple(ORDERS)


@dataclass
class ArmsDesign:
    """The design of a two-arm experiment, whatever it trains: orders, seeds, arms, schedules,
    global batches, epochs, the warm-up and the held-out measurements.

    ``batches`` are global batch sizes in micro-batches per optimizer step (over ``world``
    simulated ranks); a cell of a batch size in ``full_batches`` trains every order of
    ``orders``, the others only ``reduced``.
    ``skip`` names (arm, schedule) pairs the design leaves out of ``arms x schedules``.

    Example::

        >>> ArmsDesign(batches=(8,), arms=("data",), schedules=("cosine",)).jobs()[:2]
        [('data', 'cosine', 8, 'sorted', 0), ('data', 'cosine', 8, 'random', 0)]
        >>> [c for c, _ in ArmsDesign(batches=(8,), skip=[("compute", "constant")]).cells()]
        [('data', 'cosine', 8), ('data', 'constant', 8), ('compute', 'cosine', 8)]
    """

    orders: tuple[str, ...] = field(default_factory=_orders)
    reduced: tuple[str, ...] = ("sorted", "random", "bucket-random", "stratified")
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    arms: tuple[str, ...] = ARMS
    schedules: tuple[str, ...] = SCHEDULES
    batches: tuple[int, ...] = (8, 64)
    full_batches: tuple[int, ...] = (8,)
    skip: tuple[tuple[str, str], ...] = ()
    epochs: int = 5
    world: int = 8
    warmup_share: float = 0.05
    eval_points: int = 8
    data_seed: int = 0
    threads: int = 1

    #: the fields that must be positive integers
    POSITIVE = ("epochs", "world", "eval_points", "threads")

    def __post_init__(self) -> None:
        from lengthwise.planning.vocabulary import ORDERS

        self.orders, self.reduced = tuple(self.orders), tuple(self.reduced)
        self.seeds = tuple(int(s) for s in self.seeds)
        self.arms, self.schedules = tuple(self.arms), tuple(self.schedules)
        self.batches, self.full_batches = tuple(self.batches), tuple(self.full_batches)
        self.skip = tuple((str(a), str(s)) for a, s in self.skip)
        for name, values in (("orders", self.orders), ("reduced", self.reduced)):
            bad = [o for o in values if o not in ORDERS]
            if bad or not values:
                raise ConfigError(f"{name} must be among {', '.join(ORDERS)}, got {list(values)}")
        if "random" not in self.orders or "random" not in self.reduced:
            raise ConfigError("orders and reduced must hold random (the reference order)")
        if not set(self.reduced) <= set(self.orders):
            raise ConfigError(f"reduced {list(self.reduced)} must be among orders "
                              f"{list(self.orders)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        for name, values, allowed in (("arms", self.arms, ARMS),
                                      ("schedules", self.schedules, SCHEDULES)):
            if not values or any(v not in allowed for v in values):
                raise ConfigError(f"{name} must be among {', '.join(allowed)}, got "
                                  f"{list(values)}")
        pairs = {(a, s) for a in self.arms for s in self.schedules}
        if not set(self.skip) <= pairs or set(self.skip) == pairs:
            raise ConfigError(f"skip must name some (arm, schedule) pairs of arms x schedules, "
                              f"not all, got {[list(p) for p in self.skip]}")
        for name in self.POSITIVE:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not self.batches or any(not isinstance(b, int) or b < 1 or b % self.world
                                   for b in self.batches):
            raise ConfigError(f"batches must be positive multiples of world ({self.world}), got "
                              f"{list(self.batches)}")
        if not 0 <= self.warmup_share < 1:
            raise ConfigError(f"warmup_share must lie in [0, 1), got {self.warmup_share}")

    def cells(self) -> list[tuple[tuple[str, str, int], tuple[str, ...]]]:
        """Every (arm, schedule, batch) cell with the orders it trains."""
        return [((arm, sched, batch),
                 self.orders if batch in self.full_batches else self.reduced)
                for arm in self.arms for sched in self.schedules for batch in self.batches
                if (arm, sched) not in self.skip]

    def jobs(self) -> list[tuple[str, str, int, str, int]]:
        """Every run: (arm, schedule, batch, order, seed), seed by seed within each cell."""
        return [(*cell, order, seed) for cell, orders in self.cells()
                for seed in self.seeds for order in orders]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = [list(v) if isinstance(v, tuple) else v for v in value]
        return out


@dataclass
class ArmsConfig(ArmsDesign):
    """Settings of the two-arm experiment on the demo's causal LM (the defaults are the
    planned full run).

    Example::

        >>> cfg = ArmsConfig(batches=(8,), arms=("data",), schedules=("cosine",))
        >>> [cell for cell, _ in cfg.cells()]
        [('data', 'cosine', 8)]
    """

    model_size: str = "tiny"
    max_tokens: int = 512
    max_len: int = 256
    min_len: int = 8
    buckets: int = 6
    lr: float = 3e-3
    eval_samples: int = 320
    max_samples: int | None = 2000
    vocab_size: int = 2048

    POSITIVE = (*ArmsDesign.POSITIVE, "max_tokens", "max_len", "min_len", "buckets",
                "eval_samples")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_len >= self.max_len:
            raise ConfigError(f"min_len ({self.min_len}) must be below max_len ({self.max_len})")


def lr_share(share: float, schedule: str, *, lr: float, warmup_share: float = 0.0) -> float:
    """The learning rate at ``share`` (0 to 1) of a run: linear warm-up over
    ``warmup_share``, then a cosine to 0 at 1 (``cosine``) or ``lr`` held (``constant``).

    Example::

        >>> [round(lr_share(s, "cosine", lr=1.0, warmup_share=0.1), 3) for s in (0.05, 0.55)]
        [0.5, 0.5]
        >>> lr_share(0.05, "constant", lr=2.0, warmup_share=0.1)
        1.0
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if share < warmup_share:
        return lr * share / warmup_share
    if schedule == "constant":
        return lr
    frac = min(1.0, (share - warmup_share) / max(1.0 - warmup_share, 1e-12))
    return lr * 0.5 * (1.0 + math.cos(math.pi * frac))


def unigram_loss(train: Sequence[np.ndarray], held: Sequence[np.ndarray], vocab_size: int,
                 ) -> float:
    """Cross-entropy (nats per predicted token) of the held-out samples' predicted tokens
    (all but each sample's first) under the training tokens' unigram distribution, with
    add-one (Laplace) smoothing over the ``vocab_size`` tokens.

    Example::

        >>> import numpy as np
        >>> round(unigram_loss([np.array([1, 1, 2])], [np.array([0, 1])], 4), 4)
        0.8473
    """
    counts = np.bincount(np.concatenate([np.asarray(x, dtype=np.int64) for x in train]),
                         minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    tokens = np.concatenate([np.asarray(x, dtype=np.int64)[1:] for x in held])
    return float(-logp[tokens].mean())


def _units(batch: list[list[int]]) -> list[int]:
    """The samples of a padded micro-batch (its rows flattened), in order."""
    return [int(i) for row in batch for i in row]


class _ArmSteps:
    """Steps formed from a sampler's micro-batches, epoch after epoch: what both arms share.

    ``next()`` gives the next step as micro-batches (rows of dataset indices); :attr:`last`
    is the step it gave last and :attr:`steps` how many it gave (the index of the step
    being formed, as the loop counts it). A subclass forms an epoch's steps from its
    micro-batches in :meth:`_epoch`.
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.last: list[list[list[int]]] = []
        self.steps = 0
        self._steps = self._walk()

    def next(self) -> list[list[list[int]]]:
        self.last = next(self._steps)
        self.steps += 1
        return self.last

    def _walk(self) -> Iterator[list[list[list[int]]]]:
        epoch = self.sampler.epoch
        while True:
            self.sampler.set_epoch(epoch)
            yield from self._epoch(list(self.sampler))
            epoch += 1

    def _epoch(self, batches: list[Any]) -> Iterator[list[list[list[int]]]]:
        raise NotImplementedError


class EqualData(_ArmSteps):
    """Steps of equal real tokens, ``per_epoch`` of them each epoch (arm ``data``).

    ``next()`` gives the next step as micro-batches (rows of dataset indices): the sampler's
    micro-batches in turn, a step ending at the sample that brings its epoch's running real
    tokens closest to ``j x tokens / per_epoch`` (step ``j``); the micro-batch it ends in is
    cut there and its rest opens the next step. The last step of an epoch takes what is
    left, so every sample is trained once per epoch. :attr:`last` is the step ``next()`` gave
    last.

    Example::

        >>> from lengthwise.train.config import LoopConfig
        >>> from lengthwise.train.simulated import simulated_sampler
        >>> lengths = np.random.default_rng(0).integers(8, 200, 400)
        >>> cfg = LoopConfig(grad_accum=8, max_tokens=512, max_len=256)
        >>> steps = EqualData(simulated_sampler("random", lengths, cfg, world=8), lengths, 10,
        ...                   max_len=256)
        >>> tokens = [sum(int(lengths[i]) for b in steps.next() for row in b for i in row)
        ...           for _ in range(10)]
        >>> per = int(lengths.sum()) / 10
        >>> sum(tokens) == int(lengths.sum()), bool(max(abs(t - per) for t in tokens) < 200)
        (True, True)
    """

    def __init__(self, sampler: Any, lengths: np.ndarray, per_epoch: int, *,
                 max_len: int) -> None:
        if per_epoch < 1:
            raise ConfigError(f"per_epoch must be a positive integer, got {per_epoch}")
        self.per_epoch = int(per_epoch)
        self.tokens = np.minimum(np.asarray(lengths, dtype=np.int64), max_len)
        super().__init__(sampler)

    def _epoch(self, batches: list[Any]) -> Iterator[list[list[list[int]]]]:
        units = [_units(b) for b in batches]
        total = int(sum(self.tokens[i] for b in units for i in b))
        done, step = 0, 1
        out: list[list[list[int]]] = []
        for batch in units:
            cur: list[int] = []
            for i in batch:
                n = int(self.tokens[i])
                target = step * total / self.per_epoch
                if step < self.per_epoch and (out or cur) and 2 * (target - done) < n:
                    if cur:
                        out.append([cur])
                    yield out
                    out, cur, step = [], [], step + 1
                cur.append(i)
                done += n
            if cur:
                out.append([cur])
        if out:
            yield out


class EqualCompute(_ArmSteps):
    """Steps of ``batch`` planned micro-batches until ``budget`` FLOPs are spent (arm
    ``compute``).

    An epoch's incomplete last step is skipped; the step that reaches the budget stops at
    the micro-batch that reaches it, and :attr:`done` turns true. ``flops_of(ids, step)``
    counts a micro-batch of dataset indices ``ids`` trained at optimizer step ``step``
    (from 0). :attr:`last` is the step ``next()`` gave last.
    """

    def __init__(self, sampler: Any, lengths: np.ndarray, batch: int, budget: int, *,
                 flops_of: Any) -> None:
        self.batch, self.budget = int(batch), int(budget)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.flops_of = flops_of
        self.spent = 0
        super().__init__(sampler)

    @property
    def done(self) -> bool:
        return self.spent >= self.budget

    def next(self) -> list[list[list[int]]]:
        if self.done:
            raise ConfigError(f"the compute budget of {self.budget:,} FLOPs is spent")
        return super().next()

    def _epoch(self, batches: list[Any]) -> Iterator[list[list[list[int]]]]:
        if len(batches) < self.batch:
            raise ConfigError(f"an epoch has {len(batches)} micro-batches, fewer than one "
                              f"step of {self.batch}")
        for k in range(len(batches) // self.batch):
            step, flops = [], 0
            for b in batches[k * self.batch:(k + 1) * self.batch]:
                step.append(b)
                flops += self.flops_of(_units(b), self.steps)
                if self.spent + flops >= self.budget:
                    break
            self.spent += flops
            yield step


def batch_shape(lengths: Sequence[int], *, max_len: int, pad_multiple: int = 1,
                ) -> tuple[int, int]:
    """Rows and padded width of a padded micro-batch of samples of ``lengths`` (each cut to
    ``max_len``; the width rounded up to ``pad_multiple``), as the pad collator makes it.

    Example::

        >>> batch_shape([5, 300, 12], max_len=256, pad_multiple=8)
        (3, 256)
    """
    if not len(lengths):
        return 0, 0
    longest = min(max(int(n) for n in lengths), int(max_len))
    width = -(-longest // pad_multiple) * pad_multiple
    return len(lengths), width


def _flops_counter(cfg: ArmsConfig, lengths: np.ndarray, vocab_size: int) -> Any:
    from lengthwise.demo.flops import train_flops
    from lengthwise.demo.model import MODEL_SIZES

    size = MODEL_SIZES[cfg.model_size]

    def flops_of(ids: list[int], step: int = 0) -> int:  # the same at every step
        rows, width = batch_shape(lengths[ids], max_len=cfg.max_len)
        return train_flops(rows, width, size, vocab_size=vocab_size)

    return flops_of


def micro_flops_bound(cfg: ArmsConfig, vocab_size: int) -> int:
    """More FLOPs than any one micro-batch of ``cfg`` costs: its rows x width is at most
    ``max_tokens`` and its width at most ``max_len``.

    Example::

        >>> from lengthwise.demo.flops import train_flops
        >>> from lengthwise.demo.model import MODEL_SIZES
        >>> cfg = ArmsConfig()
        >>> bound = micro_flops_bound(cfg, 2048)
        >>> train_flops(2, 256, MODEL_SIZES["tiny"], vocab_size=2048) <= bound
        True
    """
    from lengthwise.demo.flops import token_flops
    from lengthwise.demo.model import MODEL_SIZES

    size = MODEL_SIZES[cfg.model_size]
    attention = int(size.layers) * 4 * cfg.max_len * int(size.hidden)
    return 3 * cfg.max_tokens * (token_flops(size, vocab_size=vocab_size) + attention) + 1


def _loop_config(cfg: ArmsConfig, batch: int, seed: int) -> Any:
    from lengthwise.demo.config import DemoConfig

    # the loop's own schedule is flat (no warm-up): the learning rate is set by the arm
    return DemoConfig(steps=10**9, grad_accum=batch, max_tokens=cfg.max_tokens,
                      max_len=cfg.max_len, lr=cfg.lr, warmup=0, schedule="constant", seed=seed,
                      buckets=cfg.buckets, model_size=cfg.model_size, threads=cfg.threads,
                      progress=False)


def budgets(cfg: ArmsConfig, lengths: np.ndarray, vocab_size: int, batch: int,
            ) -> dict[str, int]:
    """A cell's budgets, from ``random``'s plan at ``data_seed``: ``per_epoch`` steps of arm
    ``data`` (its micro-batches per epoch over ``batch``, at least 1), their real tokens
    per step, and the FLOPs of arm ``compute`` (its micro-batches of ``epochs`` epochs)."""
    from lengthwise.train.simulated import simulated_sampler

    sampler = simulated_sampler("random", lengths, _loop_config(cfg, batch, cfg.data_seed),
                                world=cfg.world)
    return plan_budgets(sampler, _flops_counter(cfg, lengths, vocab_size), epochs=cfg.epochs,
                        batch=batch, tokens=int(np.minimum(lengths, cfg.max_len).sum()))


def plan_budgets(sampler: Any, flops_of: Any, *, epochs: int, batch: int, tokens: int,
                 ) -> dict[str, int]:
    """A cell's budgets from ``sampler``'s plan (``random``'s) of ``epochs`` epochs of
    ``tokens`` real tokens each: ``per_epoch`` steps of arm ``data`` (its micro-batches per
    epoch over ``batch``, at least 1), their real tokens per step, and the FLOPs of arm
    ``compute`` (``flops_of(ids, step)`` of each micro-batch at the step it falls in).

    Example::

        >>> class Plan(list):  # three micro-batches an epoch
        ...     def set_epoch(self, epoch): pass
        >>> b = plan_budgets(Plan([[[0, 1]], [[2]], [[3]]]), lambda ids, step: 10 * len(ids),
        ...                  epochs=2, batch=2, tokens=300)
        >>> b["per_epoch"], b["steps"], b["real_tokens_per_step"], b["flops"]
        (2, 4, 150, 80)
    """
    flops = micro = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for b in sampler:
            flops += flops_of(_units(b), micro // batch)
            micro += 1
    per_epoch = max(1, int(round(micro / epochs / batch)))
    return {"per_epoch": per_epoch, "steps": per_epoch * epochs,
            "real_tokens_per_step": int(round(tokens / per_epoch)), "flops": int(flops),
            "random_micro_batches": micro}


def run_arm(job: tuple[str, str, int, str, int], data: Any, cfg: ArmsConfig, *,
            out: str | Path, budget: dict[str, int] | None = None) -> dict[str, Any]:
    """Train one (arm, schedule, batch, order, seed) run; its figures and curve.

    Writes the step log ``out/ARM-SCHEDULE-bBATCH/ORDER-seedSEED/train_log.jsonl``.
    ``budget`` is the cell's :func:`budgets` (computed when not given).
    """
    from lengthwise.demo.lm import LMTask
    from lengthwise.demo.model import build_model
    from lengthwise.train.device import configure_torch, pick_device
    from lengthwise.train.loop import TrainLoop
    from lengthwise.train.simulated import simulated_sampler

    arm, schedule, batch, order, seed = job
    lengths = data.lengths
    budget = budget or budgets(cfg, lengths, data.vocab_size, batch)
    loop_cfg = _loop_config(cfg, batch, seed)
    device = pick_device("cpu")
    configure_torch(device, threads=cfg.threads, deterministic=True)
    model = build_model(cfg.model_size, vocab_size=data.vocab_size, max_len=cfg.max_len,
                        seed=seed, device=device)
    model.train()
    task = LMTask(model, device=device)
    sampler = simulated_sampler(order, lengths, loop_cfg, world=cfg.world)
    train = data.train
    run_dir = Path(out) / f"{arm}-{schedule}-b{batch}" / f"{order}-seed{seed}"
    loop = TrainLoop(task, order, lengths, lambda i: {"input_ids": train[i]}, loop_cfg,
                     run_dir=run_dir, device=device, sampler=sampler)
    flops_of = _flops_counter(cfg, lengths, data.vocab_size)
    try:
        steps = arm_steps(arm, loop, lengths, budget, batch=batch, max_len=cfg.max_len,
                          flops_of=flops_of)
        trained = drive_arm(loop, steps, arm, budget, schedule=schedule, lr=cfg.lr,
                            warmup_share=cfg.warmup_share, flops_of=flops_of,
                            points=cfg.eval_points,
                            evaluate=lambda: held_out(model, data, max_tokens=cfg.max_tokens,
                                                      device=device))
    finally:
        loop.close()
    trained.pop("records")
    final = trained["curve"][-1]
    return {"arm": arm, "schedule": schedule, "batch": batch, "order": order, "seed": seed,
            **trained, "budget": budget, "eval_loss": final["eval_loss"],
            "strata": final["strata"], "log": str(run_dir / "train_log.jsonl")}


def arm_steps(arm: str, loop: Any, lengths: np.ndarray, budget: dict[str, int], *, batch: int,
              max_len: int, flops_of: Any) -> EqualData | EqualCompute:
    """The arm's steps over ``loop``'s sampler, made the steps ``loop`` trains.

    A micro-batch cut at a step's end is labelled by its own longest sample, whose bucket the
    epoch's plan may give no micro-batch (random's): the step log's shares name every
    bucket, in every epoch (the figures do not read the step log's corrected loss).
    """
    sampler = loop.sampler
    steps: EqualData | EqualCompute
    if arm == "data":
        steps = EqualData(sampler, lengths, budget["per_epoch"], max_len=max_len)
    else:
        steps = EqualCompute(sampler, lengths, batch, budget["flops"], flops_of=flops_of)
    loop.batches = steps  # the arm forms the steps; the loop trains them
    shares = {b: 1.0 for b in range(len(sampler.edges or [0]))}
    for logger in (loop.logger, loop.micro_logger):
        if logger is not None:
            logger.set_bucket_shares(shares)
    loop._follow_epoch = lambda: None
    return steps


def drive_arm(loop: Any, steps: EqualData | EqualCompute, arm: str, budget: dict[str, int], *,
              schedule: str, lr: float, warmup_share: float, flops_of: Any, points: int,
              evaluate: Any) -> dict[str, Any]:
    """Train ``loop`` over ``steps`` to the arm's end (``budget``'s steps, or its FLOPs), the
    learning rate following the arm's axis; ``evaluate()`` (a dict of figures) at ``points``
    equal shares of it. The run's totals, its step records and its curve."""
    total = budget["steps"] if arm == "data" else budget["flops"]
    grid = [total * (i + 1) / points for i in range(points)]
    curve: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    tokens = padded = flops = micro = 0
    seconds = 0.0
    started, cpu = time.perf_counter(), time.process_time()
    set_lr(loop, lr_share(0.0, schedule, lr=lr, warmup_share=warmup_share))
    while not (arm == "compute" and steps.done):
        rec = _train_step(loop, steps, flops_of)
        records.append(rec)
        tokens += int(rec["real_tokens"])
        padded += int(rec["padded_tokens"])
        flops += rec["flops"]
        micro += rec["micro_batches"]
        seconds += float(rec["seconds"])
        at = loop.step_count if arm == "data" else flops
        set_lr(loop, lr_share(min(1.0, at / total), schedule, lr=lr, warmup_share=warmup_share))
        while len(curve) < points and at >= grid[len(curve)] - 1e-6:
            curve.append({"step": loop.step_count, "tokens": tokens, "flops": flops,
                          "seconds": seconds, **evaluate()})
        if arm == "data" and loop.step_count >= total:
            break
    step_tokens = [int(r["real_tokens"]) for r in records]
    return {"steps": loop.step_count, "micro_batches": micro, "real_tokens": tokens,
            "padded_tokens": padded, "padding_efficiency": tokens / padded if padded else None,
            "flops": flops, "max_micro_flops": max(r["max_micro_flops"] for r in records),
            "step_tokens_min": min(step_tokens),
            "step_tokens_max": max(step_tokens), "train_seconds": seconds,
            "wall_seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu, "curve": curve, "records": records}


def _train_step(loop: Any, steps: Any, flops_of: Any) -> dict[str, Any]:
    """One step of ``loop`` (whose ``batches`` is ``steps``): the loop's record, with the
    step's FLOPs and micro-batches."""
    rec = dict(loop.step())
    each = [flops_of(_units(b), loop.step_count - 1) for b in steps.last]
    rec["flops"], rec["max_micro_flops"] = sum(each), max(each)
    rec["micro_batches"] = len(steps.last)
    return rec
