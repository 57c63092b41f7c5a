"""What the batch order does to the model: every order x several seeds at equal real tokens.

One run trains the demo's causal LM from scratch with one order and one seed until
it has trained the budget of real (non-pad) tokens (``token_budget``, or ``epochs``
times the training set's tokens: every sample ``epochs`` times), so every order sees the
same amount of text (not the same number of steps: a random order's padded
micro-batches hold fewer real tokens). The learning rate follows the tokens too:
linear warm-up over the first ``warmup_share`` of the budget, then a cosine to
zero at the budget, the same schedule in tokens for every order. Each step trains
the micro-batches of a simulated job of ``world`` ranks
(:mod:`lengthwise.train.simulated`), and the loop writes rank 0's per-micro-batch
log beside the step log.

Along the way the held-out loss is measured ``eval_points`` times at fixed shares
of the budget, overall and per length stratum (the plan's buckets, given by
``buckets``); the seed sets the model's initialisation and the plans, while the
data split and held-out set are the same for every run.

Example::

    >>> cfg = EvidenceConfig(orders=("random",), seeds=(0,), eval_points=2)
    >>> cfg.grid(2000)
    [1000, 2000]
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError

__all__ = ["EvidenceConfig", "EvidenceData", "build_data", "lr_at", "run_one"]


def _vocabulary_orders() -> tuple[str, ...]:
    """Every order the planner's vocabulary names, then ``packed`` (the demo's orders)."""
    from lengthwise.demo.config import available_orders

    return available_orders()


@dataclass
class EvidenceConfig:
    """Settings of the experiment (sizes are parameters: the defaults are the committed run)."""

    orders: tuple[str, ...] = field(default_factory=_vocabulary_orders)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    token_budget: int | None = None  # real tokens per run; None: epochs x the training tokens
    epochs: float = 1.0
    model_size: str = "tiny"
    grad_accum: int = 8  # micro-batches per optimizer step, over every simulated rank
    world: int = 8  # simulated ranks (rank 0 writes the per-micro-batch log)
    max_tokens: int = 512
    max_len: int = 256
    min_len: int = 8
    buckets: int = 6
    lr: float = 3e-3
    warmup_share: float = 0.05
    eval_samples: int = 512
    eval_points: int = 12
    max_samples: int | None = None
    data_seed: int = 0
    vocab_size: int = 2048
    threads: int = 1

    def __post_init__(self) -> None:
        self.orders, self.seeds = tuple(self.orders), tuple(int(s) for s in self.seeds)
        from lengthwise.demo.config import available_orders

        bad = [o for o in self.orders if o not in available_orders()]
        if bad or not self.orders:
            raise ConfigError(f"orders must be among {', '.join(available_orders())}, got "
                              f"{list(self.orders)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        if self.token_budget is not None and (not isinstance(self.token_budget, int)
                                              or self.token_budget < 1):
            raise ConfigError(f"token_budget must be a positive integer, got {self.token_budget!r}")
        if not self.epochs > 0:
            raise ConfigError(f"epochs must be > 0, got {self.epochs}")
        for name in ("grad_accum", "world", "max_tokens", "max_len", "min_len",
                     "buckets", "eval_samples", "eval_points", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.grad_accum % self.world:
            raise ConfigError(f"grad_accum ({self.grad_accum}) must be a multiple of world "
                              f"({self.world})")
        if not 0 <= self.warmup_share < 1:
            raise ConfigError(f"warmup_share must lie in [0, 1), got {self.warmup_share}")
        if self.min_len >= self.max_len:
            raise ConfigError(f"min_len ({self.min_len}) must be below max_len ({self.max_len})")

    def grid(self, budget: int) -> list[int]:
        """Real tokens at which the held-out loss is measured (the last is the budget)."""
        n = self.eval_points
        return [int(round(budget * (i + 1) / n)) for i in range(n)]

    def budget(self, train_tokens: int) -> int:
        """Real tokens each run trains: ``token_budget``, else ``epochs`` x ``train_tokens``.

        Example::

            >>> EvidenceConfig(epochs=2.0).budget(1000)
            2000
        """
        if self.token_budget is not None:
            return self.token_budget
        return int(round(self.epochs * train_tokens))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["orders"], out["seeds"] = list(self.orders), list(self.seeds)
        return out


def lr_at(tokens: float, cfg: EvidenceConfig, budget: int) -> float:
    """The learning rate after ``tokens`` of ``budget`` real tokens: warm-up, then a cosine
    to 0.

    Example::

        >>> cfg = EvidenceConfig(warmup_share=0.1, lr=1.0)
        >>> [round(lr_at(t, cfg, 1000), 3) for t in (50, 100, 550, 1000)]
        [0.5, 1.0, 0.5, 0.0]
    """
    warm = cfg.warmup_share * budget
    if tokens < warm:
        return cfg.lr * tokens / warm
    frac = min(1.0, (tokens - warm) / max(budget - warm, 1.0))
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * frac))


@dataclass
class EvidenceData:
    """Training and held-out samples of at least ``min_len`` tokens, and the strata."""

    train: list[np.ndarray]
    eval: list[np.ndarray]
    vocab_size: int
    edges: list[int]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((x.size for x in self.train), dtype=np.int64, count=len(self.train))

    def strata(self) -> list[str]:
        """A label per stratum: its length range in tokens."""
        lows = [self.info["length_min"], *(e + 1 for e in self.edges[:-1])]
        return [f"{lo}-{hi}" for lo, hi in zip(lows, self.edges, strict=True)]

    def eval_stratum(self) -> np.ndarray:
        """The stratum of each held-out sample, by its length."""
        lens = np.array([x.size for x in self.eval])
        return np.minimum(np.searchsorted(np.asarray(self.edges), lens, side="left"),
                          len(self.edges) - 1)


def build_data(cfg: EvidenceConfig, texts: list[str] | None = None,
               cache_dir: str | Path | None = None) -> EvidenceData:
    """The demo's corpus and tokenizer, samples shorter than ``min_len`` left out, and the
    padding-optimal edges of ``buckets`` strata over the training lengths."""
    from lengthwise.demo.config import DemoConfig
    from lengthwise.demo.main import prepare_data
    from lengthwise.train.loop import make_sampler

    demo_cfg = DemoConfig(max_len=cfg.max_len, max_tokens=cfg.max_tokens,
                          eval_samples=cfg.eval_samples, seed=cfg.data_seed,
                          max_samples=cfg.max_samples, progress=False)
    data, info = prepare_data(demo_cfg, cache_dir=cache_dir, vocab_size=cfg.vocab_size,
                              texts=texts)
    train = [x for x in data.train if x.size >= cfg.min_len]
    held = [x for x in data.eval if x.size >= cfg.min_len]
    if not train or not held:
        raise ConfigError(f"no samples of at least min_len={cfg.min_len} tokens")
    lengths = np.array([x.size for x in train])
    loop_cfg = DemoConfig(max_len=cfg.max_len, max_tokens=cfg.max_tokens, buckets=cfg.buckets,
                          grad_accum=cfg.grad_accum, progress=False)
    edges = [int(e) for e in make_sampler("stratified", lengths, loop_cfg).edges]
    p50, p99 = (int(v) for v in np.percentile(lengths, [50, 99]))
    info = {"corpus": info["corpus"], "tokenizer": info["tokenizer"],
            "train_samples": len(train), "train_tokens": int(lengths.sum()),
            "eval_samples": len(held), "eval_tokens": int(sum(x.size for x in held)),
            "length_min": int(lengths.min()), "length_p50": p50, "length_p99": p99,
            "length_max": int(lengths.max()),
            "length_span": round(float(lengths.max() / lengths.min()), 1),
            "token_budget": cfg.budget(int(lengths.sum()))}
    return EvidenceData(train=train, eval=held, vocab_size=data.vocab_size, edges=edges,
                        info=info)


def _held_out(model: Any, data: EvidenceData, cfg: EvidenceConfig, device: Any,
              ) -> dict[str, Any]:
    """Held-out loss per predicted token, overall and per stratum."""
    from lengthwise.demo.lm import evaluate_samples

    sums, counts = evaluate_samples(model, data.eval, max_tokens=cfg.max_tokens, device=device,
                                   pad_multiple=1)
    stratum = data.eval_stratum()
    per = []
    for k in range(len(data.edges)):
        pick = stratum == k
        n = counts[pick].sum()
        per.append(float(sums[pick].sum() / n) if n else None)
    return {"eval_loss": float(sums.sum() / counts.sum()), "strata": per}


def run_one(order: str, seed: int, data: EvidenceData, cfg: EvidenceConfig, *,
            out: str | Path) -> dict[str, Any]:
    """Train one order with one seed up to the token budget; its figures and curve.

    Writes ``out/<order>-seed<seed>/train_log.jsonl`` (the step loss) and
    ``micro_log.jsonl`` (each micro-batch of simulated rank 0).
    """
    from lengthwise.demo.config import PACKED, DemoConfig
    from lengthwise.demo.lm import LMTask
    from lengthwise.demo.model import build_model
    from lengthwise.train.device import configure_torch, pick_device
    from lengthwise.train.loop import TrainLoop
    from lengthwise.train.simulated import simulated_sampler

    # the loop's own schedule is flat (no warm-up): the learning rate is set from the tokens
    loop_cfg = DemoConfig(steps=10**9, grad_accum=cfg.grad_accum, max_tokens=cfg.max_tokens,
                          max_len=cfg.max_len, lr=cfg.lr, warmup=0, schedule="constant",
                          seed=seed, buckets=cfg.buckets, model_size=cfg.model_size,
                          threads=cfg.threads, progress=False)
    device = pick_device("cpu")
    configure_torch(device, threads=cfg.threads, deterministic=True)
    model = build_model(cfg.model_size, vocab_size=data.vocab_size, max_len=cfg.max_len,
                        seed=seed, device=device)
    model.train()
    task = LMTask(model, device=device, max_len=cfg.max_len if order == PACKED else None)
    lengths = data.lengths
    sampler = simulated_sampler(order, lengths, loop_cfg, world=cfg.world)
    train = data.train
    run_dir = Path(out) / f"{order}-seed{seed}"
    loop = TrainLoop(task, order, lengths, lambda i: {"input_ids": train[i]}, loop_cfg,
                     run_dir=run_dir, device=device, sampler=sampler, micro_log=True,
                     micro_ranks=cfg.world)
    budget = int(data.info["token_budget"])
    grid = cfg.grid(budget)
    curve: list[dict[str, Any]] = []
    tokens = padded = 0
    seconds = 0.0
    started, cpu = time.perf_counter(), time.process_time()
    try:
        _set_lr(loop, lr_at(0, cfg, budget))
        while tokens < budget:
            rec = loop.step()
            tokens += int(rec["real_tokens"])
            padded += int(rec["padded_tokens"])
            seconds += float(rec["seconds"])
            _set_lr(loop, lr_at(tokens, cfg, budget))
            while len(curve) < len(grid) and tokens >= grid[len(curve)]:
                point = _held_out(model, data, cfg, device)
                curve.append({"tokens": tokens, "seconds": seconds, "step": loop.step_count,
                              **point})
                loop.logger.event("eval", step=loop.step_count, eval_loss=point["eval_loss"])
        plan = loop.sampler.plan
        step_cv_ratio = plan.stats.get("step_cv_ratio") if plan is not None else None
    finally:
        loop.close()
    final = curve[-1]
    return {
        "order": order, "seed": seed, "steps": loop.step_count, "real_tokens": tokens,
        "padded_tokens": padded, "padding_efficiency": tokens / padded if padded else None,
        "train_seconds": seconds, "wall_seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu,
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "eval_loss": final["eval_loss"], "strata": final["strata"],
        "step_cv_ratio": None if step_cv_ratio is None else float(step_cv_ratio),
        "curve": curve, "log": str(run_dir / "train_log.jsonl"),
        "micro_log": str(run_dir / "micro_log.jsonl"),
    }


def _set_lr(loop: Any, lr: float) -> None:
    for group in loop.optimizer.param_groups:
        group["lr"] = lr
