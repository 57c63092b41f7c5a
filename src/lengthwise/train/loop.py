"""A training loop for any task, built from lengthwise's parts.

A :class:`TrainLoop` owns the :class:`~lengthwise.pytorch.sampler.BucketBatchSampler`
(with ``yield_rows=True``) and its collator, AdamW, the warm-up schedule
(:func:`~lengthwise.train.schedule.lr_factor`), the
:class:`~lengthwise.train.StepLogger`, asynchronous checkpoints with exact
resume (:class:`~lengthwise.train.Checkpointer`), an optional
:class:`~lengthwise.train.SpikeGuard`, and DDP under ``torchrun``. What is
trained and how its loss is computed is a *task* (:class:`Task`): the causal
LM of the demo (``lengthwise.demo.lm``), or the DFlash draft of
:mod:`lengthwise.dflash.train`.

The step loss is a sum divided by a normaliser summed over *every* micro-batch
of the step on every rank (predicted tokens for the LM, slot weights for
DFlash), so each token weighs the same wherever it lands. Each rank's backward
uses ``loss_sum * world_size / global_normaliser`` because DDP averages
gradients over ranks.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from lengthwise.doctor.context import PLAN_EVENT
from lengthwise.errors import ConfigError
from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.dist import GroupInfo, all_reduce_sum
from lengthwise.pytorch.sampler import BucketBatchSampler
from lengthwise.train import (
    Checkpointer,
    SpikeGuard,
    StepLogger,
    bucket_token_shares,
    load_checkpoint,
)
from lengthwise.train.checkpoint.folder import CheckpointError, CorruptCheckpointError
from lengthwise.train.config import PACKED, LoopConfig
from lengthwise.train.device import rank_world, say
from lengthwise.train.schedule import lr_factor
from lengthwise.train.step_logger.rollback import log_files, rolled_back_path

__all__ = ["MicroOut", "StepBatches", "Task", "TrainLoop", "make_collator", "make_sampler"]

#: the keys of a checkpoint's ``extra`` that hold the step logs' running fields
LOG_STATE, MICRO_LOG_STATE = "step_logger", "micro_logger"
#: the step record's field saying why a step made no update, and its values: no token to
#: learn on any rank (the loss normaliser is 0), a NaN or infinite loss, a loss spike
SKIP_REASON = "skip_reason"
NOTHING_TO_LEARN, NON_FINITE_LOSS, LOSS_SPIKE = "nothing_to_learn", "non_finite_loss", "loss_spike"


@dataclass
class MicroOut:
    """What a task's forward returns for one micro-batch."""

    loss: Any  # summed loss (a differentiable scalar tensor)
    norm: float  # this micro-batch's share of the step's normaliser
    stats: dict[str, float] = field(default_factory=dict)  # sums reduced over the step
    sample_losses: list[float] | None = None  # mean loss of each sample
    sample_weights: list[float] | None = None  # each sample's share of the loss normaliser


class Task(Protocol):
    """What a :class:`TrainLoop` trains.

    A task may also define ``checkpoint_files() -> dict[str, str]``: small text
    files saved into every checkpoint folder (e.g. the model's config).
    """

    model: Any

    def prepare(self, batch: dict[str, Any], rows: list[list[int]], step: int) -> Any:
        """The task's input for one collated micro-batch (before any forward)."""

    def normaliser(self, prepared: Any) -> float:
        """This micro-batch's share of the loss normaliser (known before the forward)."""

    def forward(self, net: Any, prepared: Any) -> MicroOut:
        """Loss sum and statistics of one micro-batch (``net`` may be DDP-wrapped)."""

    def step_fields(self, stats: dict[str, float]) -> dict[str, Any]:
        """Extra fields of the step record from the step's summed statistics."""


def make_sampler(order: str, lengths: np.ndarray, cfg: LoopConfig, *, rank: int = 0,
                 world: int = 1, check_world_size: bool = True) -> Any:
    """The sampler of one order; ``packed`` plans rows of ``max_len`` tokens.

    Packed micro-batches hold ``max_tokens // max_len`` rows, the same tokens per
    micro-batch as the padded orders. ``check_world_size=False`` plans for ``world``
    ranks in a process that is not one of them (:mod:`lengthwise.train.simulated`).
    """

    budget: dict[str, Any] = {"max_tokens": cfg.max_tokens, "order": order}
    if order == PACKED:
        budget = {"max_tokens": cfg.max_len, "order": "stratified", "layout": "pack",
                  "rows_per_batch": max(1, cfg.max_tokens // cfg.max_len)}
    plan = PlanConfig(buckets=cfg.buckets, grad_accum=cfg.grad_accum, max_len=cfg.max_len,
                      pad_multiple=cfg.pad_multiple, **budget)
    return BucketBatchSampler(lengths, plan, num_replicas=world, rank=rank, seed=cfg.seed,
                              yield_rows=True, check_world_size=check_world_size)


def make_collator(order: str, cfg: LoopConfig, sampler: Any) -> Callable[..., Any]:
    """The collator of ``sampler``'s plan (:func:`make_sampler`): padded rows, or packed rows.

    It truncates every sample to the length the plan counted (``max_len``), pads to
    the plan's ``pad_multiple`` and checks each micro-batch against the budget;
    packed rows are closed to ``max_len`` with a filler sample.
    """
    if order == PACKED:
        return sampler.collator(pad_token_id=0, pad_to_capacity=True,
                                return_flash_attn_kwargs=False)
    pad = sampler.collator(pad_token_id=0)
    return lambda rows: pad([s for row in rows for s in row])


class StepBatches:
    """The next ``grad_accum`` micro-batches (as rows of dataset indices), epoch after epoch.

    An epoch's incomplete last step is skipped, its samples left out of that epoch; with
    ``keep_last`` it is trained as a shorter step, so every sample is trained once per epoch.

    Example::

        >>> from lengthwise import BucketBatchSampler, PlanConfig
        >>> sampler = BucketBatchSampler([5, 9, 30, 60, 7, 12], PlanConfig(max_tokens=64),
        ...                              yield_rows=True)
        >>> steps = StepBatches(sampler, 3, keep_last=True)
        >>> len(sampler), [len(steps.next()) for _ in range(3)], sampler.epoch
        (4, [3, 1, 3], 1)
    """

    def __init__(self, sampler: Any, grad_accum: int, *, keep_last: bool = False) -> None:
        self.sampler, self.grad_accum, self.keep_last = sampler, grad_accum, keep_last
        self._it = iter(sampler)

    def next(self) -> list[list[list[int]]]:
        for _ in range(2):
            batches: list[list[list[int]]] = []
            for batch in self._it:
                batches.append(batch)
                if len(batches) == self.grad_accum:
                    return batches
            if batches and self.keep_last:  # the epoch moves on at the next call
                return batches
            self.sampler.set_epoch(self.sampler.epoch + 1)
            self._it = iter(self.sampler)
        raise ConfigError(f"an epoch has fewer than grad_accum={self.grad_accum} micro-batches "
                           "per rank; use more data, a smaller max_tokens or a smaller grad_accum")


class TrainLoop:
    """Train ``task.model`` one optimizer step at a time on an order's micro-batches.

    ``sample(i)`` returns dataset sample ``i`` as the collator takes it. Writes
    ``run_dir/train_log.jsonl`` and, with ``cfg.checkpoint_every``,
    ``run_dir/checkpoints``; with ``cfg.resume`` it continues from the newest one, its log
    too: the running fields of the records come back from the checkpoint, and the lines
    logged after it move to ``run_dir/train_log.rolled_back.jsonl``
    (:meth:`~lengthwise.train.StepLogger.roll_back`). A resume with no checkpoint starts
    from step 0 in a folder without logs, and is refused (a :class:`ConfigError`) where
    starting over would delete an earlier run's log. A skipped step's record says why
    (``skip_reason``: ``nothing_to_learn``, ``non_finite_loss`` or ``loss_spike``).
    A task with a ``check_data(sample, size)`` method checks the data set before the
    first step. A step with nothing to learn on any rank (normaliser 0) makes no update.
    ``log_sinks`` go to the :class:`~lengthwise.train.StepLogger` (``wandb``,
    ``tensorboard_dir``).

    ``sampler`` replaces the order's own sampler, e.g. a
    :class:`~lengthwise.train.simulated.SimulatedWorld` that trains every rank of a
    larger job in this process. With ``micro_log`` the loop also writes
    ``run_dir/micro_log.jsonl``: one line per micro-batch of simulated rank 0 (micro-batch
    ``k`` of a step is rank ``k % micro_ranks``'s), in the step log's format, its
    ``loss`` that one micro-batch's: the view of a job that logs each micro-batch's loss
    on rank 0. With ``keep_last_step`` an epoch's incomplete last step is trained as a
    shorter step (:class:`StepBatches`), so every sample is trained once per epoch.
    """

    def __init__(self, task: Task, order: str, lengths: np.ndarray,
                 sample: Callable[[int], Any], cfg: LoopConfig, *, run_dir: str | Path,
                 device: Any, info: GroupInfo | None = None,
                 log_sinks: dict[str, Any] | None = None, sampler: Any = None,
                 micro_log: bool = False, micro_ranks: int = 1,
                 keep_last_step: bool = False) -> None:
        self.task, self.order, self.sample, self.cfg, self.info = task, order, sample, cfg, info
        self.rank, self.world = rank_world(info)
        self.device = device
        run_dir = Path(run_dir)
        self.log_path = run_dir / "train_log.jsonl"
        ckpt_dir = run_dir / "checkpoints"
        model = task.model
        self.net = model
        if self.world > 1:
            self.net = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda" or None)
        warm = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, steps=cfg.steps, warmup=warm,
                                                schedule=cfg.schedule))
        self.sampler = sampler if sampler is not None else make_sampler(
            order, lengths, cfg, rank=self.rank, world=self.world)
        self.collate = make_collator(order, cfg, self.sampler)
        check_data = getattr(task, "check_data", None)
        if check_data is not None:  # a task may refuse data it cannot train on, before step 1
            check_data(sample, int(len(lengths)))
        self.guard = (SpikeGuard(window=50, warmup=min(20, max(3, cfg.steps // 10)), sync=False)
                      if cfg.spike_guard else None)
        self.step_count = 0
        #: steps of this process whose loss was NaN or infinite, and the first of them
        self.non_finite_steps = 0
        self.first_non_finite: int | None = None
        self.resumed_from: str | None = None
        extra: dict[str, Any] = {}
        micro_path = run_dir / "micro_log.jsonl"
        if cfg.resume and Checkpointer(ckpt_dir).latest() is not None:
            state = load_checkpoint(ckpt_dir, model=model, optimizer=self.optimizer,
                                    scheduler=self.scheduler, sampler=self.sampler)
            self.step_count = int(state["step"])
            self.resumed_from = str(state["path"])
            extra = state.get("extra") or {}
            if not isinstance(extra, dict) or LOG_STATE not in extra:
                raise CheckpointError(
                    f"{self.resumed_from} holds no step-log state: it was written by an older "
                    "lengthwise, which this version does not resume; train without resume to "
                    "start over, or into another folder")
            if self.guard is not None and extra.get("spike_guard"):
                self.guard.load_state_dict(extra["spike_guard"])
        else:
            if cfg.resume:
                _check_nothing_lost([self.log_path, *([micro_path] if micro_log else [])],
                                    ckpt_dir)
                say(info, f"lengthwise: resume: no checkpoint under {ckpt_dir}; "
                          f"{order} starts from step 0 with a fresh log")
            if self.rank == 0:  # a fresh run starts a fresh log
                for path in (self.log_path, rolled_back_path(self.log_path)):
                    path.unlink(missing_ok=True)
        self._shares_epoch = self.sampler.epoch  # the epoch whose plan gave the logger's shares
        # both logs take the plan's bucket shares and one entry per bucket edge
        log_options = {"bucket_shares": bucket_token_shares(self.sampler.plan),
                       "num_buckets": len(self.sampler.edges or [0]), "rank": self.rank,
                       "world_size": self.world}
        self.logger = StepLogger(self.log_path, **log_options, **(log_sinks or {}))
        # the guard writes no events of its own: a skipped step is marked in its step record
        # (``skipped``), and an event line carrying ``step`` and ``loss`` would read as a
        # second record of that step to log readers
        if self.resumed_from is not None:
            _resume_log(self.logger, extra[LOG_STATE], self.step_count, self.resumed_from)
            rolled = self.logger.rolled_back
            self.logger.event("resume", step=self.step_count, path=self.resumed_from,
                              rolled_back=rolled.lines,
                              rolled_back_to=None if rolled.side_file is None
                              else str(rolled.side_file))
        else:  # a fresh log names its order first: the doctor does not prescribe it again
            self.logger.event(PLAN_EVENT, order=self.sampler.config.order,
                              layout=self.sampler.config.layout, strategy=order)
        self.micro_ranks = int(micro_ranks)
        self.micro_logger = None
        self._micro_lines = 0  # the number of the micro-batch log's last line
        if micro_log:
            if self.micro_ranks < 1 or cfg.grad_accum % self.micro_ranks:
                raise ConfigError(f"grad_accum={cfg.grad_accum} must be a multiple of "
                                  f"micro_ranks={self.micro_ranks}")
            if self.rank == 0 and not self.resumed_from:
                for path in (micro_path, rolled_back_path(micro_path)):
                    path.unlink(missing_ok=True)
            self.micro_logger = StepLogger(micro_path, **log_options)
            if self.resumed_from is not None:
                _resume_log(self.micro_logger, extra.get(MICRO_LOG_STATE), self.step_count,
                            self.resumed_from, key="optimizer_step")
                self._micro_lines = int(self.micro_logger.state_dict()["last_step"] or 0)
            # the edges name each bucket's length range (bucket k: edges[k-1] < length <=
            # edges[k]) for the doctor
            edges = self.sampler.edges
            self.micro_logger.event(PLAN_EVENT, order=self.sampler.config.order,
                                    layout=self.sampler.config.layout, strategy=order,
                                    view="micro-batch", rank=0, world_size=self.micro_ranks,
                                    edges=None if edges is None else [int(e) for e in edges])
        self.checkpointer = (Checkpointer(ckpt_dir, keep=cfg.keep_checkpoints, logger=self.logger)
                             if cfg.checkpoint_every else None)
        self._saved_step = self.step_count if self.resumed_from is not None else None
        self.batches = StepBatches(self.sampler, cfg.grad_accum, keep_last=keep_last_step)

    @property
    def done(self) -> bool:
        """Whether ``cfg.steps`` optimizer steps are trained."""
        return self.step_count >= self.cfg.steps

    def _sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        return all_reduce_sum(np.asarray(values, dtype=np.float64), self.info).tolist()

    def step(self) -> dict[str, Any]:
        """Train one optimizer step and return its log record."""
        self.logger.reset_timer()
        micro = []
        steps = self.batches.next()
        if self.sampler.epoch != self._shares_epoch:
            self._follow_epoch()
        for rows in steps:
            batch = self.collate([[self.sample(i) for i in row] for row in rows])
            micro.append((batch, self.task.prepare(batch, rows, self.step_count)))
        (total,) = self._sum([float(sum(self.task.normaliser(p) for _, p in micro))])
        scale = self.world / total if total > 0 else 0.0
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        stats: dict[str, float] = {}
        micro_rank0: list[dict[str, Any]] = []
        for k, (batch, prepared) in enumerate(micro):
            sync = k == len(micro) - 1 or self.world == 1
            with contextlib.nullcontext() if sync else self.net.no_sync():
                out = self.task.forward(self.net, prepared)
                (out.loss * scale).backward()
            value = out.loss.detach()  # a tensor: read at the end of the step, not here
            loss_sum += value.double()
            for key, v in out.stats.items():
                stats[key] = stats.get(key, 0.0) + float(v)
            extra = ({} if out.sample_losses is None else
                     {"sample_losses": out.sample_losses, "sample_weights": out.sample_weights})
            bucket = batch.get("bucket", -1)
            record = dict(loss=value / out.norm if out.norm > 0 else None,
                          real_tokens=batch["real_tokens"], padded_tokens=batch["padded_tokens"],
                          samples=batch["samples"], bucket=bucket if bucket >= 0 else None,
                          **extra)
            self.logger.record_micro(**record)
            if self.micro_logger is not None and k % self.micro_ranks == 0:
                micro_rank0.append(record)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.task.model.parameters(), self.cfg.clip)
        keys = sorted(stats)
        reduced = self._sum([float(loss_sum), *(stats[k] for k in keys)])
        loss = reduced[0] / total if total > 0 else None  # None: there is no loss to take
        skipped, reason = True, NOTHING_TO_LEARN  # nothing supervised in the whole step
        if loss is not None:
            skipped = bool(self.guard.check(loss, step=self.step_count + 1) if self.guard
                           else False)
            reason = LOSS_SPIKE if math.isfinite(loss) else NON_FINITE_LOSS
            if not math.isfinite(loss):
                self.non_finite_steps += 1
                self.first_non_finite = self.first_non_finite or self.step_count + 1
        lr = self.optimizer.param_groups[0]["lr"]
        if not skipped:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        fields = self.task.step_fields(dict(zip(keys, reduced[1:], strict=True)))
        if skipped:
            fields[SKIP_REASON] = reason
        rec = self.logger.step(self.step_count, epoch=self.sampler.epoch, loss=loss, lr=lr,
                               grad_norm=grad_norm, skipped=skipped, **fields)
        # line numbers as if every step held grad_accum micro-batches per rank (a short last
        # step leaves a gap); a step given more (by a replaced ``batches``) goes on from there
        first = max((self.step_count - 1) * (self.cfg.grad_accum // self.micro_ranks),
                    self._micro_lines)
        for g, record in enumerate(micro_rank0):  # one line per micro-batch of rank 0
            self.micro_logger.record_micro(**record)
            self.micro_logger.step(first + g + 1, epoch=self.sampler.epoch, lr=lr,
                                   skipped=skipped, optimizer_step=self.step_count)
        self._micro_lines = first + len(micro_rank0)
        if self.checkpointer is not None and self.step_count % self.cfg.checkpoint_every == 0:
            self.checkpoint()
        return rec

    def checkpoint(self) -> bool:
        """Save (in the background) a checkpoint of the steps done, unless it is saved already.

        Returns whether the run has one of this step (``False`` without ``checkpoint_every``).
        """
        if self.checkpointer is None:
            return False
        if self._saved_step != self.step_count:
            extra_state = {LOG_STATE: self.logger.state_dict()}
            if self.micro_logger is not None:
                extra_state[MICRO_LOG_STATE] = self.micro_logger.state_dict()
            if self.guard is not None:
                extra_state["spike_guard"] = self.guard.state_dict()
            files = getattr(self.task, "checkpoint_files", None)  # a task's optional files
            self.checkpointer.save(self.step_count, model=self.task.model,
                                   optimizer=self.optimizer, scheduler=self.scheduler,
                                   sampler=self.sampler, extra=extra_state,
                                   files=files() if files is not None else None)
            self._saved_step = self.step_count
        return True

    def _follow_epoch(self) -> None:
        """Give the logger the bucket shares of the sampler's current epoch.

        Each epoch has its own plan, and ``random`` labels a micro-batch by its
        longest sample, so each epoch holds its own set of buckets.
        """
        shares = bucket_token_shares(self.sampler.plan)
        self.logger.set_bucket_shares(shares)
        if self.micro_logger is not None:
            self.micro_logger.set_bucket_shares(shares)
        self._shares_epoch = self.sampler.epoch

    def close(self) -> None:
        """Wait for the last checkpoint and close the log. Idempotent."""
        try:
            if self.checkpointer is not None:
                self.checkpointer.close()
        finally:
            try:
                if self.micro_logger is not None:
                    self.micro_logger.close()
            finally:
                self.logger.close()


def _check_nothing_lost(logs: list[Path], ckpt_dir: Path) -> None:
    """Refuse a resume with no checkpoint where starting over would delete earlier ``logs``."""
    earlier = [p for log in logs for p in log_files(log)]
    if earlier:
        raise ConfigError(f"resume: no checkpoint under {ckpt_dir} to resume from, and "
                          f"{ckpt_dir.parent} holds an earlier run's "
                          f"{', '.join(p.name for p in earlier)}: train without resume to "
                          "start over (it replaces them), or into another folder")


def _resume_log(logger: Any, state: Any, step: int, checkpoint: str, key: str = "step") -> None:
    """Continue ``logger`` from a checkpoint of ``step``: its running fields from ``state``,
    its file without the lines past the step. With no ``state`` (the micro-batch log of a run
    that kept none) the file is rolled back and the running fields start here."""
    if state is None:
        logger.roll_back(step, key=key)
        return
    try:
        logger.load_state_dict(state)
    except ConfigError as exc:
        raise CorruptCheckpointError(f"{checkpoint}: its step-log state cannot be read: "
                                     f"{exc}") from exc
