"""Train the same model once per batch order, in lock-step, and measure what the order did.

For every order the run starts from the same weights (same seed) and trains the same
samples for ``cfg.epochs`` epochs, every sample once per epoch, under the same token
budget per micro-batch, with AdamW. Only the sampler's ``order`` differs. Each order
takes its own plan's optimizer steps (:func:`order_steps`): an epoch's micro-batches in
steps of ``grad_accum``, its incomplete last step trained as a shorter step. An order
that pads more forms more micro-batches, so it takes more steps and more compute for the
same data. The learning-rate schedule runs over each order's own steps. Each run writes
``OUT/<order>/train_log.jsonl``, counts the FLOPs of the micro-batches it trained
(:func:`~lengthwise.demo.flops.train_flops`) and ends with the loss on a fixed held-out set.

Beside the step log, a run in one process writes ``OUT/<order>/micro_log.jsonl``: the
per-micro-batch log of rank 0 of a simulated job of :data:`SIMULATED_WORLD` ranks
(:func:`micro_ranks`), micro-batch ``k`` of a step being rank ``k % 8``'s. It is the view
of a job that logs each micro-batch's loss on rank 0; the training is the same.

Example::

    >>> from lengthwise.demo.data import DemoData
    >>> from lengthwise.demo.tokenizer import train_tokenizer
    >>> texts = [f"def f{i}(x): return x * {i} " * (1 + i % 9) for i in range(300)]
    >>> tok = train_tokenizer(texts, vocab_size=300)
    >>> cfg = DemoConfig(grad_accum=2, max_tokens=256, max_len=64, eval_samples=8,
    ...                  progress=False)
    >>> data = DemoData.build(texts, tok, max_len=64, eval_samples=8, max_samples=40)
    >>> import tempfile
    >>> res = train_order("stratified", data, cfg, out=tempfile.mkdtemp())
    >>> res.steps == order_steps("stratified", data.lengths, cfg), res.epochs, res.eval_loss > 0
    (True, 1.0, True)
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lengthwise.demo.config import PACKED, DemoConfig
from lengthwise.demo.data import DemoData
from lengthwise.demo.flops import train_flops
from lengthwise.demo.lm import LMTask, evaluate
from lengthwise.demo.model import MODEL_SIZES, build_model
from lengthwise.demo.results import OrderResult, read_log, summarise
from lengthwise.pytorch.dist import GroupInfo, all_reduce_sum
from lengthwise.train.device import autocast_dtype, configure_torch, pick_device, rank_world
from lengthwise.train.loop import TrainLoop, make_sampler

__all__ = ["SIMULATED_WORLD", "OrderRun", "micro_ranks", "order_steps", "run_lockstep",
           "train_order", "train_orders"]

#: ranks of the simulated job whose rank 0 writes the per-micro-batch log
SIMULATED_WORLD = 8


def micro_ranks(grad_accum: int, world: int = 1) -> int | None:
    """Ranks of the simulated job whose rank 0's micro-batches ``micro_log.jsonl`` holds.

    :data:`SIMULATED_WORLD`, or its largest divisor that divides ``grad_accum``; None
    (no per-micro-batch log) in a job of several real ranks.

    Example::

        >>> micro_ranks(8), micro_ranks(16), micro_ranks(4), micro_ranks(8, world=2)
        (8, 8, 4, None)
    """
    if world != 1:
        return None
    return math.gcd(int(grad_accum), SIMULATED_WORLD)


def order_steps(order: str, lengths: np.ndarray, cfg: DemoConfig, *, rank: int = 0,
                world: int = 1) -> int:
    """Optimizer steps of ``cfg.epochs`` epochs of ``order``'s plan on ``lengths``: each
    epoch's micro-batches (of this rank) over ``grad_accum``, rounded up (an epoch's
    incomplete last step is trained as a shorter step).

    Example::

        >>> import numpy as np
        >>> lengths = np.random.default_rng(0).integers(2, 256, 2000)
        >>> cfg = DemoConfig(epochs=2)
        >>> order_steps("random", lengths, cfg) > order_steps("stratified", lengths, cfg)
        True
    """

    sampler = make_sampler(order, lengths, cfg, rank=rank, world=world)
    steps = 0
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        steps += -(-len(sampler) // cfg.grad_accum)
    return steps


class Run(Protocol):
    """One order's training, advanced a step at a time."""

    loop: TrainLoop

    def finish(self) -> Any: ...

    def close(self) -> None: ...


class OrderRun:
    """The causal-LM task of one order: model, :class:`TrainLoop`, held-out evaluation.

    With ``equal_data`` (the demo's) it trains ``cfg.epochs`` epochs, every sample once
    per epoch, in ``steps`` optimizer steps (default: :func:`order_steps`); without, it
    trains ``cfg.steps`` steps and skips each epoch's incomplete last step. :attr:`flops`
    counts the FLOPs of the micro-batches this rank trained.
    """

    def __init__(self, order: str, data: DemoData, cfg: DemoConfig, *, out: str | Path,
                 info: GroupInfo | None = None, equal_data: bool = True,
                 steps: int | None = None) -> None:
        if equal_data:
            rank, world = rank_world(info)
            if steps is None:
                steps = order_steps(order, data.lengths, cfg, rank=rank, world=world)
            cfg = dataclasses.replace(cfg, steps=steps)  # the schedule spans the order's steps
        self.order, self.data, self.cfg, self.info = order, data, cfg, info
        self.device = device = pick_device(cfg.device, info)
        configure_torch(device, threads=cfg.threads, deterministic=cfg.deterministic)
        model = build_model(cfg.model_size, vocab_size=data.vocab_size, max_len=cfg.max_len,
                            seed=cfg.seed, attn_implementation=cfg.attn_implementation,
                            device=device)
        model.train()
        self.task = LMTask(model, device=device, amp=autocast_dtype(cfg.dtype, device),
                           max_len=cfg.max_len if order == PACKED else None)
        train = data.train
        ranks = micro_ranks(cfg.grad_accum, rank_world(info)[1])
        self.loop = TrainLoop(self.task, order, data.lengths, lambda i: {"input_ids": train[i]},
                              cfg, run_dir=Path(out) / order, device=device, info=info,
                              micro_log=ranks is not None, micro_ranks=ranks or 1,
                              keep_last_step=equal_data)
        self.flops = 0
        self._count_flops()

    def _count_flops(self) -> None:
        """Add the training FLOPs of each micro-batch the model is given (its rows x padded
        width; packed: rows of ``max_len``) to :attr:`flops`."""

        size, vocab = MODEL_SIZES[self.cfg.model_size], self.data.vocab_size
        prepare = self.task.prepare

        def counted(batch: dict[str, Any], rows: list[list[int]], step: int) -> Any:
            prepared = prepare(batch, rows, step)
            n, width = prepared["input_ids"].shape
            self.flops += train_flops(int(n), int(width), size, vocab_size=vocab)
            return prepared

        self.task.prepare = counted  # type: ignore[method-assign]

    def finish(self) -> OrderResult:
        """Evaluate on the held-out set, close the log; the run's figures (rank 0)."""

        loop = self.loop
        try:
            eval_loss = evaluate(self.task.model, self.data.eval, max_tokens=self.cfg.max_tokens,
                                 device=self.device, amp=self.task.amp,
                                 pad_multiple=self.cfg.pad_multiple)
            loop.logger.event("eval", step=loop.step_count, eval_loss=eval_loss)
        finally:
            loop.close()
        rank, world = rank_world(self.info)
        main = rank == 0
        flops = self.flops
        if world > 1:
            flops = int(all_reduce_sum(np.asarray([flops], dtype=np.float64), self.info)[0])
        records = read_log(loop.log_path) if main else []
        result = summarise(self.order, records, loop.log_path, eval_loss,
                           train_samples=len(self.data.train),
                           timing_warmup=self.cfg.timing_warmup, resumed_from=loop.resumed_from)
        result.extra["flops"] = flops
        plan = loop.sampler.plan
        if plan is not None and main:  # how representative the steps are
            result.extra.update({k: plan.stats.get(k) for k in ("step_length_cv",
                                                                 "step_cv_ratio")})
        if loop.micro_logger is not None and main:
            result.extra.update(micro_log=str(loop.micro_logger.path),
                                micro_world=loop.micro_ranks)
        return result

    def close(self) -> None:
        """Release the log and checkpoint writer without evaluating (after an error)."""
        self.loop.close()


def run_lockstep(orders: Sequence[str], make_run: Callable[[str], Run], *,
                 steps: int | Mapping[str, int], progress: bool = False,
                 lockstep: bool = True) -> dict[str, Any]:
    """Build and train a run per order; ``lockstep`` alternates their steps.

    In lock-step, step ``t`` of every order runs before step ``t + 1`` of any, so a
    change in the load of a shared machine slows every order the same way and the
    throughput ratios stay fair (each step is timed on its own); an order with fewer
    steps finishes first. ``steps`` (each order's, or one count for all) sizes the
    progress bar. Returns each run's :meth:`finish`.
    """
    bar = None
    if progress:
        from tqdm.auto import tqdm

        total = (sum(steps[o] for o in orders) if isinstance(steps, Mapping)
                 else steps * len(orders))
        bar = tqdm(total=total, desc="training", unit="step", file=sys.stderr,
                   leave=False, dynamic_ncols=True)
    results: dict[str, Any] = {}
    runs: dict[str, Run] = {}
    try:
        for group in ([list(orders)] if lockstep else [[o] for o in orders]):
            for order in group:
                runs[order] = make_run(order)
                if bar is not None and runs[order].loop.step_count:  # resumed steps
                    bar.update(runs[order].loop.step_count)
            while not all(runs[o].loop.done for o in group):
                for order in group:
                    loop = runs[order].loop
                    if loop.done:
                        continue
                    rec = loop.step()
                    if bar is not None:
                        loss = "-" if rec["loss"] is None else f"{rec['loss']:.3f}"
                        bar.set_postfix_str(f"{order} loss {loss}", refresh=False)
                        bar.update(1)
            for order in group:
                results[order] = runs.pop(order).finish()
    finally:
        for run in runs.values():
            run.close()
        if bar is not None:
            bar.close()
    return results


def train_orders(orders: Sequence[str], data: DemoData, cfg: DemoConfig, *,
                 out: str | Path, info: GroupInfo | None = None, lockstep: bool = True,
                 equal_data: bool = True) -> dict[str, OrderResult]:
    """Train the causal LM once per order (see :func:`run_lockstep`): ``cfg.epochs`` epochs
    of each order's own steps, or ``cfg.steps`` steps each without ``equal_data``."""
    rank, world = rank_world(info)
    steps: dict[str, int] = {o: (order_steps(o, data.lengths, cfg, rank=rank, world=world)
                                 if equal_data else cfg.steps) for o in orders}
    return run_lockstep(orders, lambda o: OrderRun(o, data, cfg, out=out, info=info,
                                                   equal_data=equal_data, steps=steps[o]),
                        steps=steps, progress=cfg.progress and rank == 0, lockstep=lockstep)


def train_order(order: str, data: DemoData, cfg: DemoConfig, *, out: str | Path,
                info: GroupInfo | None = None) -> OrderResult:
    """Train a fresh model for ``cfg.epochs`` epochs (:func:`order_steps`) with batches in
    ``order``.

    Writes ``out/<order>/train_log.jsonl`` (and checkpoints under
    ``out/<order>/checkpoints`` when ``cfg.checkpoint_every``); with ``cfg.resume``
    it continues from the newest complete checkpoint there.
    """
    return train_orders([order], data, cfg, out=out, info=info, lockstep=False)[order]
