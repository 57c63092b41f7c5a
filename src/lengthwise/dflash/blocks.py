"""A collated micro-batch turned into draft blocks: anchors, labels, weights, attention mask.

:func:`make_blocks` takes what :class:`~lengthwise.pytorch.collate.PadCollator` (one
sample per row) or :class:`~lengthwise.pytorch.collate.PackCollator` (samples packed
into rows, positions restarting per sample) returned, plus the dataset index of
every sample, and draws each sample's anchors for this step
(:func:`~lengthwise.dflash.objective.sample_anchors`). A block sees the context
of its own sample strictly before its anchor, every slot of its own block, and
nothing else (:func:`block_attention_mask`).

Example::

    >>> import torch
    >>> from lengthwise.pytorch.collate import PadCollator
    >>> mb = PadCollator(pad_token_id=0, pad_multiple=1)(
    ...     [{"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, 3, 4, 5]}])
    >>> blocks = make_blocks(mb, [[7]], step=0, seed=0, num_anchors=2, block_size=3, gamma=1.0)
    >>> blocks.anchors.tolist(), blocks.labels[0, 0].tolist()
    ([[1, 2]], [-100, 3, 4])
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from lengthwise.dflash.objective import IGNORE, anchor_quota, block_targets, sample_anchors
from lengthwise.errors import DataError

__all__ = ["Blocks", "block_attention_mask", "make_blocks", "row_segments"]


@dataclass
class Blocks:
    """Draft blocks of one micro-batch; rows are the collated rows (``R x C`` tokens).

    ``anchors``/``starts``: ``(R, A)`` anchor position and start of its sample in the
    row (``-1``/``0`` for unused block slots); ``labels``/``weights``: ``(R, A, B)``;
    ``sample_ids``: ``(R, A)`` dataset index of each block's sample (``-1`` unused);
    ``features``: ``(R, C, F)`` the target's features of the rows, read from a cache
    (``None``: the target computes them); ``target_last``: ``(R, C, H)`` the target's last
    hidden states of the rows, from the cache (training with ``labels=target_kl``).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    anchors: torch.Tensor
    starts: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor
    sample_ids: torch.Tensor
    packed: bool
    meta: dict[str, Any]
    features: torch.Tensor | None = None  # the target's features of input_ids, when cached
    target_last: torch.Tensor | None = None  # (R, C, H) the target's last hidden states, cached

    @property
    def weight_sum(self) -> float:
        """Total loss weight of the blocks (the loss normaliser's share of this micro-batch)."""
        return float(self.weights.sum())

    @property
    def slots(self) -> int:
        """Draft slots of the anchors drawn (``anchors x block size``): what ``max_slots`` caps."""
        return int((self.anchors >= 0).sum()) * int(self.labels.shape[-1])

    @property
    def slot_capacity(self) -> int:
        """Slots the block tensors hold (``rows x widest row's anchors x block size``)."""
        return int(self.labels.numel())

    @property
    def supervised(self) -> int:
        """Number of block slots with a label (the accuracy's denominator)."""
        return int((self.labels != IGNORE).sum())

    def to(self, device: Any) -> Blocks:
        """The same blocks with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=True)
        return Blocks(**moved)


def row_segments(batch: dict[str, Any], rows: list[list[int]], packed: bool, capacity: int,
              ) -> tuple[np.ndarray, np.ndarray, list[list[tuple[int, int, int]]]]:
    """Token rows, label rows and per row ``(start, end, sample_id)`` of each sample.

    ``rows``: the dataset indices of each row's samples; ``packed``: rows of ``capacity``
    tokens holding several samples each (a row's filler has sample id ``-1``).
    """
    ids = batch["input_ids"].numpy()
    labels = batch["labels"].numpy()
    if not packed:
        lens = batch["attention_mask"].sum(dim=1).numpy()
        flat = [i for row in rows for i in row]
        if len(flat) != ids.shape[0]:
            raise ValueError(f"{len(flat)} sample ids for a micro-batch of {ids.shape[0]} rows")
        return ids, labels, [[(0, int(n), int(s))] for n, s in zip(lens, flat, strict=True)]
    ids, labels = ids.reshape(-1, capacity), labels.reshape(-1, capacity)
    pos = batch["position_ids"].numpy().reshape(-1, capacity)
    if len(rows) != ids.shape[0]:
        raise ValueError(f"{len(rows)} rows of sample ids for {ids.shape[0]} packed rows")
    segs = []
    for r, row in enumerate(rows):
        starts = np.flatnonzero(pos[r] == 0).tolist()
        ends = starts[1:] + [capacity]
        sample = list(row) + [-1] * (len(starts) - len(row))  # -1: the row's filler
        segs.append([(s, e, int(i)) for s, e, i in zip(starts, ends, sample, strict=True)])
    return ids, labels, segs


def make_blocks(batch: dict[str, Any], rows: list[list[int]], *, step: int, seed: int,
                num_anchors: int, block_size: int, gamma: float,
                capacity: int | None = None, max_slots: int | None = None,
                max_tokens: int | None = None) -> Blocks:
    """Blocks of a collated micro-batch whose samples are the dataset indices in ``rows``.

    ``rows`` is what :class:`~lengthwise.pytorch.sampler.BucketBatchSampler` yields with
    ``yield_rows=True``; ``capacity`` is the packed row length (packed batches only).
    Supervised tokens are those whose label is not ``-100``. With ``max_slots``, each
    sample draws at most its :func:`~lengthwise.dflash.objective.anchor_quota` of
    anchors for a micro-batch budget of ``max_tokens`` tokens, so the blocks hold at
    most ``max_slots`` slots.
    """
    packed = "position_ids" in batch and "attention_mask" not in batch
    if packed and capacity is None:
        capacity = int(batch["input_ids"].shape[1])
    ids, labels, segs = row_segments(batch, rows, packed, capacity or 0)
    mask = labels != IGNORE
    if max_slots is not None:
        if max_tokens is None:
            raise TypeError("max_slots needs max_tokens (the micro-batch token budget)")
        tokens = sum(e - s for row in segs for s, e, i in row if i >= 0)
        if tokens > max_tokens:
            raise DataError(f"a micro-batch holds {tokens} tokens, more than max_tokens="
                            f"{max_tokens} (the token budget the anchor quotas of max_slots "
                            "assume); plan micro-batches with PlanConfig(max_tokens=...)")
    per_row: list[list[tuple[int, int, np.ndarray, np.ndarray]]] = []
    for r, row_segs in enumerate(segs):
        out = []
        for start, end, sample in row_segs:
            if sample < 0:
                continue
            quota = anchor_quota(end - start, num_anchors=num_anchors, block_size=block_size,
                                 max_slots=max_slots, max_tokens=max_tokens or 1)
            anchors = sample_anchors(mask[r, start:end], num_anchors=quota, seed=seed,
                                     step=step, sample_id=sample)
            if anchors.size == 0:
                continue
            lab, w = block_targets(ids[r, start:end], mask[r, start:end], anchors,
                                   block_size=block_size, gamma=gamma)
            out.append((start, sample, anchors + start, np.stack([lab, w])))
        per_row.append(out)
    n_rows = ids.shape[0]
    width = max((sum(a.size for _, _, a, _ in row) for row in per_row), default=0)
    width = max(width, 1)
    anchors = np.full((n_rows, width), -1, dtype=np.int64)
    starts = np.zeros((n_rows, width), dtype=np.int64)
    sample_ids = np.full((n_rows, width), -1, dtype=np.int64)
    lab = np.full((n_rows, width, block_size), IGNORE, dtype=np.int64)
    wts = np.zeros((n_rows, width, block_size), dtype=np.float32)
    for r, row in enumerate(per_row):
        k = 0
        for start, sample, a, lw in row:
            n = a.size
            anchors[r, k:k + n], starts[r, k:k + n], sample_ids[r, k:k + n] = a, start, sample
            lab[r, k:k + n], wts[r, k:k + n] = lw[0], lw[1]
            k += n
    pos = (batch["position_ids"].reshape(n_rows, -1) if packed
           else torch.arange(ids.shape[1]).expand(n_rows, -1))
    meta = {k: batch[k] for k in ("real_tokens", "padded_tokens", "samples", "bucket")
            if k in batch}
    return Blocks(
        input_ids=torch.from_numpy(np.ascontiguousarray(ids)).long(), position_ids=pos.long(),
        attention_mask=None if packed else batch["attention_mask"],
        anchors=torch.from_numpy(anchors), starts=torch.from_numpy(starts),
        labels=torch.from_numpy(lab), weights=torch.from_numpy(wts),
        sample_ids=torch.from_numpy(sample_ids), packed=packed, meta=meta)


def block_attention_mask(anchors: torch.Tensor, starts: torch.Tensor, context_len: int,
                         block_size: int) -> torch.Tensor:
    """Boolean ``(R, A*B, L + A*B)``: which key each block slot may attend to.

    Slot ``s`` of block ``i`` sees context positions ``starts[i] <= kv < anchors[i]``
    and every slot of block ``i``; blocks never see each other; unused blocks
    (anchor ``-1``) see nothing.

    Example::

        >>> m = block_attention_mask(torch.tensor([[2, 3]]), torch.tensor([[0, 0]]), 4, 2)
        >>> m[0].int().tolist()
        [[1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 1, 1], \
[1, 1, 1, 0, 0, 0, 1, 1]]
    """
    valid = anchors >= 0
    kv = torch.arange(context_len, device=anchors.device)
    ctx = (kv < anchors[..., None]) & (kv >= starts[..., None]) & valid[..., None]
    ctx = ctx.repeat_interleave(block_size, dim=1)
    n = anchors.shape[1] * block_size
    block_id = torch.arange(n, device=anchors.device) // block_size
    same = block_id[:, None] == block_id[None, :]
    blk = same[None] & valid.repeat_interleave(block_size, dim=1)[..., None]
    return torch.cat([ctx, blk], dim=-1)
