"""Tokenised demo data: a training set with its lengths and a fixed held-out set.

The held-out samples are drawn once from the corpus with the run's seed and
are the same for every order, so evaluation losses compare directly.

Example::

    >>> from lengthwise.demo.tokenizer import train_tokenizer
    >>> texts = [f"sample number {i} " * (1 + i % 7) for i in range(100)]
    >>> tok = train_tokenizer(texts, vocab_size=300)
    >>> data = DemoData.build(texts, tok, max_len=32, eval_samples=10, seed=0)
    >>> len(data.train), len(data.eval), int(data.lengths.max()) <= 32
    (90, 10, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthwise.demo.tokenizer import encode_texts
from lengthwise.errors import ConfigError, DataError

__all__ = ["DemoData"]


@dataclass
class DemoData:
    """Token ids of the training and held-out samples (each ends with end-of-text)."""

    train: list[np.ndarray]
    eval: list[np.ndarray]
    vocab_size: int
    max_len: int

    @property
    def lengths(self) -> np.ndarray:
        """Token length of every training sample (int64)."""
        return np.fromiter((x.size for x in self.train), dtype=np.int64, count=len(self.train))

    @classmethod
    def build(cls, texts: list[str], tokenizer: Any, *, max_len: int, eval_samples: int,
              seed: int = 0, max_samples: int | None = None) -> DemoData:
        """Tokenise ``texts`` (truncated to ``max_len``) and split off ``eval_samples``.

        ``max_samples`` keeps a random subset of the training samples (for quick runs).
        """
        if max_len < 2:
            raise ConfigError(f"max_len must be >= 2, got {max_len}")
        if eval_samples < 1:
            raise ConfigError(f"eval_samples must be >= 1, got {eval_samples}")
        ids = [np.asarray(x, dtype=np.int32) for x in encode_texts(tokenizer, texts,
                                                                    max_len=max_len)]
        ids = [x for x in ids if x.size >= 2]  # a sample needs one token to predict
        if len(ids) <= eval_samples:
            raise DataError(f"the corpus has {len(ids)} usable samples, not more than "
                            f"eval_samples={eval_samples}; use more data or fewer eval samples")
        rng = np.random.default_rng([seed, 7919])
        perm = rng.permutation(len(ids))
        held = np.sort(perm[:eval_samples])
        rest = np.sort(perm[eval_samples:])
        if max_samples is not None:
            if max_samples < 1:
                raise ConfigError(f"max_samples must be >= 1, got {max_samples}")
            rest = np.sort(rest[rng.permutation(rest.size)[:max_samples]])
        return cls(train=[ids[i] for i in rest], eval=[ids[i] for i in held],
                   vocab_size=int(tokenizer.get_vocab_size()), max_len=int(max_len))

    def describe(self) -> dict[str, Any]:
        """Sizes and length percentiles of the training set."""
        lens = self.lengths
        p50, p90, p99 = (int(v) for v in np.percentile(lens, [50, 90, 99]))
        return {"train_samples": len(self.train), "eval_samples": len(self.eval),
                "train_tokens": int(lens.sum()), "length_p50": p50, "length_p90": p90,
                "length_p99": p99, "length_max": int(lens.max()), "vocab_size": self.vocab_size}
