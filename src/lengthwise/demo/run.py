"""Train the same model once per batch order and measure what the order did.

For every order the run starts from the same weights (same seed), takes the
same number of optimizer steps of ``grad_accum`` micro-batches each, under the
same token budget per micro-batch, with AdamW and the same learning-rate
schedule. Only the sampler's ``order`` differs. Each run writes
``OUT/<order>/train_log.jsonl`` (one line per step, from
:class:`lengthwise.train.StepLogger`) and ends with the loss on a fixed
held-out set.

The step loss is the mean over every predicted token of the step: each
micro-batch's summed token losses are divided by the token count of the whole
step (over all micro-batches and ranks), so micro-batches count by their
tokens, not equally.

Example::

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

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.demo.data import DemoData

__all__ = ["DemoConfig", "Dist", "OrderResult", "OrderRun", "available_orders", "evaluate",
           "lr_factor", "read_log", "train_order", "train_orders"]

#: orders trained by default, in this sequence (``packed`` is added when the layout exists)
DEFAULT_ORDERS: tuple[str, ...] = ("sorted", "random", "bucket-random", "interleave",
                                   "stratified")
#: name of the padding-free strategy (``layout="pack"``)
PACKED = "packed"


def available_orders() -> tuple[str, ...]:
    """The orders the demo can train here: the planner's orders, plus ``packed`` if supported."""
    try:
        import lengthwise.planning.packed  # noqa: F401
    except ImportError:
        return DEFAULT_ORDERS
    return (*DEFAULT_ORDERS, PACKED)


@dataclass
class DemoConfig:
    """Settings shared by every order of one demo run."""

    steps: int = 150
    grad_accum: int = 8
    max_tokens: int = 1024
    max_len: int = 512
    model_size: str = "tiny"
    lr: float = 3e-3
    warmup: int | None = None  # steps; default 10 % of steps
    schedule: str = "constant"  # or "cosine"
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    buckets: int | str = "auto"
    pad_multiple: int | None = None  # 8 on CUDA, 1 on CPU
    eval_samples: int = 256
    max_samples: int | None = None
    device: str = "cpu"
    dtype: str | None = None  # "bf16" on CUDA by default
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    resume: bool = False
    timing_warmup: int = 3  # first steps left out of tokens_per_second
    progress: bool = True
    deterministic: bool = True
    threads: int | None = 1  # torch intra-op threads on CPU (None: torch's default)
    attn_implementation: str | None = None  # transformers' default (sdpa) when None

    def __post_init__(self) -> None:
        if self.pad_multiple is None:
            self.pad_multiple = 8 if self.device.startswith("cuda") else 1
        for name in ("steps", "grad_accum", "max_tokens", "max_len", "pad_multiple",
                     "eval_samples", "keep_checkpoints"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_len > self.max_tokens:
            raise ValueError(f"max_len ({self.max_len}) must not exceed max_tokens "
                             f"({self.max_tokens}): one row must fit the micro-batch budget")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.warmup is not None and not 0 <= self.warmup < self.steps:
            raise ValueError(f"warmup must lie in [0, steps={self.steps}), got {self.warmup}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")

    @property
    def warmup_steps(self) -> int:
        """Learning-rate warm-up length in optimizer steps."""
        return self.warmup if self.warmup is not None else max(1, self.steps // 10)


def lr_factor(step: int, cfg: DemoConfig) -> float:
    """Learning-rate multiplier after ``step`` updates: linear warm-up, then constant or cosine.

    Example::

        >>> cfg = DemoConfig(steps=100, warmup=10, schedule="cosine")
        >>> lr_factor(0, cfg), lr_factor(10, cfg), round(lr_factor(100, cfg), 3)
        (0.1, 1.0, 0.1)
    """
    warm = cfg.warmup_steps
    if step < warm:
        return (step + 1) / warm
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warm) / max(1, cfg.steps - warm))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class Dist:
    """This process's place in a ``torchrun`` job (rank 0 of 1 without one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> Dist:
        """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` as ``torchrun`` sets them."""
        env = os.environ
        return cls(rank=int(env.get("RANK", 0)), world_size=int(env.get("WORLD_SIZE", 1)),
                   local_rank=int(env.get("LOCAL_RANK", 0)))


@dataclass
class OrderResult:
    """What one order's run measured (rank 0's view; counts are summed over ranks)."""

    order: str
    steps: int
    log_path: str
    eval_loss: float
    tokens_per_second: float
    padding_efficiency: float
    real_tokens: int
    padded_tokens: int
    train_seconds: float
    epochs: float
    final_loss: float
    tokens_per_step: float
    loss: list[float] = field(default_factory=list, repr=False)
    corrected_loss: list[float | None] = field(default_factory=list, repr=False)
    lr: list[float] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, curves: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not curves:
            for key in ("loss", "corrected_loss", "lr"):
                out.pop(key)
        return out


def _device(cfg: DemoConfig, dist: Dist) -> Any:
    import torch

    if cfg.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {cfg.device}: torch sees no CUDA device here")
        if dist.world_size > 1 or cfg.device == "cuda":
            torch.cuda.set_device(dist.local_rank)
            return torch.device("cuda", dist.local_rank)
    return torch.device(cfg.device)


def _autocast_dtype(cfg: DemoConfig, device: Any) -> Any:
    import torch

    name = cfg.dtype or ("bf16" if device.type == "cuda" else None)
    if name in (None, "fp32", "float32"):
        return None
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16}
    if name not in table:
        raise ValueError(f"dtype must be one of fp32, bf16, fp16, got {name!r}")
    return table[name]


def _micro_loss(model: Any, batch: dict[str, Any], device: Any, amp: Any) -> tuple[Any, int]:
    """Summed next-token loss of a micro-batch and its number of predicted tokens.

    Padded batches carry an ``attention_mask``; packed rows carry ``position_ids``
    that restart at every sample (the model keeps attention inside samples).
    """
    import torch
    import torch.nn.functional as F

    inputs = {k: batch[k].to(device, non_blocking=True)
              for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    labels = batch["labels"][:, 1:].to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        logits = model(**inputs).logits
    logits = logits[:, :-1].float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss, int((batch["labels"][:, 1:] != -100).sum())


def evaluate(model: Any, samples: list[np.ndarray], *, max_tokens: int, device: Any,
             amp: Any = None, pad_multiple: int = 8) -> float:
    """Mean next-token loss per predicted token over ``samples`` (length-sorted batches)."""
    import torch

    from lengthwise.pytorch.collate import PadCollator, model_inputs

    collate = PadCollator(pad_token_id=0, pad_multiple=pad_multiple, metadata=False)
    order = sorted(range(len(samples)), key=lambda i: samples[i].size)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        start = 0
        while start < len(order):
            longest, end = 0, start
            while end < len(order):
                longest = max(longest, samples[order[end]].size)
                padded = -(-longest // pad_multiple) * pad_multiple
                if end > start and padded * (end - start + 1) > max_tokens:
                    break
                end += 1
            batch = collate([{"input_ids": samples[i]} for i in order[start:end]])
            loss, n = _micro_loss(model, model_inputs(batch), device, amp)
            total += float(loss)
            count += n
            start = end
    model.train(was_training)
    return total / max(count, 1)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Step records of a ``train_log.jsonl``, one per step (a later line of a step wins)."""
    rows: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "event" not in rec and isinstance(rec.get("step"), int):
                rows[rec["step"]] = rec
    return [rows[k] for k in sorted(rows)]


def _make_sampler(order: str, data: DemoData, cfg: DemoConfig, dist: Dist) -> Any:
    from lengthwise.pytorch.sampler import BucketBatchSampler

    budget: dict[str, Any] = {"max_tokens": cfg.max_tokens}
    layout, name = "pad", order
    if order == PACKED:
        # rows of max_len tokens (the packed plan's row capacity), max_tokens // max_len
        # of them per micro-batch: the same tokens per micro-batch as the padded orders
        layout, name = "pack", "stratified"
        budget = {"max_tokens": cfg.max_len, "rows_per_batch": max(1, cfg.max_tokens
                                                                     // cfg.max_len)}
    return BucketBatchSampler(
        data.lengths, order=name, buckets=cfg.buckets, grad_accum=cfg.grad_accum,
        num_replicas=dist.world_size, rank=dist.rank, seed=cfg.seed, max_len=cfg.max_len,
        pad_multiple=cfg.pad_multiple, layout=layout, **budget)


def _step_batches(sampler: Any, state: dict[str, Any], grad_accum: int) -> list[list[int]]:
    """The next ``grad_accum`` micro-batches; an epoch's incomplete last step is skipped."""
    for _ in range(2):
        batches = []
        for batch in state["iter"]:
            batches.append(batch)
            if len(batches) == grad_accum:
                return batches
        sampler.set_epoch(sampler.epoch + 1)
        state["iter"] = iter(sampler)
    raise RuntimeError(f"an epoch has fewer than grad_accum={grad_accum} micro-batches per "
                       "rank; use more data, a smaller max_tokens or a smaller grad_accum")


def _all_reduce_sum(values: list[float], dist: Dist, device: Any) -> list[float]:
    if dist.world_size == 1:
        return values
    import torch
    import torch.distributed as tdist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    tdist.all_reduce(t)
    return t.tolist()


class OrderRun:
    """One order's training run, advanced one optimizer step at a time.

    Building it creates the model (from ``cfg.seed``), AdamW, the schedule, the
    sampler and the step logger, and resumes from the newest checkpoint when
    ``cfg.resume``. :meth:`step` trains one optimizer step; :meth:`finish`
    evaluates on the held-out set, closes the log and returns the figures.
    """

    def __init__(self, order: str, data: DemoData, cfg: DemoConfig, *, out: str | Path,
                 dist: Dist | None = None) -> None:
        import torch

        from lengthwise.demo.model import build_model
        from lengthwise.pytorch.collate import PackCollator, PadCollator
        from lengthwise.train import Checkpointer, StepLogger, bucket_token_shares, load_checkpoint

        self.order, self.data, self.cfg = order, data, cfg
        self.dist = dist = dist or Dist()
        run_dir = Path(out) / order
        self.log_path = run_dir / "train_log.jsonl"
        ckpt_dir = run_dir / "checkpoints"
        self.device = device = _device(cfg, dist)
        self.amp = _autocast_dtype(cfg, device)
        if cfg.threads is not None and device.type == "cpu":
            torch.set_num_threads(cfg.threads)
        if cfg.deterministic and device.type == "cpu":
            torch.use_deterministic_algorithms(True, warn_only=True)

        self.model = model = build_model(cfg.model_size, vocab_size=data.vocab_size,
                                         max_len=cfg.max_len, seed=cfg.seed,
                                         attn_implementation=cfg.attn_implementation,
                                         device=device)
        model.train()
        self.net = model
        if dist.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.net = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda" or None)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, cfg))
        self.sampler = _make_sampler(order, data, cfg, dist)
        self.packed = order == PACKED
        edges = self.sampler.edges
        if self.packed:
            self.collate = PackCollator(row_capacity=cfg.max_len, pad_to_capacity=True,
                                        pad_token_id=0, return_flash_attn_kwargs=False)
        else:
            self.collate = PadCollator(pad_token_id=0, pad_multiple=cfg.pad_multiple,
                                       edges=edges)

        self.step_count = 0
        self.resumed_from: str | None = None
        if cfg.resume and Checkpointer(ckpt_dir).latest() is not None:
            info = load_checkpoint(ckpt_dir, model=model, optimizer=self.optimizer,
                                   scheduler=self.scheduler, sampler=self.sampler)
            self.step_count = int(info["step"])
            self.resumed_from = str(info["path"])
        elif dist.is_main and self.log_path.exists():
            self.log_path.unlink()  # a fresh run starts a fresh log
        shares = bucket_token_shares(self.sampler.plan)
        self.logger = StepLogger(self.log_path, bucket_shares=shares,
                                 num_buckets=len(edges or [0]),
                                 rank=dist.rank, world_size=dist.world_size)
        if self.resumed_from is not None:
            self.logger.event("resume", step=self.step_count, path=self.resumed_from)
        self.checkpointer = (Checkpointer(ckpt_dir, keep=cfg.keep_checkpoints, logger=self.logger)
                             if cfg.checkpoint_every else None)
        self._iter = {"iter": iter(self.sampler)}
        self.eval_loss: float | None = None

    @property
    def done(self) -> bool:
        """Whether ``cfg.steps`` optimizer steps are trained."""
        return self.step_count >= self.cfg.steps

    def _micro_batches(self) -> list[dict[str, Any]]:
        batches = _step_batches(self.sampler, self._iter, self.cfg.grad_accum)
        if not self.packed:
            return [self.collate([{"input_ids": self.data.train[i]} for i in b])
                    for b in batches]
        # packed rows: the plan knows where rows start inside each micro-batch
        plan = self.sampler.plan
        last = self.sampler.state_dict()["yielded"] - 1
        positions = range(last - len(batches) + 1, last + 1)
        out = []
        for pos in positions:
            rows = plan.batch_rows(self.dist.rank + pos * self.dist.world_size)
            out.append(self.collate([[{"input_ids": self.data.train[i]} for i in row]
                                     for row in rows]))
        return out

    def _forward(self, mb: dict[str, Any]) -> tuple[Any, int]:
        if not self.packed:
            from lengthwise.pytorch.collate import model_inputs

            return _micro_loss(self.net, model_inputs(mb), self.device, self.amp)
        rows = -(-mb["input_ids"].shape[1] // self.cfg.max_len)
        view = {k: mb[k].reshape(rows, -1) for k in ("input_ids", "labels", "position_ids")}
        return _micro_loss(self.net, view, self.device, self.amp)

    def step(self) -> dict[str, Any]:
        """Train one optimizer step and return its log record."""
        import contextlib

        import torch

        cfg, dist = self.cfg, self.dist
        self.logger.reset_timer()
        micro = self._micro_batches()
        local_pred = sum(int((m["labels"][:, 1:] != -100).sum()) for m in micro)
        (step_pred,) = _all_reduce_sum([float(local_pred)], dist, self.device)
        scale = dist.world_size / step_pred
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for k, mb in enumerate(micro):
            sync = k == len(micro) - 1 or dist.world_size == 1
            with contextlib.nullcontext() if sync else self.net.no_sync():
                loss, n_pred = self._forward(mb)
                (loss * scale).backward()
            detached = loss.detach()
            loss_sum += detached.double()
            bucket = mb["bucket"] if mb["bucket"] >= 0 else None
            self.logger.record_micro(loss=detached / max(n_pred, 1),
                                     real_tokens=mb["real_tokens"],
                                     padded_tokens=mb["padded_tokens"],
                                     samples=_samples(mb), bucket=bucket)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        (total_loss,) = _all_reduce_sum([float(loss_sum)], dist, self.device)
        self.step_count += 1
        rec = self.logger.step(self.step_count, epoch=self.sampler.epoch,
                               loss=total_loss / step_pred, lr=lr, grad_norm=grad_norm)
        if self.checkpointer is not None and self.step_count % cfg.checkpoint_every == 0:
            self.checkpointer.save(self.step_count, model=self.model, optimizer=self.optimizer,
                                   scheduler=self.scheduler, sampler=self.sampler)
        return rec

    def finish(self) -> OrderResult:
        """Evaluate on the held-out set, close the log; the run's figures (rank 0)."""
        try:
            if self.checkpointer is not None:
                self.checkpointer.close()
            self.eval_loss = evaluate(self.model, self.data.eval, max_tokens=self.cfg.max_tokens,
                                      device=self.device, amp=self.amp,
                                      pad_multiple=self.cfg.pad_multiple)
            self.logger.event("eval", step=self.step_count, eval_loss=self.eval_loss)
        finally:
            self.logger.close()
        records = read_log(self.log_path) if self.dist.is_main else []
        result = _summarise(self.order, records, self.log_path, self.eval_loss, self.cfg,
                            len(self.data.train), self.resumed_from)
        plan = self.sampler.plan
        if plan is not None and self.dist.is_main:  # how representative the steps are
            stats = plan.stats
            result.extra.update({k: stats.get(k) for k in ("step_length_cv", "step_cv_ratio")})
        return result

    def close(self) -> None:
        """Release the log and checkpoint writer without evaluating (after an error)."""
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.logger.close()


def _samples(mb: dict[str, Any]) -> int:
    if "samples" in mb:
        return int(mb["samples"])
    return int(mb["input_ids"].shape[0])


def train_order(order: str, data: DemoData, cfg: DemoConfig, *, out: str | Path,
                dist: Dist | None = None) -> OrderResult:
    """Train a fresh model for ``cfg.steps`` optimizer steps with batches in ``order``.

    Writes ``out/<order>/train_log.jsonl`` (and checkpoints under
    ``out/<order>/checkpoints`` when ``cfg.checkpoint_every``); with ``cfg.resume``
    it continues from the newest complete checkpoint there.
    """
    return train_orders([order], data, cfg, out=out, dist=dist, lockstep=False)[order]


def train_orders(orders: list[str] | tuple[str, ...], data: DemoData, cfg: DemoConfig, *,
                 out: str | Path, dist: Dist | None = None, lockstep: bool = True,
                 ) -> dict[str, OrderResult]:
    """Train every order; ``lockstep`` alternates their steps so machine load hits all alike.

    In lock-step, step ``t`` of every order runs before step ``t + 1`` of any, so a
    change in the load of a shared machine slows every order the same way and the
    throughput ratios stay fair (each step is timed on its own).
    """
    dist = dist or Dist()
    bar = None
    if cfg.progress and dist.is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps * len(orders), desc="training", unit="step",
                   file=sys.stderr, leave=False, dynamic_ncols=True)
    results: dict[str, OrderResult] = {}
    runs: dict[str, OrderRun] = {}
    try:
        groups = [list(orders)] if lockstep else [[o] for o in orders]
        for group in groups:
            for order in group:
                runs[order] = OrderRun(order, data, cfg, out=out, dist=dist)
                if bar is not None:
                    bar.update(runs[order].step_count)
            while not all(runs[o].done for o in group):
                for order in group:
                    run = runs[order]
                    if run.done:
                        continue
                    rec = run.step()
                    if bar is not None:
                        bar.set_postfix_str(f"{order} loss {rec['loss']:.3f}", refresh=False)
                        bar.update(1)
            for order in group:
                results[order] = runs.pop(order).finish()
    finally:
        for run in runs.values():
            run.close()
        if bar is not None:
            bar.close()
    return results


def _summarise(order: str, records: list[dict[str, Any]], log_path: Path, eval_loss: float,
               cfg: DemoConfig, train_samples: int, resumed_from: str | None) -> OrderResult:
    # sorted batches change length over an epoch: time whole epochs when there are any
    last_epoch = max((r["epoch"] or 0 for r in records), default=0)
    window = [r for r in records if (r["epoch"] or 0) < last_epoch] or records
    timed = [r for r in window if r["step"] > cfg.timing_warmup] or window
    real_t = sum(r["real_tokens"] or 0 for r in timed)
    secs = sum(r["seconds"] or 0.0 for r in timed)
    real = sum(r["real_tokens"] or 0 for r in records)
    padded = sum(r["padded_tokens"] or 0 for r in records)
    samples = sum(r["samples"] or 0 for r in records)
    losses = [float(r["loss"]) for r in records]
    tail = losses[-10:] or [math.nan]
    return OrderResult(
        order=order, steps=len(records), log_path=str(log_path), eval_loss=eval_loss,
        tokens_per_second=real_t / secs if secs > 0 else math.nan,
        padding_efficiency=real / padded if padded else math.nan,
        real_tokens=int(real), padded_tokens=int(padded),
        train_seconds=float(sum(r["seconds"] or 0.0 for r in records)),
        epochs=samples / train_samples if train_samples else math.nan,
        final_loss=float(np.mean(tail)), loss=losses,
        tokens_per_step=real / len(records) if records else math.nan,
        corrected_loss=[r.get("corrected_loss") for r in records],
        lr=[float(r["lr"]) for r in records],
        extra={"timed_steps": [timed[0]["step"], timed[-1]["step"]] if timed else None,
               **({"resumed_from": resumed_from} if resumed_from else {})},
    )


def setup_distributed(cfg: DemoConfig) -> Dist:
    """Join the ``torchrun`` process group when there is one (gloo on CPU, NCCL on CUDA)."""
    dist = Dist.from_env()
    if dist.world_size > 1:
        import torch.distributed as tdist

        if not tdist.is_initialized():
            backend = "nccl" if cfg.device.startswith("cuda") else "gloo"
            if backend == "nccl":
                import torch

                torch.cuda.set_device(dist.local_rank)
            tdist.init_process_group(backend=backend)
    return dist


def barrier(dist: Dist) -> None:
    """Wait for every rank (no-op in a single process)."""
    if dist.world_size > 1:
        import torch.distributed as tdist

        tdist.barrier()


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and its wall time in seconds."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start
