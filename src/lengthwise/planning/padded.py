"""The padded layout planned: bucket edges, batches re-formed inside buckets, then ordered.

Each micro-batch is ``rows x P`` tokens, ``P`` its longest sample rounded up to
``pad_multiple``. Buckets come from exact padding-optimal edges
(:mod:`~lengthwise.planning.edges`), batches are cut at random inside each bucket
every epoch (:mod:`~lengthwise.planning.batching`), ranks are evened out, and the
micro-batches are put in the configured order (:mod:`~lengthwise.planning.orders`).

Example::

    >>> import numpy as np
    >>> from lengthwise.planning.config import PlanConfig
    >>> lens = np.random.default_rng(0).integers(1, 2000, 5000)
    >>> plan = plan_padded_epoch(lens, PlanConfig(max_tokens=8192, world_size=2))
    >>> bool(np.all(plan.bucket < len(plan.edges)))
    True
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning import batching, metrics, orders, streams
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.cost import CostModel, round_up
from lengthwise.planning.edges import Histogram, auto_choice, solve
from lengthwise.planning.prepare import every_sample, prepare_lengths
from lengthwise.planning.schedule import EpochPlan, even_out_counts
from lengthwise.planning.vocabulary import SEQUENCE_ORDERS

#: solved edges kept, keyed by the histogram of the planned lengths and the batch rule
SOLVED_EDGES_KEPT = 8
_SOLVED: dict[tuple, tuple[tuple[int, ...], str | None]] = {}
_SOLVED_LOCK = threading.Lock()

__all__ = ["PaddedEpochPlan", "check_given_edges", "padded_batch_count", "padded_batch_sets",
           "plan_padded_epoch", "resolve_edges", "resolved_edges", "sorted_reference"]


@dataclass(kw_only=True)
class PaddedEpochPlan(EpochPlan):
    """An :class:`EpochPlan` of padded micro-batches, each drawn from one length bucket.

    ``bucket[k]`` is the bucket of micro-batch ``k``, the bucket of its longest sample
    (what the collator tags it with); bucket ``b`` holds lengths in
    ``(edges[b-1], edges[b]]``.
    """

    bucket: np.ndarray
    edges: list[int]
    #: why some ``"auto"`` buckets hold fewer samples than a bucket is meant to (``None``: none do)
    edges_note: str | None = None

    @cached_property
    def stats(self) -> dict:
        """The figures of ``docs/metrics.md`` (computed on first use)."""
        cfg = self.config
        out = metrics.batch_stats(
            self.lengths, self.indices, self.offsets, world_size=cfg.world_size,
            grad_accum=cfg.grad_accum, edges=self.edges, pad_multiple=cfg.pad_multiple,
            cost=cfg.cost, seed=self.seed, max_tokens=cfg.max_tokens, max_cost=cfg.max_cost)
        if cfg.order == "sorted":
            out["efficiency_vs_sorted"] = 1.0
        else:
            n = self.lengths.size  # every sample planned: no count per id needed
            ids = np.arange(n) if out["unique_samples"] == n else _distinct(self.indices, n)
            ref = sorted_reference(self.lengths, ids, cfg)
            out["efficiency_vs_sorted"] = out["padding_efficiency"] / ref
        out.update(order=cfg.order, balance=cfg.balance, layout="pad",
                   num_buckets=len(self.edges),
                   edges=list(self.edges), edges_note=self.edges_note,
                   num_batches=self.num_batches, plan_seconds=self.plan_seconds)
        out.update(self.counts)
        return out


def sorted_reference(lengths: np.ndarray, ids: np.ndarray, config: PlanConfig) -> float:
    """``padding_efficiency`` of globally length-sorted batches under the same rule."""
    planned = lengths[ids]
    hist = Histogram.of(planned)
    padded = batching.sorted_padded_tokens(hist.values, hist.counts, config.row_limit())
    return float(planned.sum()) / float(padded)


def _distinct(ids: np.ndarray, n: int) -> np.ndarray:
    """The distinct sample ids of a schedule, ascending (ids below ``n``)."""
    return np.flatnonzero(np.bincount(ids, minlength=n))


def check_given_edges(edges, top: int) -> list[int]:
    """The edges a user gave, checked to hold the longest planned sample ``top``.

    Example::

        >>> check_given_edges((8, 32), 30)
        [8, 32]
    """
    edges = list(edges)
    if edges[-1] < top:
        raise ConfigError(f"the last bucket edge {edges[-1]} is below the longest sample "
                          f"({top}); add an edge >= {top} or set max_len")
    return edges


def resolve_edges(lengths: np.ndarray, ids: np.ndarray, config: PlanConfig) -> list[int]:
    """The bucket edges ``config.buckets`` asks for: given, a count solved exactly, or auto.

    Solved edges are kept for the last :data:`SOLVED_EDGES_KEPT` histograms and rules, so
    the plans of later epochs (and of other orders) of the same lengths skip the search.
    """
    return resolved_edges(lengths, ids, config)[0]


def resolved_edges(lengths: np.ndarray, ids: np.ndarray, config: PlanConfig,
                   ) -> tuple[list[int], str | None]:
    """:func:`resolve_edges` and the note of ``"auto"`` edges whose buckets fall below the
    fewest samples a bucket is meant to hold (:meth:`~lengthwise.planning.edges.AutoEdges.note`;
    ``None`` otherwise)."""
    planned = lengths if ids.size == lengths.size else lengths[ids]
    buckets = config.buckets  # checked by PlanConfig: a count, "auto" or sorted edges
    if isinstance(buckets, (tuple, list)):
        return check_given_edges(buckets, int(planned.max())), None
    hist = Histogram.of(planned)
    cost = config.cost or CostModel()
    digest = hashlib.blake2b(hist.values.tobytes(), digest_size=32)
    digest.update(hist.counts.tobytes())  # a digest, not the histogram: keys stay small
    key = (digest.digest(), hist.values.size, str(buckets), config.batch_size,
           config.max_tokens, config.max_cost, config.pad_multiple, cost)
    with _SOLVED_LOCK:
        if key in _SOLVED:
            edges, note = _SOLVED[key]
            return list(edges), note
    note = None
    if buckets == "auto":
        chosen = auto_choice(hist, batch_size=config.batch_size,
                             max_tokens=config.max_tokens if config.max_cost is None else None,
                             pad_multiple=config.pad_multiple, cost=cost)
        edges, note = chosen.edges, chosen.note()
    else:
        edges = solve(hist, int(buckets), pad_multiple=config.pad_multiple, cost=cost).edges(
            int(buckets))
    with _SOLVED_LOCK:
        _SOLVED[key] = (tuple(edges), note)
        while len(_SOLVED) > SOLVED_EDGES_KEPT:
            del _SOLVED[next(iter(_SOLVED))]
    return edges, note


def _batches(lens: np.ndarray, ids: np.ndarray, edges: list[int], config: PlanConfig,
             seed: int, epoch: int, every: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Micro-batches with their bucket tags: greedy over one sequence, or inside buckets
    (``every``: ``ids`` are every sample in order, see :func:`every_sample`)."""
    limit = config.row_limit()
    edge_arr = np.asarray(edges, dtype=np.int64)
    if config.order in SEQUENCE_ORDERS:
        if config.order == "sorted":
            seq = ids[np.argsort(lens[ids], kind="stable")]
        else:
            seq = ids[streams.rng(seed, epoch, streams.BATCHES).permutation(ids.size)]
        idx, off = batching.greedy_batches(seq, lens, limit)
        longest = batching.batch_longest(lens, idx, off)
        return idx, off, np.searchsorted(edge_arr, longest, side="left")
    return batching.bucket_batches(None if every else ids,
                                   _sample_buckets(lens, ids, edge_arr, every),
                                   limit.rows(edge_arr),
                                   streams.rng(seed, epoch, streams.BATCHES))


def _sample_buckets(lens: np.ndarray, ids: np.ndarray, edge_arr: np.ndarray,
                    every: bool) -> np.ndarray:
    """The bucket of each planned sample, in the order of ``ids``."""
    # a lookup table as small as the lengths; memory must not grow with the longest length
    return _buckets_of(lens if every else lens[ids], edge_arr, 4 * lens.size + 1_000_000)


def _buckets_of(values: np.ndarray, edge_arr: np.ndarray, table_limit: int) -> np.ndarray:
    """The bucket of each length in ``values`` (:func:`~batching.bucket_dtype`): read from a
    table of every length up to the last edge when that is at most ``table_limit`` long."""
    small = batching.bucket_dtype(edge_arr.size)
    if edge_arr[-1] <= table_limit:
        lut = np.searchsorted(edge_arr, np.arange(edge_arr[-1] + 1), side="left").astype(small)
        return lut[values]
    return np.searchsorted(edge_arr, values, side="left").astype(small)


def padded_batch_count(lengths, config: PlanConfig) -> int | None:
    """Micro-batches per rank of :func:`plan_padded_epoch` with these lengths and
    ``config``, counted from the bucket sizes without shuffling, cutting or ordering a
    batch; ``None`` for the orders that cut batches along a sequence (``sorted``, ``random``).
    """
    if config.order in SEQUENCE_ORDERS:
        return None
    lens, ids, _ = prepare_lengths(lengths, config)
    edge_arr = np.asarray(resolve_edges(lens, ids, config), dtype=np.int64)
    rows = config.row_limit().rows(edge_arr)
    sizes = np.bincount(_sample_buckets(lens, ids, edge_arr, every_sample(ids, lens.size, None)),
                        minlength=edge_arr.size)
    m = batching.bucket_batch_count(sizes, rows)
    evened = batching.evened_count(m, ids.size, config.world_size, config.even_out)
    return evened // config.world_size


def _order(off: np.ndarray, tag: np.ndarray, longest: np.ndarray, sample_lens: np.ndarray,
           config: PlanConfig, o: np.random.Generator) -> np.ndarray:
    """The permutation of the micro-batches that ``config.order`` asks for.

    ``longest`` is each micro-batch's longest sample, ``sample_lens`` the lengths of
    its samples in schedule order (``lengths[indices]``).
    """
    m = off.size - 1
    if config.order in SEQUENCE_ORDERS:
        return np.arange(m)
    if config.order == "bucket-random":
        return o.permutation(m)  # the bucketed shuffle: batches in random order
    if config.order == "interleave":
        perm = orders.interleave(tag, o, config.world_size)
        return orders.limit_runs(perm, tag, config.world_size, config.max_run)
    batch_cost = (config.cost or CostModel()).batch_cost(
        np.diff(off), np.asarray(round_up(longest, config.pad_multiple)))
    if config.balance == "level":
        return orders.cost_levels(batch_cost, config.world_size, config.grad_accum, o)
    return orders.stratified(tag, batch_cost, config.world_size, config.grad_accum, o,
                             batch_length=metrics.token_means(sample_lens, off))


def plan_padded_epoch(lengths, config: PlanConfig, *, seed: int = 0, epoch: int = 0,
                      indices: np.ndarray | None = None) -> PaddedEpochPlan:
    """Plan one epoch of padded micro-batches (``layout="pad"``).

    A pure function of the lengths, the configuration, ``seed`` and ``epoch``;
    ``indices`` restricts it to those samples.
    """
    started = time.perf_counter()
    lens, counts, (edges, note), idx, off, tag, even = _formed(lengths, config, seed, epoch,
                                                               indices)
    sample_lens = lens[idx]
    longest = batching.longest_per_batch(sample_lens, off)
    perm = _order(off, tag, longest, sample_lens, config,
                  streams.rng(seed, epoch, streams.ORDER))
    if not np.array_equal(perm, np.arange(off.size - 1)):
        idx, off = batching.take_batches(idx, off, perm)
        longest = longest[perm]
    # each micro-batch is tagged with the bucket of its longest sample, as the collator
    # tags it: a piece split off a batch to even out the ranks may hold shorter ones only
    tag = _buckets_of(longest, np.asarray(edges, dtype=np.int64), 4 * longest.size)
    return PaddedEpochPlan(
        indices=idx.astype(batching.index_dtype(lens.size), copy=False), offsets=off,
        bucket=tag.astype(np.int32), edges=edges, edges_note=note, lengths=lens,
        config=config, seed=seed, epoch=epoch, plan_seconds=time.perf_counter() - started,
        counts=even_out_counts(counts, idx, idx.size, even))


def _formed(lengths, config: PlanConfig, seed: int, epoch: int, indices: np.ndarray | None):
    """The epoch's micro-batches before ordering: lengths, counts, (edges, their note),
    batches, even-out."""
    lens, ids, counts = prepare_lengths(lengths, config, indices)
    edges, note = resolved_edges(lens, ids, config)
    idx, off, tag = _batches(lens, ids, edges, config, seed, epoch,
                             every_sample(ids, lens.size, indices))
    idx, off, tag, even = batching.even_out(idx, off, tag, config.world_size, config.even_out,
                                            streams.rng(seed, epoch, streams.EVEN))
    return lens, counts, (edges, note), idx, off, tag, even


def padded_batch_sets(lengths, config: PlanConfig, *, seed: int = 0, epoch: int = 0,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, offsets)`` of the micro-batches :func:`plan_padded_epoch` forms, before it
    orders them: the same sample sets, for figures that do not depend on the order
    (``recomposition``), without the cost of ordering.

    Example::

        >>> lens = np.random.default_rng(0).integers(1, 2000, 5000)
        >>> cfg = PlanConfig(max_tokens=8192, world_size=2)
        >>> idx, off = padded_batch_sets(lens, cfg, epoch=1)
        >>> off.size - 1 == plan_padded_epoch(lens, cfg, epoch=1).total_batches
        True
    """
    lens, _, _, idx, off, _, _ = _formed(lengths, config, seed, epoch, None)
    return idx.astype(batching.index_dtype(lens.size), copy=False), off
