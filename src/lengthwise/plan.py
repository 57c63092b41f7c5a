"""Epoch plans: every rank's micro-batches for one epoch, a pure function of its inputs.

``plan_epoch(lengths, ...)`` returns the same :class:`EpochPlan` on every rank
given the same lengths, configuration, seed and epoch, so ranks agree with no
communication. Random streams come from ``numpy.random.default_rng([seed, epoch,
stream])``.

Example::

    >>> import numpy as np
    >>> lens = np.random.default_rng(0).integers(1, 2000, 10_000)
    >>> plan = plan_epoch(lens, max_tokens=8192, world_size=4, grad_accum=2)
    >>> [len(plan.rank_batches(r)) for r in range(4)] == [plan.num_batches] * 4
    True
    >>> plan.stats["padding_efficiency"] > 0.9
    True
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

from lengthwise import batching, metrics, orders
from lengthwise.cost import CostModel
from lengthwise.edges import Histogram, auto_edges, solve
from lengthwise.lengths import apply_overflow, load_lengths, validate_lengths

Order = Literal["sorted", "random", "bucket-random", "interleave", "stratified"]
ORDERS: tuple[str, ...] = ("sorted", "random", "bucket-random", "interleave", "stratified")
EVEN_OUT = ("split", "drop", "repeat")
LAYOUTS = ("pad", "pack")

# independent random streams of one (seed, epoch)
_STREAM_BATCHES, _STREAM_ORDER, _STREAM_EVEN = 1, 2, 3


@dataclass(frozen=True)
class PlanConfig:
    """Everything but the lengths, the seed and the epoch that decides a plan."""

    max_tokens: int | None = None
    batch_size: int | None = None
    buckets: int | str | tuple[int, ...] = "auto"
    order: str = "stratified"
    world_size: int = 1
    grad_accum: int = 1
    max_run: int = 3
    max_len: int | None = None
    pad_multiple: int = 1
    on_overflow: str = "truncate"
    even_out: str = "split"
    cost: CostModel | None = None
    max_cost: float | None = None
    layout: str = "pad"
    rows_per_batch: int = 1

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.on_overflow == "split" and self.layout != "pack":
            raise ValueError("on_overflow='split' cuts long samples into packed rows: it needs "
                             "layout='pack'; padded batches use 'truncate', 'drop' or 'error'")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.world_size < 1 or self.grad_accum < 1:
            raise ValueError("world_size and grad_accum must be >= 1")
        if self.even_out not in EVEN_OUT:
            raise ValueError(f"even_out must be one of {EVEN_OUT}, got {self.even_out!r}")
        if isinstance(self.buckets, list):
            object.__setattr__(self, "buckets", tuple(int(e) for e in self.buckets))
        self.row_limit()  # validates the batch rule

    def row_limit(self) -> batching.RowLimit:
        """The batch rule of this configuration."""
        return batching.row_limit(batch_size=self.batch_size, max_tokens=self.max_tokens,
                                  cost=self.cost, max_cost=self.max_cost,
                                  pad_multiple=self.pad_multiple)

    def fingerprint(self, lengths: np.ndarray | None = None) -> int:
        """A 32-bit checksum of the configuration (and lengths), to detect a changed plan.

        Example::

            >>> PlanConfig(batch_size=4).fingerprint() == PlanConfig(batch_size=4).fingerprint()
            True
        """
        fields = dataclasses.asdict(self)
        fields.pop("world_size")  # an elastic restart may change it
        text = repr(sorted(fields.items())).encode()
        crc = zlib.crc32(text)
        if lengths is not None:
            crc = zlib.crc32(np.ascontiguousarray(lengths, dtype=np.int64).tobytes(), crc)
        return crc


@dataclass
class EpochPlan:
    """One epoch's micro-batches for every rank.

    ``indices``/``offsets`` hold the micro-batches in schedule order: batch ``k``
    runs on rank ``k % world_size`` at local position ``k // world_size``, which is
    optimizer step ``position // grad_accum``.
    """

    indices: np.ndarray
    offsets: np.ndarray
    bucket: np.ndarray
    edges: list[int]
    lengths: np.ndarray
    config: PlanConfig
    seed: int
    epoch: int
    plan_seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    #: packed layout: boundaries of the rows inside ``indices`` (several rows per micro-batch)
    row_offsets: np.ndarray | None = None
    #: packed layout with split samples: ``(start, length)`` token span of each entry of ``indices``
    token_spans: np.ndarray | None = None

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def grad_accum(self) -> int:
        return self.config.grad_accum

    @property
    def num_batches(self) -> int:
        """Micro-batches per rank (the same on every rank)."""
        return (self.offsets.size - 1) // self.world_size

    @property
    def total_batches(self) -> int:
        """Micro-batches over all ranks."""
        return self.offsets.size - 1

    def batch(self, k: int) -> np.ndarray:
        """Sample ids of micro-batch ``k`` of the schedule (all ranks)."""
        return self.indices[self.offsets[k] : self.offsets[k + 1]]

    def rank_batches(self, rank: int, start: int = 0) -> list[np.ndarray]:
        """Micro-batches of ``rank`` in order, from its local position ``start`` on."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world_size {self.world_size}")
        first = rank + start * self.world_size
        return [self.batch(k) for k in range(first, self.total_batches, self.world_size)]

    def rank_schedule(self, rank: int) -> np.ndarray:
        """Schedule positions ``k`` of ``rank``'s micro-batches."""
        return np.arange(rank, self.total_batches, self.world_size)

    @cached_property
    def stats(self) -> dict:
        """METRICS.md figures of this plan (computed on first use)."""
        cfg = self.config
        out = metrics.batch_stats(
            self.lengths, self.indices, self.offsets, world_size=cfg.world_size,
            grad_accum=cfg.grad_accum, edges=self.edges, pad_multiple=cfg.pad_multiple,
            cost=cfg.cost, seed=self.seed)
        if cfg.order == "sorted":
            out["efficiency_vs_sorted"] = 1.0
        else:
            ref = sorted_reference(self.lengths, np.unique(self.indices), cfg)
            out["efficiency_vs_sorted"] = out["padding_efficiency"] / ref
        out.update(order=cfg.order, num_buckets=len(self.edges), edges=list(self.edges),
                   num_batches=self.num_batches, plan_seconds=self.plan_seconds)
        out.update(self.counts)
        return out


def sorted_reference(lengths: np.ndarray, ids: np.ndarray, config: PlanConfig) -> float:
    """``padding_efficiency`` of globally length-sorted batches under the same rule."""
    order = ids[np.argsort(lengths[ids], kind="stable")]
    idx, off = batching.greedy_batches(order, lengths, config.row_limit())
    padded = np.sum(np.diff(off) * batching.batch_padded_lengths(lengths, idx, off,
                                                                 config.pad_multiple))
    return float(lengths[idx].sum() / padded)


def _resolve_edges(lengths: np.ndarray, ids: np.ndarray, config: PlanConfig,
                   limit: batching.RowLimit) -> list[int]:
    planned = lengths if ids.size == lengths.size else lengths[ids]
    top = int(planned.max())
    buckets = config.buckets
    if isinstance(buckets, (tuple, list)):
        edges = sorted({int(e) for e in buckets if int(e) > 0})
        if not edges:
            raise ValueError("bucket edges must contain a positive upper edge")
        if edges[-1] < top:
            raise ValueError(f"the last bucket edge {edges[-1]} is below the longest sample "
                             f"({top}); add an edge >= {top} or set max_len")
        return edges
    hist = Histogram.of(planned)
    cost = config.cost or CostModel()
    if buckets == "auto":
        return auto_edges(hist, batch_size=config.batch_size,
                          max_tokens=config.max_tokens if config.max_cost is None else None,
                          pad_multiple=config.pad_multiple, cost=cost)
    if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, bool) and buckets >= 1:
        return solve(hist, int(buckets), pad_multiple=config.pad_multiple, cost=cost).edges(
            int(buckets))
    raise ValueError(f"buckets must be a count, 'auto' or a list of edges, got {buckets!r}")


def index_dtype(n: int) -> type:
    """The smallest integer type that holds sample ids below ``n``."""
    return np.int32 if n < 2**31 else np.int64


def prepare_lengths(lengths, config: PlanConfig, indices: np.ndarray | None = None, *,
                    cap_to_budget: bool = True,
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Validate lengths, apply the overflow policy; return (lengths, planned ids, counts).

    With ``cap_to_budget`` a sample longer than one row of the budget follows
    ``on_overflow`` like one over ``max_len``; the packed layout turns it off to
    split such samples itself (``on_overflow="split"`` truncates only at ``max_len``).
    """
    raw = lengths if isinstance(lengths, np.ndarray) else load_lengths(lengths)
    raw = validate_lengths(raw)
    cap = config.row_limit().max_length() if cap_to_budget else None
    max_len, limit_name = config.max_len, None
    if cap is not None and (max_len is None or cap < max_len):
        max_len, limit_name = cap, f"the {cap} tokens one row of the budget holds"
    policy = "truncate" if config.on_overflow == "split" else config.on_overflow
    lens, keep, counts = apply_overflow(raw, max_len, policy, limit_name=limit_name)
    if indices is not None:
        ids = np.asarray(indices, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= raw.size):
            raise ValueError(f"indices must lie in [0, {raw.size}), got {ids.min()}..{ids.max()}")
        if np.unique(ids).size != ids.size:
            raise ValueError("indices must not repeat a sample id")
        ids = ids[keep[ids]]
    else:
        ids = np.flatnonzero(keep)
    ids = ids.astype(index_dtype(raw.size), copy=False)
    if ids.size == 0:
        raise ValueError("no samples left to plan after dropping empty and over-long ones "
                         f"({counts})")
    return lens, ids, counts


def plan_epoch(
    lengths,
    *,
    epoch: int = 0,
    seed: int = 0,
    max_tokens: int | None = None,
    batch_size: int | None = None,
    buckets: int | str | Sequence[int] = "auto",
    order: Order = "stratified",
    world_size: int = 1,
    grad_accum: int = 1,
    max_run: int = 3,
    max_len: int | None = None,
    pad_multiple: int = 1,
    on_overflow: str = "truncate",
    even_out: str = "split",
    cost: CostModel | None = None,
    max_cost: float | None = None,
    indices: np.ndarray | None = None,
    layout: str = "pad",
    rows_per_batch: int = 1,
    config: PlanConfig | None = None,
) -> EpochPlan:
    """Plan one epoch of micro-batches for ``world_size`` ranks.

    Exactly one of ``max_tokens`` (padded tokens per micro-batch, rows x padded
    length), ``batch_size`` (rows) or ``max_cost`` (with ``cost``) is given.
    ``indices`` restricts the plan to those sample ids (for example the samples
    an interrupted epoch has not trained yet). Samples longer than the budget or
    ``max_len`` follow ``on_overflow``; every sample is planned exactly once
    unless ``even_out`` says otherwise, and ``stats`` counts what happened.

    Example::

        >>> plan = plan_epoch([5, 3, 8, 2, 7, 1], batch_size=2, order="sorted")
        >>> [b.tolist() for b in plan.rank_batches(0)]
        [[5, 3], [1, 0], [4, 2]]
    """
    if config is None:
        config = PlanConfig(
            max_tokens=max_tokens, batch_size=batch_size,
            buckets=buckets if isinstance(buckets, (int, str)) else tuple(buckets),
            order=order, world_size=world_size, grad_accum=grad_accum, max_run=max_run,
            max_len=max_len, pad_multiple=pad_multiple, on_overflow=on_overflow,
            even_out=even_out, cost=cost, max_cost=max_cost, layout=layout,
            rows_per_batch=rows_per_batch)
    if config.layout == "pack":
        from lengthwise.pack import plan_packed_epoch

        return plan_packed_epoch(lengths, config, seed=seed, epoch=epoch, indices=indices)
    started = time.perf_counter()
    lens, ids, counts = prepare_lengths(lengths, config, indices)
    limit = config.row_limit()
    edges = _resolve_edges(lens, ids, config, limit)
    edge_arr = np.asarray(edges, dtype=np.int64)

    def rng(stream: int) -> np.random.Generator:
        return np.random.default_rng([seed, epoch, stream])

    if config.order in ("sorted", "random"):
        if config.order == "sorted":
            seq = ids[np.argsort(lens[ids], kind="stable")]
        else:
            seq = ids[rng(_STREAM_BATCHES).permutation(ids.size)]
        idx, off = batching.greedy_batches(seq, lens, limit)
        longest = batching.batch_longest(lens, idx, off)
        tag = np.searchsorted(edge_arr, longest, side="left")
    else:
        lut = np.searchsorted(edge_arr, np.arange(edges[-1] + 1), side="left").astype(np.int16)
        bucket_of_sample = lut[lens] if ids.size == lens.size else lut[lens[ids]]
        rows = limit.rows(edge_arr)
        idx, off, tag = batching.bucket_batches(ids, bucket_of_sample, rows, rng(_STREAM_BATCHES))
    idx, off, tag, even = batching.even_out(idx, off, tag, config.world_size, config.even_out,
                                            rng(_STREAM_EVEN))
    m = off.size - 1
    o = rng(_STREAM_ORDER)
    if config.order in ("sorted", "random"):
        perm = np.arange(m)
    elif config.order == "bucket-random":
        perm = orders.random_order(m, o)
    elif config.order == "interleave":
        perm = orders.interleave(tag, o, config.world_size)
        perm = orders.limit_runs(perm, tag, config.world_size, config.max_run)
    else:
        batch_cost = (config.cost or CostModel()).batch_cost(
            np.diff(off), batching.batch_padded_lengths(lens, idx, off, config.pad_multiple))
        perm = orders.stratified(tag, batch_cost, config.world_size, config.grad_accum, o)
    if not np.array_equal(perm, np.arange(m)):
        idx, off = batching.take_batches(idx, off, perm)
        tag = tag[perm]
    seconds = time.perf_counter() - started
    counts = dict(counts, planned=int(np.unique(idx).size) if even.repeated else int(idx.size),
                  split_batches=even.split_batches, dropped_to_even_out=even.dropped,
                  repeated=even.repeated)
    return EpochPlan(indices=idx, offsets=off, bucket=tag.astype(np.int32), edges=edges,
                     lengths=lens, config=config, seed=seed, epoch=epoch,
                     plan_seconds=seconds, counts=counts)
