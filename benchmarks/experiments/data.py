"""The order experiment's samples: the demo's corpus, its length strata, the held-out loss.

Every run of the experiment trains on the same split: the demo's corpus and tokenizer
(:func:`lengthwise.demo.main.prepare_data`), samples shorter than ``min_len`` left out,
and ``buckets`` length strata (the padding-optimal edges of the stratified plan over the
training lengths). The held-out loss is measured overall and per stratum.

Example::

    >>> import numpy as np
    >>> data = ExperimentData(train=[np.arange(9)], eval=[np.arange(5), np.arange(30)],
    ...                       vocab_size=64, edges=[10, 40], info={"length_min": 5})
    >>> data.strata(), data.eval_stratum().tolist()
    (['5-10', '11-40'], [0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError

__all__ = ["ExperimentData", "build_data", "held_out", "set_lr"]


@dataclass
class ExperimentData:
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


def build_data(cfg: Any, texts: list[str] | None = None,
               cache_dir: str | Path | None = None) -> ExperimentData:
    """The samples of ``cfg`` (an :class:`~experiments.arms.ArmsConfig`): the demo's corpus
    and tokenizer, samples shorter than ``min_len`` left out, and the padding-optimal edges
    of ``buckets`` strata over the training lengths."""
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
                          grad_accum=cfg.world, progress=False)
    edges = [int(e) for e in make_sampler("stratified", lengths, loop_cfg).edges]
    p50, p99 = (int(v) for v in np.percentile(lengths, [50, 99]))
    info = {"corpus": info["corpus"], "tokenizer": info["tokenizer"],
            "train_samples": len(train), "train_tokens": int(lengths.sum()),
            "eval_samples": len(held), "eval_tokens": int(sum(x.size for x in held)),
            "length_min": int(lengths.min()), "length_p50": p50, "length_p99": p99,
            "length_max": int(lengths.max()),
            "length_span": round(float(lengths.max() / lengths.min()), 1),
            "token_budget": int(cfg.epochs * lengths.sum())}
    return ExperimentData(train=train, eval=held, vocab_size=data.vocab_size, edges=edges,
                          info=info)


def held_out(model: Any, data: ExperimentData, *, max_tokens: int, device: Any,
             ) -> dict[str, Any]:
    """Held-out loss per predicted token, overall and per stratum."""
    from lengthwise.demo.lm import evaluate_samples

    sums, counts = evaluate_samples(model, data.eval, max_tokens=max_tokens, device=device,
                                   pad_multiple=1)
    stratum = data.eval_stratum()
    per = []
    for k in range(len(data.edges)):
        pick = stratum == k
        n = counts[pick].sum()
        per.append(float(sums[pick].sum() / n) if n else None)
    return {"eval_loss": float(sums.sum() / counts.sum()), "strata": per}


def set_lr(loop: Any, lr: float) -> None:
    """Set the learning rate of every parameter group of ``loop``'s optimizer."""
    for group in loop.optimizer.param_groups:
        group["lr"] = lr
