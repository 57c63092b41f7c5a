"""The held-out chats of the DFlash draft benchmarks, and a draft's figures on each.

``benchmarks/draft_levers.py`` and ``benchmarks/reference_trainer.py`` hold out the chats
that ``dflash train`` holds out with the same ``split_seed``
(:func:`~lengthwise.dflash.recipe.split_samples`), whatever each run's own seed, and
measure every draft on each of them alone, at the same anchors, the target's features
read from the cache: the figures pair per chat.

Example::

    >>> import numpy as np
    >>> from lengthwise.dflash.train_config import DFlashTrainConfig
    >>> class Chats(list):  # ten prepared chats of 8 tokens
    ...     lengths = np.full(10, 8)
    ...     def sample(self, j): return self[j]
    ...     def unlearnable_when_cut(self, ids, n): return np.zeros(len(ids), dtype=bool)
    >>> data = Chats({"input_ids": np.arange(8), "labels": np.arange(8)} for _ in range(10))
    >>> a = held_out_chats(data, DFlashTrainConfig(seed=1), 3, split_seed=0)
    >>> b = held_out_chats(data, DFlashTrainConfig(seed=2), 3, split_seed=0)
    >>> a.ids.tolist() == b.ids.tolist(), a.ids.size, a.train.size
    (True, 3, 7)
    >>> [(batch["input_ids"].shape, rows) for batch, rows in a.batches(a.ids[0])]
    [(torch.Size([1, 8]), [[1000000000]])]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HeldOutChats", "every_chat", "held_out_chats"]


@dataclass
class HeldOutChats:
    """Prepared ``data`` split as ``dflash train`` splits it at one split seed: the held-out
    chats ``ids`` and the training ids ``train`` (dataset indices), chats cut to ``max_len``."""

    data: Any
    ids: np.ndarray
    train: np.ndarray
    max_len: int

    def batches(self, j: int) -> list[tuple[dict[str, Any], list[list[int]]]]:
        """Held-out chat ``j`` (a dataset index) alone, cut to ``max_len``, as the held-out
        evaluation's ``(batch, rows)`` pairs."""
        from lengthwise.dflash.teacher_forced import held_out_batches

        return held_out_batches([{k: v[: self.max_len]
                                  for k, v in self.data.sample(int(j)).items()}])

    def figures(self, draft: Any, target: Any, cache: Any, names: Sequence[str],
                **evaluate: Any) -> dict[str, list[Any]]:
        """``draft``'s figures ``names`` (fields of
        :class:`~lengthwise.dflash.teacher_forced.BlockEval`) on each held-out chat, in ``chat``
        order, the target's features read from the feature ``cache``; ``evaluate``: the
        keywords of :func:`~lengthwise.dflash.teacher_forced.evaluate_blocks` (anchors, seed)."""
        from lengthwise.dflash.features import CachedRows
        from lengthwise.dflash.teacher_forced import evaluate_blocks

        per: dict[str, list[Any]] = {"chat": [], **{name: [] for name in names}}
        for j in self.ids:
            rows = CachedRows(cache, draft.config.target_layers, lambda sid, j=j: int(j))
            ev = evaluate_blocks(draft, target, self.batches(int(j)), features=rows, **evaluate)
            per["chat"].append(int(j))
            for name in names:
                per[name].append(getattr(ev, name))
        return per


def every_chat(data: Any, max_len: int) -> HeldOutChats:
    """Every chat of prepared ``data`` (a held-out set of its own), cut to ``max_len``."""
    return HeldOutChats(data, np.arange(len(data)), np.arange(0), max_len)


def held_out_chats(data: Any, cfg: Any, eval_samples: int, *, split_seed: int) -> HeldOutChats:
    """The ``eval_samples`` chats of prepared ``data`` that ``dflash train`` with ``cfg``
    (a :class:`~lengthwise.dflash.train_config.DFlashTrainConfig`) and ``split_seed``
    holds out, and the ones it trains on: the same for every ``cfg.seed``."""
    from lengthwise.dflash.recipe import split_samples

    held, train, _ = split_samples(data, cfg, eval_samples, seed=split_seed)
    return HeldOutChats(data, held, train, cfg.max_len)
