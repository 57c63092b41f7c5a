"""A PyTorch batch sampler that feeds planned micro-batches, with exact mid-epoch resume.

:class:`BucketBatchSampler` yields this rank's micro-batches of
:func:`lengthwise.plan_epoch` as lists of dataset indices, for
``DataLoader(dataset, batch_sampler=sampler)``. Every rank builds the same plan
from the same lengths, seed and epoch, so ranks agree without talking.

Its state is plain data (seed, epoch, micro-batches yielded, world size, a
fingerprint, and the plan's options as text), so a restart rebuilds the epoch's
plan and continues at the next micro-batch without replaying data. With a different world size (or
gradient accumulation), the samples that the interrupted epoch had not trained
yet are planned again over the new ranks: every sample still exactly once.

Example::

    >>> import numpy as np
    >>> lengths = np.random.default_rng(0).integers(1, 512, 1000)
    >>> sampler = BucketBatchSampler(lengths, max_tokens=2048, num_replicas=2, rank=0)
    >>> batches = list(sampler)
    >>> len(batches) == len(sampler)
    True
    >>> all(int(lengths[b].max()) * len(b) <= 2048 for b in batches)
    True
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from lengthwise.errors import ConfigError
from lengthwise.planning.batching import whole_number
from lengthwise.planning.config import PlanConfig, lengths_checksum, plan_config
from lengthwise.planning.lengths import load_lengths, open_lengths
from lengthwise.planning.padded import PaddedEpochPlan
from lengthwise.planning.plan import plan_epoch
from lengthwise.planning.prepare import overflow_error
from lengthwise.planning.schedule import EpochPlan
from lengthwise.planning.state_checks import StateError
from lengthwise.planning.window_cursor import WindowCursor
from lengthwise.planning.windowed import WindowedPlan, resolve_window
from lengthwise.pytorch.collate.plan import collator_for
from lengthwise.pytorch.consumer import Consumer, find_consumer
from lengthwise.pytorch.dist import check_replicas, group_info
from lengthwise.pytorch.sampler_state import (
    STATE_VERSION,
    ResumeError,
    SavedState,
    count,
    read_state,
)

__all__ = ["STATE_VERSION", "BucketBatchSampler", "ResumeError", "loader_sampler_state"]


def _options(config: PlanConfig, window: int | None = None) -> dict[str, str]:
    """The plan options that must not change across a resume, as printable text."""
    out = {k: repr(v) for k, v in dataclasses.asdict(config).items()
           if k not in ("world_size", "grad_accum")}
    out["cost"] = repr(config.cost)  # asdict turns the CostModel into a dict
    if window is not None:
        out["window"] = repr(window)
    return out


def _full_checksum(lengths: np.ndarray, chunk: int = 1 << 22) -> int:
    """:func:`lengths_checksum` of every length, read in chunks (memory-mapped lengths too)."""
    crc = 0
    for a in range(0, int(lengths.shape[0]), chunk):
        part = np.ascontiguousarray(lengths[a : a + chunk], dtype=np.int64)
        crc = zlib.crc32(memoryview(part), crc)
    return crc


class BucketBatchSampler(Sampler[list[int]]):
    """Yield this rank's planned micro-batches (lists of dataset indices) for one epoch.

    ``lengths`` are token lengths aligned with the dataset's rows, or any source
    :func:`lengthwise.load_lengths` reads (``"data.parquet:length"``, a ``.npy``
    path...). ``config`` (:class:`~lengthwise.planning.config.PlanConfig`), or its fields
    given as keywords instead, holds the plan's options, as for :func:`lengthwise.plan_epoch`;
    ``seed`` and the epoch of
    :meth:`set_epoch` pick its random streams. ``num_replicas`` and ``rank`` default
    to the initialised ``torch.distributed`` group, else ``config.world_size`` and 0.

    Every rank gets the same number of micro-batches: by default the largest ones
    are split, so every sample is trained exactly once per epoch;
    ``PlanConfig(even_out="drop")`` leaves whole micro-batches out instead (as a
    ``drop_last`` would), counted in ``plan.stats``.

    ``window`` plans the epoch window by window (see
    :class:`~lengthwise.planning.windowed.WindowedPlan`): ``"auto"`` (default)
    does so above 16,777,216 samples with 2,097,152-sample windows, memory-mapping
    ``.npy`` lengths; ``None`` always plans the whole epoch. A windowed sampler
    resumes (also on other ranks) by planning only the window it stopped in; its
    ``len()`` counts every window's micro-batches from its bucket sizes (padded
    layout; the packed one plans each window to count), and its checksum of the lengths
    (for the state) reads every length once, in chunks.

    Under a launcher of several processes (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` or an
    initialised group), ``num_replicas`` must be their number: a sampler built before
    ``init_process_group`` raises ``ConfigError`` (a ``ValueError``) naming both numbers
    instead of planning the whole epoch on every process. ``check_world_size=False``
    allows fewer replicas where processes share batches (tensor or context parallel).

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``.
    ``len(sampler)`` is the number of micro-batches this rank has in the current
    epoch's plan, including those already yielded before a resume;
    :meth:`remaining` counts what is left.

    Example::

        >>> s = BucketBatchSampler([5, 3, 8, 2, 7, 1], batch_size=2, order="sorted")
        >>> list(s)
        [[5, 3], [1, 0], [4, 2]]
        >>> list(BucketBatchSampler([5, 3, 8, 2, 7, 1], PlanConfig(batch_size=2, order="sorted")))
        [[5, 3], [1, 0], [4, 2]]
    """

    #: micro-batches vary in size: ``None`` tells wrappers (such as accelerate's
    #: ``BatchSamplerShard``) not to expect a fixed one
    batch_size = None

    def __new__(cls, lengths: Any = None, *args: Any, **kwargs: Any) -> BucketBatchSampler:
        # Lightning rebuilds a batch sampler as cls(its DistributedSampler, batch_size=...,
        # drop_last=...): named before those arguments are refused
        if isinstance(lengths, Sampler):
            raise ConfigError(
                f"{cls.__name__} got a {type(lengths).__name__} as its lengths: PyTorch "
                "Lightning's Trainer rebuilds batch samplers around its own sampler; use "
                "lengthwise.lightning.LightningBatchSampler, or Trainer(use_distributed_sampler="
                "False) with lengthwise.lightning.LengthwiseCallback")
        return super().__new__(cls)

    def __init__(self, lengths: Any, config: PlanConfig | None = None, *, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None,
                 yield_rows: bool = False, window: int | str | None = "auto",
                 check_world_size: bool = True, **plan_options: Any) -> None:
        super().__init__()
        config = plan_config(config, plan_options, BucketBatchSampler.__init__,
                             type(self).__name__)
        #: yield each micro-batch as a list of packed rows (lists of indices); wrap the data
        #: set in ``lengthwise.pytorch.collate.RowsDataset`` so the collator receives the rows
        self.yield_rows = bool(yield_rows)
        #: samples per window of a windowed epoch; ``None``: the whole epoch is planned at once
        self.lengths, self.window = _read_lengths(lengths, window)
        self.num_replicas, self.rank = _resolve_ranks(num_replicas, rank, config.world_size)
        #: compare num_replicas with the processes the launcher started
        self.check_world_size = bool(check_world_size)
        if self.check_world_size:
            check_replicas(self.num_replicas, rank=self.rank)
        if config.world_size not in (1, self.num_replicas):
            raise ConfigError(f"config.world_size={config.world_size} disagrees with "
                              f"num_replicas={self.num_replicas}; give one of them")
        self.config = dataclasses.replace(config, world_size=self.num_replicas)
        if self.config.on_overflow == "split":
            raise ConfigError("on_overflow='split' cuts long samples into pieces, which lists of "
                              "sample indices cannot express; use on_overflow='truncate' or "
                              "'drop' with the sampler (plan_epoch plans the pieces)")
        self.seed = whole_number("seed", seed, minimum=0)
        self.epoch = 0
        # resume state of the current epoch
        self._resumed: list[tuple[int, int, int]] = []  # (world_size, grad_accum, yielded)
        self._pending: int | None = None  # local position the next pass starts at
        self._yielded = 0
        self._plan: EpochPlan | None = None
        self._plan_key: tuple | None = None
        self._edges: list[int] | None = None
        self._wide_edges: list[int] | None = None  # a windowed plan's plan-wide edges
        self._resumed_from_state = False  # the last resumed segment is the loaded state's
        self._cursor: WindowCursor | None = None
        self._cursor_pending = False
        # the PyTorch loader iterating the current pass, and the epoch position it started at
        self._consumer: Consumer | None = None
        self._consumer_start = 0
        self._crc: int | None = None  # a windowed sampler's checksum of its lengths
        self._check_budget()

    # ------------------------------------------------------------------ setup

    @property
    def grad_accum(self) -> int:
        return self.config.grad_accum

    @property
    def drop_last(self) -> bool:
        """Whether ranks even out by leaving micro-batches out (for loader wrappers)."""
        return self.config.even_out == "drop"

    def _check_budget(self) -> None:
        """Fail early for a sample over the limit with on_overflow='error'."""
        cfg = self.config
        limit = cfg.sample_limit()
        if cfg.on_overflow != "error" or limit is None:
            return
        if self.window is not None:  # reads the lengths once, in chunks
            self._windowed().plan.longest()
            return
        over = np.flatnonzero(self.lengths > limit)
        if over.size:
            row = int(over[0])
            raise overflow_error(cfg, row, int(self.lengths[row]), over.size)

    def collator(self, pad_token_id: int | None = None, **options: Any):
        """The collator of this sampler's plan, for ``DataLoader(collate_fn=...)``.

        A :class:`~lengthwise.pytorch.collate.PadCollator` (padded layout; needs
        ``pad_token_id``) or :class:`~lengthwise.pytorch.collate.PackCollator`
        (packed) that truncates samples to exactly the length the plan counted
        (``max_len``, and the longest row the budget holds), pads to the plan's
        ``pad_multiple``, tags buckets with the plan's edges, and checks every
        micro-batch against the budget (a
        :class:`~lengthwise.pytorch.collate.BudgetError` if the data set's samples are
        longer than the lengths said). ``options`` go to the collator (``metadata``,
        ``label_pad_id``, ``fields``, ``padding_side``, ``mask_dtype``...).

        Example::

            >>> s = BucketBatchSampler([5, 30, 12], max_tokens=16, order="sorted")
            >>> c = s.collator(pad_token_id=0)
            >>> [c([{"input_ids": [1] * [5, 30, 12][i]} for i in b])["input_ids"].shape
            ...  for b in s]
            [torch.Size([1, 5]), torch.Size([1, 12]), torch.Size([1, 16])]
        """

        edges = None
        if self.config.layout == "pad" and self.window is not None:
            edges = self.edges  # the plan-wide edges: those of every window's buckets
        elif self.config.layout == "pad":
            if self._edges is None:
                _ = self.plan  # solves the bucket edges (once, for every epoch)
            edges = self._edges
        if "edges" in options:  # the plan's own: repeating them is allowed, nothing else
            given = options.pop("edges")
            try:
                same = given is None if edges is None else [int(e) for e in given] == edges
            except (TypeError, ValueError):
                same = False
            if not same:
                raise ConfigError(
                    f"edges={given!r} disagrees with the plan (edges={edges!r}, the sampler's "
                    "plan's bucket edges); leave it out, or build the sampler with "
                    "PlanConfig(buckets=[...]) to set them")
        return collator_for(self.config, edges, pad_token_id=pad_token_id,
                            yield_rows=self.yield_rows, **options)

    def check_dataset(self, dataset: Any) -> None:
        """Raise if ``dataset`` does not have one row per length.

        Example::

            >>> sampler = BucketBatchSampler([3, 4], batch_size=1)
            >>> sampler.check_dataset([0, 1, 2])  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            lengthwise.errors.ConfigError: the sampler has lengths for 2 samples but the dataset ...
        """
        try:
            size = len(dataset)
        except TypeError:
            raise TypeError("the dataset has no len(): a batch sampler needs a map-style "
                            "dataset with one row per length") from None
        if size != self.lengths.size:
            raise ConfigError(
                f"the sampler has lengths for {self.lengths.size} samples but the dataset has "
                f"{size} rows; compute the lengths from this dataset "
                "(lengthwise.compute_lengths) so that row i has length lengths[i]")

    def fingerprint(self) -> int:
        """Checksum of the lengths and the plan options (not world size or grad_accum)."""
        cfg = dataclasses.replace(self.config, grad_accum=1)
        if self.window is None:
            return cfg.fingerprint(self.lengths)
        return self._lengths_crc() ^ cfg.fingerprint()

    def _lengths_crc(self) -> int:
        """CRC of every length (a windowed sampler's: read once, in chunks, then kept)."""
        if self.window is None:
            return lengths_checksum(self.lengths)
        if self._crc is None:
            self._crc = _full_checksum(self.lengths)
        return self._crc

    def _windowed(self) -> WindowCursor:
        """The cursor over the current epoch's windows (a windowed sampler only)."""
        cur = self._cursor
        if cur is None or cur.plan.epoch != self.epoch:
            self._keep_solved_edges()
            plan = WindowedPlan(self.lengths, self.config, window=self.window, seed=self.seed,
                                epoch=self.epoch, edges=self._edges)
            cur = self._cursor = WindowCursor(plan)
            self._cursor_pending = False
        return cur

    def _keep_solved_edges(self) -> None:
        """Keep the windowed plan's solved edges for the next epoch's plan (solved once)."""
        if self._cursor is not None and self._edges is None and self.config.layout == "pad":
            self._edges = self._cursor.plan.solved_edges

    # ------------------------------------------------------------------ plans

    def _config(self, world_size: int, grad_accum: int, edges: list[int] | None = None,
                ) -> PlanConfig:
        cfg = dataclasses.replace(self.config, world_size=world_size, grad_accum=grad_accum)
        if edges is not None and cfg.layout == "pad":  # known edges: no need to solve again
            cfg = dataclasses.replace(cfg, buckets=tuple(edges))
        return cfg

    def _build_plan(self) -> EpochPlan | None:
        """The current epoch's plan for this world size; ``None`` when nothing is left."""
        ids = None
        # the bucket edges depend on the lengths and options only: solved once, kept for
        # every epoch and every re-plan of a resumed epoch
        edges = self._edges
        for i, (world_size, grad_accum, yielded) in enumerate(self._resumed):
            if ids is not None and ids.size == 0:
                break
            plan = plan_epoch(self.lengths, self._config(world_size, grad_accum, edges),
                              seed=self.seed, epoch=self.epoch, indices=ids)
            edges = self._edges = edges or _edges_of(plan)
            if yielded > plan.num_batches:
                last = i == len(self._resumed) - 1 and self._resumed_from_state
                what = ("the state's yielded" if last
                        else f"the state's resumed[{i}] = [{world_size}, {grad_accum}, "
                             f"{yielded}]")
                raise ResumeError(
                    f"{what} says {yielded} micro-batches were yielded on each rank, but epoch "
                    f"{self.epoch} has only {plan.num_batches} per rank with world_size "
                    f"{world_size} and grad_accum {grad_accum}")
            cut = int(plan.offsets[yielded * world_size])
            ids = np.setdiff1d(plan.indices[cut:], plan.indices[:cut])
        if ids is not None and ids.size == 0:
            return None
        plan = plan_epoch(self.lengths, self._config(self.num_replicas, self.grad_accum, edges),
                          seed=self.seed, epoch=self.epoch, indices=ids)
        self._edges = self._edges or _edges_of(plan)
        return plan

    @property
    def plan(self) -> EpochPlan | WindowedPlan | None:
        """The plan of the current epoch (built once, then cached); ``None`` if nothing is left.

        A windowed sampler's plan is the epoch's :class:`WindowedPlan`.
        """
        if self.window is not None:
            return self._windowed().plan
        key = (self.epoch, tuple(self._resumed))
        if self._plan_key != key:
            self._plan = self._build_plan()
            self._plan_key = key
        return self._plan

    @property
    def edges(self) -> list[int] | None:
        """Bucket edges of the current epoch's plan (for the collator's bucket ids).

        ``None`` for the packed layout, whose rows have no buckets. A windowed plan's
        are its plan-wide edges (:attr:`WindowedPlan.edges`): bucket ``k`` of every
        window is bucket ``k`` here, up to the longest sample of the data set.
        """
        if self.window is not None:
            if self.config.layout != "pad":
                return None
            if self._wide_edges is None:  # the same for every epoch: read the lengths once
                self._wide_edges = self._windowed().plan.edges
            return list(self._wide_edges)
        plan = self.plan
        if plan is None:
            raise ConfigError("the current epoch has no micro-batches left")
        return _edges_of(plan)

    # ------------------------------------------------------------------ iteration

    def set_epoch(self, epoch: int) -> None:
        """Use the plan of ``epoch`` from now on.

        Setting the current epoch again changes nothing, so a loaded resume point
        survives the usual ``set_epoch(epoch)`` at the top of the epoch loop.
        """
        epoch = whole_number("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self.epoch = epoch
            self._resumed = []
            self._resumed_from_state = False
            self._pending = None
            self._yielded = 0
            self._keep_solved_edges()
            self._cursor = None
            self._consumer = None

    def __len__(self) -> int:
        if self.window is not None:
            return len(self._windowed())
        plan = self.plan
        return 0 if plan is None else plan.num_batches

    def remaining(self) -> int:
        """Micro-batches the next (or current) pass still yields on this rank."""
        if self.window is not None:
            cur = self._windowed()
            return len(cur) - cur.yielded
        return max(0, len(self) - self._position())

    def __iter__(self) -> Iterator[list[int] | list[list[int]]]:
        # not a generator: the loader that calls iter() is looked up now, so that the state
        # counts the micro-batches it handed to the loop, not those its workers fetched ahead
        consumer = find_consumer(self)
        if self.window is not None:
            cur = self._windowed()
            start = cur.yielded if self._cursor_pending else 0
        else:
            start = self._pending if self._pending is not None else 0
        self._consumer, self._consumer_start = consumer, start
        if self.window is not None:
            return self._iter_windows()
        return self._iter_epoch()

    def _iter_epoch(self) -> Iterator[list[int] | list[list[int]]]:
        plan = self.plan
        start = self._pending if self._pending is not None else 0
        self._pending = None
        self._yielded = start
        if plan is None:
            return
        world, rank = self.num_replicas, self.rank
        indices, offsets = plan.indices, plan.offsets
        for pos in range(start, plan.num_batches):
            k = rank + pos * world
            if self.yield_rows:
                batch = [row.tolist() for row in plan.batch_rows(k)]
            else:
                batch = indices[offsets[k] : offsets[k + 1]].tolist()
            self._yielded = pos + 1  # before the yield: a state taken now includes this batch
            yield batch

    def _iter_windows(self) -> Iterator[list[int] | list[list[int]]]:
        cur = self._windowed()
        if not self._cursor_pending:  # a new pass starts the epoch again
            cur = self._cursor = WindowCursor(cur.plan)
        self._cursor_pending = False
        for batch in cur.batches(self.rank, rows=self.yield_rows):
            yield [row.tolist() for row in batch] if self.yield_rows else batch.tolist()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands, as plain numbers (the same on every rank).

        ``yielded`` counts the micro-batches of this epoch the training loop has
        received on this rank: while a PyTorch ``DataLoader`` iterates the sampler,
        those its workers (or Accelerate's ``DataLoaderShard``) fetched ahead are not
        counted. ``resumed`` lists earlier ``[world_size, grad_accum, yielded]``
        segments of an epoch that was resumed with other settings. Raises
        :class:`ResumeError` where the count cannot be known: the loader fetched ahead
        and was closed before the end of the epoch.
        """
        return self._state(self._fetched_ahead())

    def _position(self) -> int:
        """Micro-batches of this epoch yielded to the loader (or to resume from) on this rank."""
        if self.window is not None:
            return self._windowed().yielded
        return self._pending if self._pending is not None else self._yielded

    def _state(self, ahead: int) -> dict[str, Any]:
        """The state, ``ahead`` micro-batches before the place the sampler has yielded to."""
        state = {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "yielded": self._position() - ahead,
            "world_size": self.num_replicas,
            "grad_accum": self.grad_accum,
            "fingerprint": self.fingerprint(),
            "num_samples": int(self.lengths.size),
            "lengths_crc": self._lengths_crc(),
            "resumed": [list(seg) for seg in self._resumed],
            "options": _options(self.config, self.window),
        }
        if self.window is not None:  # the place in the windows; "yielded" counts the epoch
            place = self._windowed().state()
            if place["window_yielded"] < ahead:
                raise ResumeError(
                    f"cannot save the sampler state of epoch {self.epoch} now: the loader "
                    f"fetched {ahead} micro-batches ahead of the training loop, across the start "
                    f"of window {place['window_index']} (window_yielded="
                    f"{place['window_yielded']}); save at another step")
            place["window_yielded"] -= ahead
            place["yielded"] -= ahead
            state.update(place)
        return state

    def _fetched_ahead(self) -> int:
        """Micro-batches yielded to the loader of the current pass but not yet to the loop."""
        consumer = self._consumer
        if consumer is None or not consumer.looks_ahead:
            return 0
        yielded = self._position()
        handed = consumer.handed_out()
        if handed is None:  # the loader is gone: only a finished epoch is known
            if self.window is not None:
                done = yielded >= len(self._windowed())
            else:
                done = self._pending is None and yielded >= len(self)
            if done:
                return 0
            raise ResumeError(
                f"cannot tell how many micro-batches of epoch {self.epoch} were trained: "
                f"{consumer.describe()} fetched ahead and the loader was closed after "
                f"{yielded} of {len(self)} were fetched; take sampler.state_dict() inside the "
                "loop over the loader (or use torchdata's StatefulDataLoader and its state)")
        return max(0, yielded - (self._consumer_start + handed))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state: the next pass starts after its last micro-batch.

        With the saved world size and ``grad_accum`` the pass yields exactly what
        the interrupted one had left. Otherwise the samples not trained yet (the
        micro-batches at local positions >= ``yielded`` on every old rank; all
        ranks yield the same count) are planned again over this sampler's ranks,
        with the same seed and epoch.
        """
        saved = read_state(state)
        self._check_same_plan(saved)
        if self.window is not None:
            self._load_windowed(state, saved)
            return
        resumed = list(saved.resumed)
        same = (saved.world_size, saved.grad_accum) == (self.num_replicas, self.grad_accum)
        if same:
            start = saved.yielded
        else:
            resumed.append((saved.world_size, saved.grad_accum, saved.yielded))
            start = 0
        old = (self.epoch, self._resumed, self._plan_key, self._pending, self._yielded)
        self.epoch = saved.epoch
        self._resumed = resumed
        self._resumed_from_state = not same
        self._plan_key = None
        try:
            n = len(self)  # rebuilds the plan, and validates the chain of earlier segments
            if start > n:
                raise ResumeError(f"the state's yielded says {start} micro-batches were yielded, "
                                  f"but epoch {self.epoch} has only {n} per rank with "
                                  f"world_size {self.num_replicas} and grad_accum "
                                  f"{self.grad_accum}")
        except Exception:  # leave the sampler as it was
            self.epoch, self._resumed, self._plan_key, self._pending, self._yielded = old
            self._resumed_from_state = False
            raise
        self._pending = start
        self._yielded = start
        self._consumer = None

    def _load_windowed(self, state: dict[str, Any], saved: SavedState) -> None:
        old_epoch, old_cursor = self.epoch, self._cursor
        self.epoch = saved.epoch
        self._cursor = None
        try:
            self._windowed().load(state, world_size=saved.world_size,
                                  grad_accum=saved.grad_accum)
        except StateError as exc:
            self.epoch, self._cursor = old_epoch, old_cursor  # leave the sampler as it was
            place = saved.window
            where = "" if place is None else (
                f", window_index={place.window_index}, window_yielded={place.window_yielded}, "
                f"window_resumed={[list(seg) for seg in place.window_resumed]}")
            raise ResumeError(
                f"cannot resume from the windowed sampler state (epoch {saved.epoch}, "
                f"yielded={saved.yielded}{where}; {self.num_replicas} ranks now): {exc}") from None
        self._cursor_pending = True
        self._consumer = None

    def _check_same_plan(self, state: dict[str, Any] | SavedState) -> None:
        if not isinstance(state, SavedState):
            state = read_state(state)
        problems = []
        if state.num_samples != self.lengths.size:
            problems.append(f"the lengths have {self.lengths.size} samples, the saved state "
                            f"{state.num_samples}")
        elif state.lengths_crc != self._lengths_crc():
            problems.append("the lengths differ from the saved ones (same number of samples)")
        if state.seed != self.seed:
            problems.append(f"seed is {self.seed}, the saved state has {state.seed}")
        mine, saved = _options(self.config, self.window), state.options
        for name in sorted(set(mine) | set(saved)):
            if mine.get(name) != saved.get(name):
                problems.append(f"{name} is {mine.get(name)}, the saved state has "
                                f"{saved.get(name)}")
        if not problems and state.fingerprint != self.fingerprint():
            problems.append("the plan fingerprint differs (another lengthwise version?)")
        if problems:
            raise ResumeError(
                "cannot resume: this sampler would build a different plan than the one "
                "that was interrupted: " + "; ".join(problems)
                + ". Build it with the saved settings, or start a fresh epoch with set_epoch().")


def loader_sampler_state(loader_state: dict[str, Any]) -> dict[str, Any]:
    """The sampler state inside a torchdata ``StatefulDataLoader`` state.

    It counts the micro-batches the loader had handed out (not those its workers
    had prefetched), so it can resume the samplers of a different world size.

    Example::

        state = loader_sampler_state(loader.state_dict())
        new_sampler.load_state_dict(state)   # new_sampler: another num_replicas
    """
    if not isinstance(loader_state, dict):
        raise ResumeError(f"a StatefulDataLoader state is a dict, got "
                          f"{type(loader_state).__name__}")
    try:
        if "_index_sampler_state" in loader_state:  # num_workers=0: nothing prefetched
            state = loader_state["_index_sampler_state"]
            extra = 0
        elif "_snapshot" in loader_state:  # workers: the last snapshot, then the steps since
            state = loader_state["_snapshot"]["_main_snapshot"]["_index_sampler_state"]
            extra = count("_steps_since_snapshot", loader_state["_steps_since_snapshot"])
        else:
            raise ResumeError("not a StatefulDataLoader state (no sampler state in it)")
    except (KeyError, TypeError) as exc:
        raise ResumeError(f"not a StatefulDataLoader state (no {exc} in its snapshot)") from None
    if not isinstance(state, dict) or "yielded" not in state:
        raise ResumeError("the loader's batch sampler was not a BucketBatchSampler")
    out = dict(state, yielded=count("yielded", state["yielded"]) + extra)
    if "window_yielded" in state:  # a windowed sampler: the place inside the window moves too
        out["window_yielded"] = count("window_yielded", state["window_yielded"]) + extra
    return out


def _edges_of(plan: EpochPlan) -> list[int] | None:
    return list(plan.edges) if isinstance(plan, PaddedEpochPlan) else None


def _read_lengths(lengths: Any, window: int | str | None) -> tuple[np.ndarray, int | None]:
    """The lengths (memory-mapped for windows, else read and checked) and the window size."""
    if window is None:
        return load_lengths(lengths), None
    raw = open_lengths(lengths)
    size = resolve_window(window, int(raw.shape[0]))
    if size is not None or not (isinstance(raw, np.memmap) or raw is lengths):
        return raw, size
    return load_lengths(lengths), size


def _resolve_ranks(num_replicas: int | None, rank: int | None,
                   world_size: int) -> tuple[int, int]:
    """The ranks given, else the process group's, else ``world_size`` ranks and rank 0."""
    group = group_info()
    if num_replicas is None:
        num_replicas = group.world_size if group is not None else world_size
    if rank is None:
        rank = group.rank if group is not None else 0
    num_replicas = whole_number("num_replicas", num_replicas)
    rank = whole_number("rank", rank, minimum=0)
    if rank >= num_replicas:
        raise ConfigError(f"rank {rank} is out of range for num_replicas={num_replicas}")
    return num_replicas, rank
