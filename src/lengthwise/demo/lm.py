"""The causal-LM task of the demo: next-token loss of a small Llama-style model.

The loss of a micro-batch is the *sum* of its token losses; the training loop
divides it by the predicted tokens of the whole step (every micro-batch, every
rank). Padded batches carry an ``attention_mask``; packed rows carry
``position_ids`` that restart at every sample (the model keeps attention
inside samples).

Example::

    >>> import torch
    >>> from lengthwise.demo.model import build_model
    >>> task = LMTask(build_model("tiny", vocab_size=64, max_len=16), device="cpu")
    >>> batch = {"input_ids": torch.tensor([[5, 6, 7]]), "labels": torch.tensor([[5, 6, 7]]),
    ...          "attention_mask": torch.ones(1, 3, dtype=torch.long)}
    >>> out = task.forward(task.model, task.prepare(batch, [[0]], 0))
    >>> out.norm, len(out.sample_losses)
    (2.0, 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lengthwise.planning.batching import greedy_batches, row_limit
from lengthwise.pytorch.collate import PadCollator
from lengthwise.train.loop import MicroOut

__all__ = ["LMTask", "evaluate", "evaluate_samples", "token_losses"]


def token_losses(model: Any, batch: dict[str, Any], device: Any,
                 amp: Any = None) -> tuple[Any, Any]:
    """Per-token next-token losses ``(rows, T-1)`` (0 where unpredicted) and the predicted mask."""

    inputs = {k: batch[k].to(device, non_blocking=True)
              for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    labels = batch["labels"][:, 1:].to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        logits = model(**inputs).logits
    logits = logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         ignore_index=-100, reduction="none").reshape(labels.shape)
    return ce, labels != -100


class LMTask:
    """Next-token prediction; ``max_len`` is the packed row length (packed batches only)."""

    def __init__(self, model: Any, *, device: Any, amp: Any = None,
                 max_len: int | None = None) -> None:
        self.model = model
        self.device = torch.device(device)
        self.amp = amp
        self.max_len = max_len

    def prepare(self, batch: dict[str, Any], rows: list[list[int]], step: int) -> dict[str, Any]:
        if "attention_mask" in batch:
            return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
        cap = self.max_len or batch["input_ids"].shape[1]
        n = -(-batch["input_ids"].shape[1] // cap)
        return {k: batch[k].reshape(n, -1) for k in ("input_ids", "labels", "position_ids")}

    def normaliser(self, prepared: dict[str, Any]) -> float:
        return float((prepared["labels"][:, 1:] != -100).sum())

    def forward(self, net: Any, prepared: dict[str, Any]) -> MicroOut:
        ce, predicted = token_losses(net, prepared, self.device, self.amp)
        means, counts = _sample_means(ce.detach(), predicted, prepared)
        return MicroOut(loss=ce.sum(), norm=self.normaliser(prepared), sample_losses=means,
                        sample_weights=counts)

    def step_fields(self, stats: dict[str, float]) -> dict[str, Any]:
        return {}


def _sample_means(ce: Any, predicted: Any, prepared: dict[str, Any],
                  ) -> tuple[list[float], list[float]]:
    """Mean loss and predicted tokens of each sample of the micro-batch (samples with no
    predicted token left out)."""
    loss = ce.cpu().numpy()
    mask = predicted.cpu().numpy()
    if "position_ids" not in prepared:
        seg = np.broadcast_to(np.arange(loss.shape[0])[:, None], loss.shape)
    else:  # packed rows: a sample starts where its position is 0
        starts = prepared["position_ids"].numpy() == 0
        seg = np.cumsum(starts.reshape(-1)).reshape(starts.shape)[:, 1:] - 1
    seg = seg[mask]
    if seg.size == 0:
        return [], []
    sums = np.bincount(seg, weights=loss[mask])
    counts = np.bincount(seg)
    kept = counts > 0
    return (sums[kept] / counts[kept]).tolist(), counts[kept].astype(float).tolist()


def evaluate_samples(model: Any, samples: list[np.ndarray], *, max_tokens: int, device: Any,
                     amp: Any = None, pad_multiple: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Summed next-token loss and predicted tokens of each of ``samples`` (length-sorted
    batches), in the order of ``samples``."""


    collate = PadCollator(pad_token_id=0, pad_multiple=pad_multiple, metadata=False)
    lengths = np.array([s.size for s in samples], dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    limit = row_limit(max_tokens=max_tokens, pad_multiple=pad_multiple)
    ids, offsets = greedy_batches(order, lengths, limit)
    sums = np.zeros(len(samples), dtype=np.float64)
    counts = np.zeros(len(samples), dtype=np.int64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
                rows = ids[lo:hi]
                batch = collate([{"input_ids": samples[i]} for i in rows])
                ce, predicted = token_losses(model, batch, torch.device(device), amp)
                sums[rows] = ce.double().sum(dim=1).cpu().numpy()
                counts[rows] = predicted.sum(dim=1).cpu().numpy()
    finally:
        model.train(was_training)
    return sums, counts


def evaluate(model: Any, samples: list[np.ndarray], *, max_tokens: int, device: Any,
             amp: Any = None, pad_multiple: int = 8) -> float:
    """Mean next-token loss per predicted token over ``samples`` (length-sorted batches)."""
    sums, counts = evaluate_samples(model, samples, max_tokens=max_tokens, device=device,
                                    amp=amp, pad_multiple=pad_multiple)
    return float(sums.sum() / max(int(counts.sum()), 1))
