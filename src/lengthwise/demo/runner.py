"""Train the same model once per batch order, in lock-step, and measure what the order did.

For every order the run starts from the same weights (same seed), takes the
same number of optimizer steps of ``grad_accum`` micro-batches each, under the
same token budget per micro-batch, with AdamW and the same learning-rate
schedule. Only the sampler's ``order`` differs. Each run writes
``OUT/<order>/train_log.jsonl`` and ends with the loss on a fixed held-out set.

Beside the step log, a run in one process writes ``OUT/<order>/micro_log.jsonl``: the
per-micro-batch log of rank 0 of a simulated job of :data:`SIMULATED_WORLD` ranks
(:func:`micro_ranks`), micro-batch ``k`` of a step being rank ``k % 8``'s. It is the view
of a job that logs each micro-batch's loss on rank 0; the training is the same.

Example::

    >>> from lengthwise.demo.data import DemoData
    >>> from lengthwise.demo.tokenizer import train_tokenizer
    >>> texts = [f"def f{i}(x): return x * {i} " * (1 + i % 9) for i in range(300)]
    >>> tok = train_tokenizer(texts, vocab_size=300)
    >>> cfg = DemoConfig(steps=2, grad_accum=2, max_tokens=256, max_len=64, eval_samples=8,
    ...                  progress=False)
    >>> data = DemoData.build(texts, tok, max_len=64, eval_samples=8)
    >>> import tempfile
    >>> res = train_order("stratified", data, cfg, out=tempfile.mkdtemp())
    >>> res.steps, res.eval_loss > 0
    (2, True)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from lengthwise.demo.config import PACKED, DemoConfig
from lengthwise.demo.data import DemoData
from lengthwise.demo.results import OrderResult, read_log, summarise
from lengthwise.pytorch.dist import GroupInfo
from lengthwise.train.device import autocast_dtype, configure_torch, pick_device, rank_world
from lengthwise.train.loop import TrainLoop

__all__ = ["SIMULATED_WORLD", "OrderRun", "micro_ranks", "run_lockstep", "train_order",
           "train_orders"]

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


class Run(Protocol):
    """One order's training, advanced a step at a time."""

    loop: TrainLoop

    def finish(self) -> Any: ...

    def close(self) -> None: ...


class OrderRun:
    """The causal-LM task of one order: model, :class:`TrainLoop`, held-out evaluation."""

    def __init__(self, order: str, data: DemoData, cfg: DemoConfig, *, out: str | Path,
                 info: GroupInfo | None = None) -> None:
        from lengthwise.demo.lm import LMTask
        from lengthwise.demo.model import build_model

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
                              micro_log=ranks is not None, micro_ranks=ranks or 1)

    def finish(self) -> OrderResult:
        """Evaluate on the held-out set, close the log; the run's figures (rank 0)."""
        from lengthwise.demo.lm import evaluate

        loop = self.loop
        try:
            eval_loss = evaluate(self.task.model, self.data.eval, max_tokens=self.cfg.max_tokens,
                                 device=self.device, amp=self.task.amp,
                                 pad_multiple=self.cfg.pad_multiple)
            loop.logger.event("eval", step=loop.step_count, eval_loss=eval_loss)
        finally:
            loop.close()
        main = rank_world(self.info)[0] == 0
        records = read_log(loop.log_path) if main else []
        result = summarise(self.order, records, loop.log_path, eval_loss,
                           train_samples=len(self.data.train),
                           timing_warmup=self.cfg.timing_warmup, resumed_from=loop.resumed_from)
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


def run_lockstep(orders: Sequence[str], make_run: Callable[[str], Run], *, steps: int,
                 progress: bool = False, lockstep: bool = True) -> dict[str, Any]:
    """Build and train a run per order; ``lockstep`` alternates their steps.

    In lock-step, step ``t`` of every order runs before step ``t + 1`` of any, so a
    change in the load of a shared machine slows every order the same way and the
    throughput ratios stay fair (each step is timed on its own). Returns each
    run's :meth:`finish`.
    """
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps * len(orders), desc="training", unit="step", file=sys.stderr,
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
                 ) -> dict[str, OrderResult]:
    """Train the causal LM once per order (see :func:`run_lockstep`)."""
    main = rank_world(info)[0] == 0
    return run_lockstep(orders, lambda o: OrderRun(o, data, cfg, out=out, info=info),
                        steps=cfg.steps, progress=cfg.progress and main, lockstep=lockstep)


def train_order(order: str, data: DemoData, cfg: DemoConfig, *, out: str | Path,
                info: GroupInfo | None = None) -> OrderResult:
    """Train a fresh model for ``cfg.steps`` optimizer steps with batches in ``order``.

    Writes ``out/<order>/train_log.jsonl`` (and checkpoints under
    ``out/<order>/checkpoints`` when ``cfg.checkpoint_every``); with ``cfg.resume``
    it continues from the newest complete checkpoint there.
    """
    return train_orders([order], data, cfg, out=out, info=info, lockstep=False)[order]
