"""Adapters that run other batching libraries through their public APIs, on lengths alone.

Every adapter turns per-sample token lengths into one epoch of micro-batches for
``world_size`` ranks, in the schedule order of lengthwise's plans: micro-batch
``k`` runs on rank ``k % world_size`` at local position ``k // world_size``. So
the same code (:func:`lengthwise.planning.metrics.batch_stats`) measures every method.

Each adapter reproduces how a training run really calls the library, including
how its trainer shards batches over ranks, and says so in ``call``. Micro-batches
that a library drops or repeats to even out ranks stay visible: the schedule
holds exactly what the ranks would train, and :func:`coverage` counts the rest.

Example::

    >>> import numpy as np
    >>> lens = np.random.default_rng(0).integers(16, 2048, 2000)
    >>> run = LengthwisePlan("stratified").make_batches(lens, batch_size=4, world_size=8, seed=0)
    >>> coverage(run, lens.size)["missing"]
    0
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

#: the regimes a method can run in: fixed rows, a padded-token budget, or packed rows
RULES = ("rows", "tokens", "pack")


@dataclass
class Schedule:
    """One epoch of micro-batches for all ranks, in schedule order.

    ``capacity`` is set for the packed layout (tokens per micro-batch); ``setup_*``
    is the one-time work before planning (building a library's own data objects
    from the lengths), kept apart from ``plan_seconds``.
    """

    indices: np.ndarray
    offsets: np.ndarray
    world_size: int
    plan_seconds: float
    peak_bytes: int | None
    memory_method: str
    capacity: int | None = None
    setup_seconds: float = 0.0
    truncated_tokens: int = 0
    #: micro-batches halved so that every rank gets the same number (no sample lost)
    split_batches: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def num_batches(self) -> int:
        return self.offsets.size - 1

    def batches(self) -> list[np.ndarray]:
        """The micro-batches as a list (schedule order)."""
        return [self.indices[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:],
                                                   strict=True)]


def from_batches(batches: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Flatten a list of micro-batches into ``(indices, offsets)``.

    Example::

        >>> idx, off = from_batches([[3, 1], [2]])
        >>> idx.tolist(), off.tolist()
        ([3, 1, 2], [0, 2, 3])
    """
    sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    if offsets[-1] == 0:
        return np.zeros(0, dtype=np.int64), offsets
    flat = np.fromiter((int(i) for b in batches for i in b), dtype=np.int64,
                       count=int(offsets[-1]))
    return flat, offsets


def interleave_ranks(per_rank: Sequence[Sequence[Sequence[int]]]) -> list[Sequence[int]]:
    """Merge each rank's micro-batch list into one schedule (position-major, then rank).

    Ranks with fewer micro-batches than others must be the last ranks of the final
    round (as with round-robin sharding); otherwise a gap would shift the ranks.

    Example::

        >>> interleave_ranks([[[0], [2]], [[1]]])
        [[0], [1], [2]]
    """
    out: list[Sequence[int]] = []
    longest = max((len(r) for r in per_rank), default=0)
    for pos in range(longest):
        seen_gap = False
        for rank_batches in per_rank:
            if pos < len(rank_batches):
                if seen_gap:
                    raise ValueError("a rank without a micro-batch precedes one with a batch")
                out.append(rank_batches[pos])
            else:
                seen_gap = True
    return out


def coverage(run: Schedule, num_samples: int) -> dict[str, int]:
    """Samples of the data set missing from an epoch, and extra copies of samples in it.

    Example::

        >>> run = Schedule(np.array([0, 1, 1]), np.array([0, 2, 3]), 1, 0.0, None, "none")
        >>> coverage(run, 3)
        {'scheduled': 3, 'unique': 2, 'missing': 1, 'repeated': 1, 'out_of_range': 0}
    """
    idx = run.indices
    bad = int(np.count_nonzero((idx < 0) | (idx >= num_samples)))
    counts = np.bincount(idx[(idx >= 0) & (idx < num_samples)], minlength=num_samples)
    return {
        "scheduled": int(idx.size),
        "unique": int(np.count_nonzero(counts)),
        "missing": int(np.count_nonzero(counts == 0)),
        "repeated": int((counts[counts > 1] - 1).sum()),
        "out_of_range": bad,
    }


# ---------------------------------------------------------------- memory and time


def _proc_status(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return False
    return _proc_status("VmHWM") is not None


@dataclass
class Measured:
    """Wall time and peak memory of one timed block."""

    seconds: float = 0.0
    peak_bytes: int | None = None
    method: str = "none"


@contextlib.contextmanager
def measure(memory: bool = True) -> Iterator[Measured]:
    """Time a block and record its peak memory above the memory in use when it began.

    Peak memory is the growth of the process's peak resident set (``VmHWM``, reset
    through ``/proc/self/clear_refs``), which counts NumPy, torch and native
    allocations alike; where that is unavailable, ``tracemalloc`` (Python and
    NumPy allocations only; it also slows the block) is used. ``method`` says which.

    Example::

        >>> with measure() as m:
        ...     _ = np.ones(1_000_000)
        >>> m.seconds > 0 and m.method in ("rss", "tracemalloc")
        True
    """
    out = Measured()
    use_rss = memory and _reset_peak_rss()
    use_trace = memory and not use_rss
    base = _proc_status("VmRSS") if use_rss else None
    if use_trace:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.seconds = time.perf_counter() - start
        if use_rss and base is not None:
            peak = _proc_status("VmHWM")
            out.peak_bytes = max(0, (peak or base) - base)
            out.method = "rss"
        elif use_trace:
            out.peak_bytes = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            out.method = "tracemalloc"


# ---------------------------------------------------------------- the adapters


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class Adapter:
    """A batching method measured by the benchmarks.

    ``rules`` lists the regimes it runs in; ``call`` is the exact way it is called.
    """

    name: str = ""
    key: str = ""
    package: str = ""
    rules: tuple[str, ...] = ()
    call: str = ""
    #: plans for different epochs differ only by a reshuffle of fixed batches
    static_batches: bool = False

    @property
    def version(self) -> str | None:
        return _version(self.package)

    def available(self) -> bool:
        """Whether the package this adapter needs is installed and importable."""
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> str | None:
        return None if self.version is not None else f"{self.package} is not installed"

    def make_batches(self, lengths: np.ndarray, *, world_size: int, seed: int, epoch: int = 0,
                     batch_size: int | None = None, max_tokens: int | None = None,
                     capacity: int | None = None, buckets: int | str = "auto",
                     memory: bool = True) -> Schedule:
        """One epoch of micro-batches for ``world_size`` ranks (schedule order)."""
        raise NotImplementedError


def _need(value: int | None, what: str, adapter: str) -> int:
    if value is None or int(value) < 1:
        raise ValueError(f"{adapter} needs a positive {what}")
    return int(value)


def hf_trainer_shards(batches: Sequence[Sequence[int]], batch_size: int | None,
                      world_size: int, even_batches: bool,
                      ranks: Sequence[int] | None = None) -> list[list[list[int]]]:
    """Shard a DataLoader's batches over ranks the way ``accelerate.prepare`` does.

    The Hugging Face ``Trainer`` wraps its batch sampler in accelerate's
    ``BatchSamplerShard`` (``split_batches=False``): batch ``i`` goes to rank
    ``i % world_size``; with ``even_batches`` the last round is completed with
    samples from the start of the epoch. Returns the batches of each of ``ranks``
    (default: all).
    """
    from accelerate.data_loader import BatchSamplerShard

    class _Fixed:  # a batch sampler that replays precomputed batches
        def __init__(self) -> None:
            self.batch_size = batch_size
            self.drop_last = False

        def __iter__(self):
            return iter(batches)

        def __len__(self) -> int:
            return len(batches)

    return [
        [list(b) for b in BatchSamplerShard(_Fixed(), num_processes=world_size, process_index=r,
                                            split_batches=False, even_batches=even_batches)]
        for r in (range(world_size) if ranks is None else ranks)
    ]


def fixed_size_batches(order: Sequence[int], batch_size: int) -> list[list[int]]:
    """``torch.utils.data.BatchSampler(order, batch_size, drop_last=False)`` as a list."""
    from torch.utils.data import BatchSampler

    return [list(b) for b in BatchSampler(order, batch_size, drop_last=False)]


class HFLengthGrouped(Adapter):
    """``transformers`` ``LengthGroupedSampler``: ``train_sampling_strategy="group_by_length"``."""

    name = "HF LengthGroupedSampler (group_by_length)"
    key = "hf_group_by_length"
    package = "transformers"
    rules = ("rows",)
    call = ("LengthGroupedSampler(batch_size, lengths=list_of_ints, generator=torch.Generator()"
            ".manual_seed(seed + epoch)) -> DataLoader BatchSampler(batch_size, drop_last=False) "
            "-> accelerate BatchSamplerShard(num_processes=W, split_batches=False, "
            "even_batches=True) per rank, as Trainer builds it")

    def unavailable_reason(self) -> str | None:
        if self.version is None or _version("torch") is None or _version("accelerate") is None:
            return "needs transformers, torch and accelerate"
        return None

    def make_batches(self, lengths, *, world_size, seed, epoch=0, batch_size=None,
                     max_tokens=None, capacity=None, buckets="auto", memory=True) -> Schedule:
        import torch
        from transformers.trainer_pt_utils import LengthGroupedSampler

        rows = _need(batch_size, "batch_size", self.name)
        as_list = np.asarray(lengths).tolist()  # the Trainer reads lengths as a list column
        with measure(memory) as m:  # what each rank computes: the sampler, then its own share
            sampler = LengthGroupedSampler(
                rows, lengths=as_list, generator=torch.Generator().manual_seed(seed + epoch))
            order = list(sampler)
            global_batches = fixed_size_batches(order, rows)
            hf_trainer_shards(global_batches, rows, world_size, True, ranks=[0])
        per_rank = hf_trainer_shards(global_batches, rows, world_size, even_batches=True)
        idx, off = from_batches(interleave_ranks(per_rank))
        return Schedule(idx, off, world_size, m.seconds, m.peak_bytes, m.method)


class HFBatchRebalance(Adapter):
    """``transformers`` ``BatchRebalanceSampler``: ``train_sampling_strategy="batch_rebalance"``."""

    name = "HF BatchRebalanceSampler (batch_rebalance)"
    key = "hf_batch_rebalance"
    package = "transformers"
    rules = ("rows",)
    call = ("BatchRebalanceSampler(lengths, effective_batch_size=batch_size*W*G, dp_size=W, "
            "grad_accum=G, seed=seed, rank=r, drop_last=False) with set_epoch(epoch), as "
            "Trainer passes it to DataLoader(batch_sampler=...); each rank's sampler computes "
            "every rank's split and keeps its own, so one pass yields all ranks")

    def unavailable_reason(self) -> str | None:
        if self.version is None:
            return "transformers is not installed"
        if importlib.util.find_spec("transformers") is None:
            return "transformers is not importable"
        try:
            from transformers.trainer_pt_utils import BatchRebalanceSampler  # noqa: F401
        except ImportError:
            return f"transformers {self.version} has no BatchRebalanceSampler"
        return None

    @staticmethod
    def all_ranks_sampler(**kwargs):
        """The library's sampler, yielding every rank's micro-batches of each step.

        Only the rank selection changes: each global batch is split by the sampler's
        own ``_assign`` exactly as on every rank, and the micro-batches come out in
        schedule order (slot-major, then rank) instead of rank ``r``'s alone.
        """
        from transformers.trainer_pt_utils import BatchRebalanceSampler

        class AllRanks(BatchRebalanceSampler):
            def _yield_global_batch(self, batch_indices):
                lens = [self.lengths[i] for i in batch_indices]
                split = self._assign(batch_indices, lens)
                for slot in range(self.grad_accum):
                    for rank in range(self.dp_size):
                        yield split[rank][slot]

        return AllRanks(**kwargs)

    def make_batches(self, lengths, *, world_size, seed, epoch=0, batch_size=None,
                     max_tokens=None, capacity=None, buckets="auto", memory=True) -> Schedule:
        rows = _need(batch_size, "batch_size", self.name)
        as_list = np.asarray(lengths).tolist()
        with measure(memory) as m:
            sampler = self.all_ranks_sampler(
                lengths=as_list, effective_batch_size=rows * world_size, dp_size=world_size,
                grad_accum=1, seed=seed, rank=0, drop_last=False)
            sampler.set_epoch(epoch)
            batches = list(sampler)
        idx, off = from_batches(batches)
        return Schedule(idx, off, world_size, m.seconds, m.peak_bytes, m.method)


class LhotseDynamicBucketing(Adapter):
    """``lhotse`` ``DynamicBucketingSampler`` with token lengths as cut durations."""

    name = "lhotse DynamicBucketingSampler"
    key = "lhotse_dynamic_bucketing"
    package = "lhotse"
    rules = ("tokens",)
    call = ("CutSet of MonoCut(id=str(i), start=0, duration=L_i, channel=0) in a once-shuffled "
            "order (a shuffled manifest); DynamicBucketingSampler(cuts, max_duration=max_tokens, "
            "num_buckets=B (lhotse default 10), shuffle=True, drop_last=False, seed=seed, "
            "world_size=W, rank=r) with set_epoch(epoch); rank r keeps batch r of every W drawn")

    def __init__(self) -> None:
        self._cuts_key: tuple | None = None
        self._cuts = None
        self._cuts_seconds = 0.0

    def cut_set(self, lengths: np.ndarray, seed: int):
        """Dummy cuts whose durations are the lengths (built once per data set and seed)."""
        from lhotse import CutSet, MonoCut

        key = (id(lengths), lengths.size, seed)
        if self._cuts_key != key:
            start = time.perf_counter()
            order = np.random.default_rng([seed, 0x1407]).permutation(lengths.size)
            lens = lengths[order].tolist()
            self._cuts = CutSet.from_cuts(
                MonoCut(id=str(i), start=0.0, duration=float(n), channel=0)
                for i, n in zip(order.tolist(), lens, strict=True))
            self._cuts_seconds = time.perf_counter() - start
            self._cuts_key = key
        return self._cuts

    def make_batches(self, lengths, *, world_size, seed, epoch=0, batch_size=None,
                     max_tokens=None, capacity=None, buckets="auto", memory=True) -> Schedule:
        from lhotse import combine
        from lhotse.dataset import DynamicBucketingSampler

        budget = _need(max_tokens, "max_tokens", self.name)
        lengths = np.asarray(lengths)
        cuts = self.cut_set(lengths, seed)
        num_buckets = buckets if isinstance(buckets, int) else 10
        drawn: list = []
        with measure(memory) as m, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = DynamicBucketingSampler(
                cuts, max_duration=float(budget), num_buckets=num_buckets, shuffle=True,
                drop_last=False, seed=seed, world_size=world_size, rank=0)
            sampler.set_epoch(epoch)
            draw = sampler._next_batch

            def record():
                batch = draw()
                drawn.append(batch)
                return batch

            sampler._next_batch = record  # see every rank's batch, not only rank 0's
            rank0 = [[c.id for c in b] for b in sampler]
        whole = len(drawn) - len(drawn) % world_size
        batches = [[c.id for c in b] for b in drawn[:whole]]
        if whole < len(drawn):  # the sampler's own end-of-epoch redistribution over ranks
            combined = combine(drawn[whole:])
            chunk = 0
            while len(combined) < world_size:
                extra = combined.subset(first=world_size - len(combined))
                combined = combined + extra.modify_ids(lambda cid, c=chunk: f"{cid}_dup{c}")
                chunk += 1
            batches += [[c.id for c in part] for part in combined.split(world_size)]
        if [b for b in batches[::world_size]] != rank0:
            raise RuntimeError("lhotse: recorded batches disagree with rank 0's batches")
        idx, off = from_batches([[int(cid.split("_")[0]) for cid in b] for b in batches])
        run = Schedule(idx, off, world_size, m.seconds, m.peak_bytes, m.method,
                       setup_seconds=self._cuts_seconds)
        run.notes.append("CutSet built once from the lengths (setup_seconds), not per epoch")
        return run


class TRLPack(Adapter):
    """TRL ``pack_dataset`` (best-fit decreasing), then the Trainer's random row order."""

    name = "TRL pack_dataset (BFD)"
    key = "trl_pack_bfd"
    package = "trl"
    rules = ("pack",)
    static_batches = True
    call = ("datasets.Dataset with an input_ids list column of the given lengths (null values: "
            "lengths only); trl.pack_dataset(ds, seq_length=capacity, strategy='bfd') as "
            "SFTTrainer(packing=True) calls it (map batches of 1,000); packed rows then go "
            "through RandomSampler(generator seeded seed+epoch), batch of 1 row, accelerate "
            "BatchSamplerShard(even_batches=True)")

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._rows: list[np.ndarray] | None = None
        self._pack_seconds = 0.0
        self._pack_peak: int | None = None
        self._pack_method = "none"
        self._setup_seconds = 0.0
        self._truncated = 0

    def unavailable_reason(self) -> str | None:
        if self.version is None or _version("datasets") is None or _version("pyarrow") is None:
            return "needs trl, datasets and pyarrow"
        return None

    #: ``datasets.Dataset.map`` default batch size, which ``pack_dataset`` packs within
    MAP_BATCH = 1000

    def pack(self, lengths: np.ndarray, capacity: int, memory: bool = True):
        """Packed rows of sample ids (the packing itself is deterministic and done once)."""
        key = (id(lengths), lengths.size, capacity)
        if self._key == key:
            return
        import datasets
        import pyarrow as pa
        import pyarrow.compute as pc
        from trl import pack_dataset

        start = time.perf_counter()
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.nulls(int(offsets[-1])))
        ds = datasets.Dataset(pa.table({"input_ids": column}))
        self._setup_seconds = time.perf_counter() - start
        with measure(memory) as m:
            packed = pack_dataset(ds, seq_length=capacity, strategy="bfd")
            seq_lengths = packed.with_format("arrow")["seq_lengths"].combine_chunks()
        if isinstance(seq_lengths, pa.ChunkedArray):
            seq_lengths = seq_lengths.combine_chunks()
        row_sizes = pc.list_value_length(seq_lengths).to_numpy(zero_copy_only=False)
        out_lens = seq_lengths.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        self._rows = self._recover_ids(lengths, capacity, row_sizes, out_lens)
        self._pack_seconds, self._pack_peak, self._pack_method = m.seconds, m.peak_bytes, m.method
        self._truncated = int(np.maximum(lengths - capacity, 0).sum())
        self._key = key

    def _recover_ids(self, lengths: np.ndarray, capacity: int, row_sizes: np.ndarray,
                     out_lens: np.ndarray) -> list[np.ndarray]:
        """Sample id of every packed entry, from the packed lengths alone.

        ``pack_dataset`` packs each map batch of ``MAP_BATCH`` samples on its own
        and writes that batch's rows before the next batch's, so entry ``p`` of
        the flattened output comes from input batch ``p // MAP_BATCH``. Within a
        batch, entries of equal length are matched to ids of that length in
        order; which of several equal-length samples sits where does not change
        any length-based figure. A mismatch of the length multisets raises.
        """
        kept = np.flatnonzero(lengths > 0)  # pack_dataset drops empty rows inside each batch
        if out_lens.size != kept.size:
            raise RuntimeError(f"trl packed {out_lens.size} samples of {kept.size}")
        in_lens = np.minimum(lengths[kept], capacity)
        in_batch = kept // self.MAP_BATCH
        per_batch = np.bincount(in_batch, minlength=-(-lengths.size // self.MAP_BATCH))
        out_batch = np.repeat(np.arange(per_batch.size), per_batch)
        in_order = np.lexsort((kept, in_lens, in_batch))
        out_order = np.lexsort((np.arange(out_lens.size), out_lens, out_batch))
        if not np.array_equal(in_lens[in_order], out_lens[out_order]):
            raise RuntimeError("trl: packed lengths differ from the input lengths per map batch")
        ids = np.empty(out_lens.size, dtype=np.int64)
        ids[out_order] = kept[in_order]
        bounds = np.concatenate(([0], np.cumsum(row_sizes)))
        return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def make_batches(self, lengths, *, world_size, seed, epoch=0, batch_size=None,
                     max_tokens=None, capacity=None, buckets="auto", memory=True) -> Schedule:
        import torch
        from torch.utils.data import RandomSampler

        cap = _need(capacity, "capacity", self.name)
        lengths = np.asarray(lengths)
        self.pack(lengths, cap, memory)
        rows = self._rows
        with measure(False) as m:
            order = list(RandomSampler(range(len(rows)),
                                       generator=torch.Generator().manual_seed(seed + epoch)))
            per_rank = hf_trainer_shards(fixed_size_batches(order, 1), 1, world_size, True)
        batches = [np.concatenate([rows[r] for r in b]) for b in interleave_ranks(per_rank)]
        idx, off = from_batches(batches)
        run = Schedule(idx, off, world_size, self._pack_seconds + m.seconds, self._pack_peak,
                       self._pack_method, capacity=cap, setup_seconds=self._setup_seconds,
                       truncated_tokens=self._truncated)
        run.notes.append("packing runs once as preprocessing; epochs reshuffle the same rows")
        return run


class AxolotlMultipack(Adapter):
    """axolotl ``MultipackBatchSampler`` (sample packing), as its trainer builds it."""

    name = "axolotl MultipackBatchSampler"
    key = "axolotl_multipack"
    package = "axolotl"
    rules = ("pack",)
    call = ("MultipackBatchSampler(RandomSampler(generator seeded seed+epoch), batch_size=1, "
            "batch_max_len=capacity, lengths=lengths, bin_size=200, group_size=100_000, "
            "num_processes=1, drop_last=True) with WORLD_SIZE=W set, len(sampler) then "
            "iteration, as axolotl's trainer does; accelerate BatchSamplerShard(even_batches="
            "False) deals bins round-robin")

    def unavailable_reason(self) -> str | None:
        if self.version is None:
            return "axolotl is not installed"
        try:
            from axolotl.utils.samplers.multipack import MultipackBatchSampler  # noqa: F401
        except Exception as exc:  # an incomplete install fails in many ways
            return f"axolotl's sampler does not import: {type(exc).__name__}: {exc}"
        return None

    _warm = False

    def _warm_up(self) -> None:
        """Compile the numba kernels once, outside the timed region."""
        if not AxolotlMultipack._warm:
            self._run(np.full(64, 8, dtype=np.int64), 64, 1, 0, 0)
            AxolotlMultipack._warm = True

    @staticmethod
    def _run(lengths: np.ndarray, capacity: int, world_size: int, seed: int, epoch: int):
        import torch
        from axolotl.utils.samplers.multipack import MultipackBatchSampler
        from torch.utils.data import RandomSampler

        old = os.environ.get("WORLD_SIZE")
        os.environ["WORLD_SIZE"] = str(world_size)
        try:
            sampler = MultipackBatchSampler(
                RandomSampler(range(lengths.size),
                              generator=torch.Generator().manual_seed(seed + epoch)),
                batch_size=1, batch_max_len=capacity, lengths=lengths, bin_size=200,
                group_size=100_000, num_processes=1, drop_last=True)
            len(sampler)
            return [b[0] for b in sampler]
        finally:
            if old is None:
                os.environ.pop("WORLD_SIZE", None)
            else:
                os.environ["WORLD_SIZE"] = old

    def make_batches(self, lengths, *, world_size, seed, epoch=0, batch_size=None,
                     max_tokens=None, capacity=None, buckets="auto", memory=True) -> Schedule:
        cap = _need(capacity, "capacity", self.name)
        lengths = np.asarray(lengths)
        self._warm_up()
        with measure(memory) as m:
            bins = self._run(lengths, cap, world_size, seed, epoch)
        per_rank = hf_trainer_shards([[b] for b in bins], 1, world_size, even_batches=False)
        batches = [list(group[0]) for group in interleave_ranks(per_rank)]
        idx, off = from_batches(batches)
        run = Schedule(idx, off, world_size, m.seconds, m.peak_bytes, m.method, capacity=cap)
        run.notes.append("numba kernels compiled before timing")
        return run


class FairseqStyle(Adapter):
    """A sorted token-budget batcher following fairseq's documented ``batch_by_size`` rule.

    fairseq 0.12.2 (the last release) fails to import on Python 3.11 (its dataclass
    configs use mutable defaults), so this follows its rule instead of calling it:
    indices sorted by length with ties in a seeded random order; batches filled
    greedily while ``rows * longest <= max_tokens``, their size rounded down to a
    multiple of ``required_batch_size_multiple`` (8) when the budget is hit; the
    batches are fixed for the run and reshuffled every epoch (seed + epoch); batch
    ``i`` goes to rank ``i % W``, and the last round's missing ranks get an empty
    placeholder batch (not scheduled here).
    """

    name = "fairseq-style token batching (rule of batch_by_size)"
    key = "fairseq_style"
    package = "numpy"
    rules = ("tokens",)
    static_batches = True
    call = ("written from fairseq's rule (fairseq 0.12.2 does not import on Python 3.11): "
            "ordered_indices = stable sort of a seeded permutation by length; "
            "batch_by_size(max_tokens, required_batch_size_multiple=8); epoch shuffle of the "
            "fixed batches (seed+epoch); ShardedIterator: batch i -> rank i % W")
    MULTIPLE = 8

    @property
    def version(self) -> str | None:
        return "rule of fairseq 0.12.2"

    @staticmethod
    def batch_by_size(order: np.ndarray, lengths: np.ndarray, max_tokens: int,
                      multiple: int = 8) -> list[tuple[int, int]]:
        """Greedy batches along ``order`` (ascending lengths) as ``(start, stop)`` slices."""
        lens = lengths[order]
        n = lens.size
        spans = []
        start = 0
        while start < n:
            # rows c allowed while c * lens[start + c - 1] <= max_tokens (lens ascending)
            c_max = min(n - start, max(1, max_tokens // int(lens[start])))
            lo, hi = 1, c_max
            window = lens[start:start + c_max]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if mid * int(window[mid - 1]) <= max_tokens:
                    lo = mid
                else:
                    hi = mid - 1
            count = lo
            if start + count < n and count >= multiple:
                count -= count % multiple
            spans.append((start, start + count))
            start += count
        return spans

    def make_batches(self, lengths, *, world_size, seed, epoch=0, batch_size=None,
                     max_tokens=None, capacity=None, buckets="auto", memory=True) -> Schedule:
        budget = _need(max_tokens, "max_tokens", self.name)
        lengths = np.asarray(lengths)
        with measure(memory) as m:
            perm = np.random.default_rng(seed).permutation(lengths.size)
            order = perm[np.argsort(lengths[perm], kind="stable")]
            dropped = order[lengths[order] > budget]
            order = order[lengths[order] <= budget]
            spans = self.batch_by_size(order, lengths, budget, self.MULTIPLE)
            shuffle = np.random.default_rng(seed + epoch + 1).permutation(len(spans))
            sizes = np.array([b - a for a, b in spans], dtype=np.int64)[shuffle]
            starts = np.array([a for a, _ in spans], dtype=np.int64)[shuffle]
            offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
            gather = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1])
            idx = order[gather]
        run = Schedule(idx, offsets, world_size, m.seconds, m.peak_bytes, m.method)
        if dropped.size:
            run.notes.append(f"{dropped.size} samples longer than max_tokens left out")
        return run


class LengthwisePlan(Adapter):
    """lengthwise ``plan_epoch`` with one of its orders (or the packed layout)."""

    package = "lengthwise"

    def __init__(self, order: str, layout: str = "pad", buckets: int | str | None = None) -> None:
        self.order = order
        self.layout = layout
        #: fixed bucket choice of this variant (otherwise the run's)
        self.buckets = buckets
        suffix = "" if layout == "pad" else f", layout={layout}"
        suffix += "" if buckets is None else f", buckets={buckets}"
        self.name = f"lengthwise {order}{suffix}"
        self.key = (f"lengthwise_{order}" + ("" if layout == "pad" else f"_{layout}")
                    + ("" if buckets is None else f"_{buckets}"))
        self.rules = ("pack",) if layout == "pack" else ("rows", "tokens")
        shown = "buckets=" if buckets is None else f"buckets={buckets!r}"
        rule = ("max_tokens=capacity" if layout == "pack"
                else f"batch_size= | max_tokens=, {shown}")
        self.call = (f"lengthwise.plan_epoch(lengths, PlanConfig({rule}, order='{order}', "
                     f"layout='{layout}', world_size=W), seed=seed, epoch=epoch)")

    def unavailable_reason(self) -> str | None:
        if self.version is None:
            return "lengthwise is not installed"
        if self.layout == "pack" and importlib.util.find_spec("lengthwise.planning.packed") is None:
            return "this lengthwise has no packed layout (lengthwise.planning.packed)"
        return None

    def make_batches(self, lengths, *, world_size, seed, epoch=0, batch_size=None,
                     max_tokens=None, capacity=None, buckets="auto", memory=True) -> Schedule:
        import lengthwise

        kwargs: dict = {}
        if self.layout == "pack":
            kwargs.update(max_tokens=_need(capacity, "capacity", self.name), layout="pack")
        elif batch_size is not None:
            kwargs.update(batch_size=batch_size)
        else:
            kwargs.update(max_tokens=_need(max_tokens, "max_tokens or batch_size", self.name))
        with measure(memory) as m:
            config = lengthwise.PlanConfig(
                order=self.order, buckets=buckets if self.buckets is None else self.buckets,
                world_size=world_size, **kwargs)
            plan = lengthwise.plan_epoch(np.asarray(lengths), config, seed=seed, epoch=epoch)
        run = Schedule(np.asarray(plan.indices, dtype=np.int64),
                       np.asarray(plan.offsets, dtype=np.int64), world_size, m.seconds,
                       m.peak_bytes, m.method, capacity=capacity if self.layout == "pack" else None)
        run.split_batches = int(plan.counts.get("split_batches", 0))
        run.notes.extend(f"{k}={v}" for k, v in plan.counts.items()
                         if k in ("dropped_to_even_out", "repeated") and v)
        self.last_plan = plan
        return run


LENGTHWISE_ORDERS = ("sorted", "random", "bucket-random", "interleave", "stratified")


def all_adapters() -> list[Adapter]:
    """Every method the benchmarks know, installed or not."""
    return [
        *(LengthwisePlan(o) for o in LENGTHWISE_ORDERS),
        LengthwisePlan("stratified", buckets="auto"),
        LengthwisePlan("stratified", layout="pack"),
        LengthwisePlan("random", layout="pack"),
        HFLengthGrouped(),
        HFBatchRebalance(),
        LhotseDynamicBucketing(),
        FairseqStyle(),
        TRLPack(),
        AxolotlMultipack(),
    ]


def by_key(key: str) -> Adapter:
    """The adapter with this ``key``."""
    for adapter in all_adapters():
        if adapter.key == key:
            return adapter
    raise KeyError(f"no adapter {key!r}")


def installed(adapters: Sequence[Adapter] | None = None,
              report: Callable[[str], None] | None = None) -> list[Adapter]:
    """The adapters whose packages import here; ``report`` hears why others are left out."""
    out = []
    for adapter in adapters if adapters is not None else all_adapters():
        reason = adapter.unavailable_reason()
        if reason is None:
            out.append(adapter)
        elif report is not None:
            report(f"{adapter.name}: {reason}")
    return out
