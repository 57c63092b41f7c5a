"""Windowed epoch plans: a global shuffle cut into windows, each planned when reached.

The epoch's samples are put in the order of a ``(seed, epoch)`` shuffle
(:func:`lengthwise.planning.shuffle.permuted`, no permutation array is held) and cut into
windows of at most ``window`` samples (sizes differ by one at most). Each window
is planned like a whole epoch (the same bucket edges, the same batch rule, its
micro-batch count evened out over the ranks) only when training reaches it, so
memory and time to the first micro-batch depend on the window, not on the data
set. Every sample is planned exactly once per epoch and every rank gets the same
number of micro-batches in every window.

Example::

    >>> import numpy as np
    >>> from lengthwise.planning.config import PlanConfig
    >>> lens = np.random.default_rng(0).integers(1, 2000, 50_000)
    >>> wp = WindowedPlan(lens, PlanConfig(max_tokens=8192, world_size=4), window=20_000)
    >>> wp.num_windows
    3
    >>> ids = np.concatenate([b for r in range(4) for b in wp.rank_batches(r)])
    >>> np.array_equal(np.sort(ids), np.arange(50_000))
    True
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning.batching import index_dtype, whole_number
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.errors import LengthError
from lengthwise.planning.lengths import validate_lengths
from lengthwise.planning.packed import plan_packed_epoch
from lengthwise.planning.padded import (
    PaddedEpochPlan,
    check_given_edges,
    padded_batch_count,
    plan_padded_epoch,
    resolved_edges,
)
from lengthwise.planning.prepare import overflow_error, prepare_lengths
from lengthwise.planning.schedule import EpochPlan
from lengthwise.planning.shuffle import permuted
from lengthwise.planning.vocabulary import SEQUENCE_ORDERS

__all__ = ["AUTO_WINDOW", "AUTO_WINDOW_ABOVE", "Window", "WindowedPlan", "resolve_window"]

#: samples read at a time when a windowed plan scans all lengths for its longest one
SCAN_CHUNK = 1 << 22

#: ``window="auto"`` plans windows of this many samples ...
AUTO_WINDOW = 1 << 21
#: ... for data sets of more than this many samples (smaller ones: the whole epoch at once)
AUTO_WINDOW_ABOVE = 1 << 24


def resolve_window(window: int | str | None, num_samples: int) -> int | None:
    """The window size in samples, or ``None`` for whole-epoch planning.

    ``"auto"`` windows data sets above :data:`AUTO_WINDOW_ABOVE` samples with
    :data:`AUTO_WINDOW`-sample windows; a window that holds the whole data set
    means whole-epoch planning.

    Example::

        >>> resolve_window("auto", 1_000_000) is None, resolve_window("auto", 10**9)
        (True, 2097152)
        >>> resolve_window(500, 400) is None
        True
    """
    if window is None:
        return None
    if isinstance(window, str) and window == "auto":
        return AUTO_WINDOW if num_samples > AUTO_WINDOW_ABOVE else None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)):
        raise ConfigError(f"window must be a number of samples, 'auto' or None, got {window!r}")
    if window < 1:
        raise ConfigError(f"window must be >= 1 sample, got {window}")
    return None if window >= num_samples else int(window)


def window_seed(seed: int, epoch: int, w: int) -> int:
    """The seed that plans window ``w`` of ``(seed, epoch)`` (independent streams per window)."""
    return int(np.random.SeedSequence([int(seed), int(epoch), int(w), 0x3D]).generate_state(1)[0])


@dataclass
class Window:
    """One planned window: ``plan`` in window-local ids, ``ids`` maps them to sample ids."""

    index: int
    ids: np.ndarray
    plan: EpochPlan

    @property
    def num_batches(self) -> int:
        """Micro-batches per rank in this window."""
        return self.plan.num_batches

    def batch(self, k: int) -> np.ndarray:
        """Sample ids of micro-batch ``k`` of this window's schedule."""
        return self.ids[self.plan.batch(k)]

    def batch_rows(self, k: int) -> list[np.ndarray]:
        """Sample ids of micro-batch ``k``, one array per packed row (one row when padded)."""
        return [self.ids[r] for r in self.plan.batch_rows(k)]


def _over(values: np.ndarray, config: PlanConfig) -> np.ndarray:
    """Rows of ``values`` that ``on_overflow="error"`` refuses (none under other policies)."""
    limit = config.sample_limit()
    if config.on_overflow != "error" or limit is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(values > limit)


def _top(values: np.ndarray, config: PlanConfig) -> int:
    """The longest length a plan of ``config`` holds among ``values`` (0: none).

    Longer samples are cut to ``config.sample_limit()``, or dropped under
    ``on_overflow="drop"``.
    """
    limit = config.sample_limit()
    if limit is not None and config.on_overflow == "drop":
        values = values[values <= limit]
    top = int(values.max()) if values.size else 0
    return top if limit is None else min(top, limit)


class WindowedPlan:
    """An epoch planned window by window (see the module docstring).

    ``lengths`` may be a memory-mapped array (``np.load(path, mmap_mode="r")``):
    only the current window's lengths are read. Bucket edges are solved on the
    first window of epoch 0 (:attr:`solved_edges`) and serve every window and epoch.
    A window holding samples longer than the last solved edge plans them in one
    more bucket, up to its longest sample, so the shorter buckets keep their rows;
    :attr:`edges` are the plan-wide edges, whose last bucket reaches the longest
    sample of the whole data set: bucket ``k`` of every window is bucket ``k`` of
    :attr:`edges`, which the collator, the bucket shares and the logger read.
    ``rank_batches`` and ``windows`` plan lazily; ``num_batches`` counts the micro-batches
    of every window from its bucket sizes, without planning it (padded layout).
    """

    def __init__(self, lengths: np.ndarray, config: PlanConfig, *, window: int, seed: int = 0,
                 epoch: int = 0, edges: Sequence[int] | None = None) -> None:
        if np.ndim(lengths) != 1:
            raise LengthError(f"lengths must be one-dimensional, got shape {np.shape(lengths)}")
        self.lengths = lengths
        name = getattr(lengths, "filename", None)  # a memory-mapped file: errors name it
        self._what = f"lengths from {name}" if name else "lengths"
        self.num_samples = int(lengths.shape[0])
        if self.num_samples == 0:
            raise LengthError("lengths are empty: there is nothing to plan")
        size = resolve_window(int(window), self.num_samples)
        if size is not None and size < 2 * config.world_size:
            raise ConfigError(f"window={size} is too small for {config.world_size} ranks: a window "
                              f"needs at least 2 x world_size = {2 * config.world_size} samples")
        self.window = size or self.num_samples
        self.config = config
        self.seed, self.epoch = int(seed), int(epoch)
        self._edges = list(edges) if edges is not None else None
        self._edges_note: str | None = None  # what "auto" says of the solved edges
        self._wide: list[int] | None = None
        self._longest: int | None = None
        self._cache: Window | None = None
        self._counts: dict[int, int] = {}

    # ------------------------------------------------------------------ shape

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def grad_accum(self) -> int:
        return self.config.grad_accum

    @property
    def num_windows(self) -> int:
        """Windows of the epoch: ``ceil(num_samples / window)``, sizes differing by one at most."""
        return -(-self.num_samples // self.window)

    def window_bounds(self, w: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of window ``w`` in the epoch's shuffle."""
        k = self.num_windows
        return w * self.num_samples // k, (w + 1) * self.num_samples // k

    def window_ids(self, w: int, epoch: int | None = None) -> np.ndarray:
        """Sample ids of window ``w`` (sorted, so that reading their lengths goes forward)."""
        if not 0 <= w < self.num_windows:
            raise ConfigError(f"window {w} out of range: the epoch has {self.num_windows}")
        start, stop = self.window_bounds(w)
        ids = permuted(np.arange(start, stop), self.num_samples, self.seed,
                       self.epoch if epoch is None else epoch)
        ids.sort()
        return ids.astype(index_dtype(self.num_samples))

    # ------------------------------------------------------------------ planning

    @property
    def solved_edges(self) -> list[int]:
        """Bucket edges solved on the first window of epoch 0 (or given), kept for every epoch.

        Pass them as ``edges=`` to the plan of another epoch of the same lengths.
        """
        if self._edges is None:
            if isinstance(self.config.buckets, tuple):
                self._edges = list(self.config.buckets)
            else:
                _, values = self._window_values(0, epoch=0)
                lens, kept, _ = prepare_lengths(values, self.config)
                edges, self._edges_note = resolved_edges(lens, kept, self.config)
                self._edges = list(edges)
        return self._edges

    @property
    def edges(self) -> list[int]:
        """The plan-wide bucket edges, the one set every consumer of the plan reads.

        :attr:`solved_edges`, and one more edge at the longest sample of the data set
        when it is longer than their last. Reading them the first time reads all the
        lengths once (in chunks of :data:`SCAN_CHUNK`) and checks them as a whole-epoch
        plan does: a bad length, one over the budget under ``on_overflow="error"``, or
        given edges below the longest sample raise here, not in the window that holds it.

        Example::

            >>> from lengthwise.planning.config import PlanConfig
            >>> lens = np.r_[np.full(99, 10), 500]
            >>> wp = WindowedPlan(lens, PlanConfig(max_tokens=1000), window=50, seed=1)
            >>> wp.edges[-1]
            500
        """
        if self._wide is None:
            self._wide = self._with_top(self.longest())
        return list(self._wide)

    def longest(self) -> int:
        """The longest length the plan holds, reading every length once (in chunks).

        Checks the lengths as a whole-epoch plan does: a bad length, or one over the
        budget under ``on_overflow="error"``, raises naming its row.

        Example::

            >>> from lengthwise.planning.config import PlanConfig
            >>> WindowedPlan(np.arange(1, 101), PlanConfig(max_tokens=64), window=10).longest()
            64
        """
        if self._longest is None:
            top, first, longer = 0, None, 0
            for start in range(0, self.num_samples, SCAN_CHUNK):
                ids = np.arange(start, min(start + SCAN_CHUNK, self.num_samples))
                values = validate_lengths(np.asarray(self.lengths[start : ids[-1] + 1]),
                                          what=self._what, rows=ids)
                over = _over(values, self.config)
                if over.size:
                    first = first or (int(ids[over[0]]), int(values[over[0]]))
                    longer += over.size
                top = max(top, _top(values, self.config))
            if first is not None:
                raise overflow_error(self.config, *first, longer)
            self._longest = top
        return self._longest

    def _with_top(self, top: int) -> list[int]:
        """The solved edges for samples up to ``top``: one more edge when it is longer."""
        edges = list(self.solved_edges)
        if isinstance(self.config.buckets, tuple):
            return check_given_edges(edges, top)
        return edges + [top] if top > edges[-1] else edges

    def _window_config(self, values: np.ndarray, config: PlanConfig) -> PlanConfig:
        if config.layout != "pad":
            return config
        edges = self._with_top(_top(values, config))
        return dataclasses.replace(config, buckets=tuple(edges))

    def plan_window(self, w: int, *, world_size: int | None = None, grad_accum: int | None = None,
                    exclude: np.ndarray | None = None) -> Window:
        """Plan window ``w`` (for other ranks, or without the sample ids in ``exclude``).

        Example::

            >>> from lengthwise.planning.config import PlanConfig
            >>> wp = WindowedPlan(np.arange(1, 101), PlanConfig(batch_size=4), window=50)
            >>> win = wp.plan_window(1)
            >>> win.ids.size, win.num_batches
            (50, 13)
        """
        default = world_size is None and grad_accum is None and exclude is None
        if default and self._cache is not None and self._cache.index == w:
            return self._cache
        config = dataclasses.replace(
            self.config,
            world_size=self.world_size if world_size is None else whole_number(
                "world_size", world_size),
            grad_accum=self.grad_accum if grad_accum is None else whole_number(
                "grad_accum", grad_accum))
        ids, values = self._window_values(w)
        local = None
        if exclude is not None and exclude.size:
            local = np.flatnonzero(~np.isin(ids, exclude, assume_unique=True))
        planner = plan_packed_epoch if config.layout == "pack" else plan_padded_epoch
        plan = planner(values, self._window_config(values, config),
                       seed=window_seed(self.seed, self.epoch, w), epoch=self.epoch,
                       indices=local)
        out = Window(index=w, ids=ids, plan=plan)
        if default:
            self._cache = out
            self._counts[w] = plan.num_batches
        return out

    def _window_values(self, w: int, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Sample ids and checked lengths of window ``w``; errors name the sample id, as
        whole-epoch errors do. Under ``on_overflow="error"``, refuses a sample over the budget
        before planning."""
        ids = self.window_ids(w, epoch)
        values = validate_lengths(np.asarray(self.lengths[ids]), what=self._what, rows=ids)
        if self.config.on_overflow == "error":
            self.longest()  # reads every length once: the error counts them all
        return ids, values

    def windows(self, start: int = 0) -> Iterator[Window]:
        """The planned windows from ``start`` on, one at a time."""
        for w in range(start, self.num_windows):
            yield self.plan_window(w)

    def window_batches(self, w: int) -> int:
        """Micro-batches per rank in window ``w``: counted from its bucket sizes in the padded
        layout (orders that cut batches inside buckets), planned otherwise."""
        if w not in self._counts:
            self._counts[w] = self._count_window(w)
        return self._counts[w]

    def _count_window(self, w: int) -> int:
        if self.config.layout == "pad" and self.config.order not in SEQUENCE_ORDERS:
            _, values = self._window_values(w)
            with warnings.catch_warnings():  # the window warns about cut tokens when planned
                warnings.simplefilter("ignore", UserWarning)
                count = padded_batch_count(values, self._window_config(values, self.config))
            if count is not None:
                return count
        return self.plan_window(w).num_batches

    @property
    def num_batches(self) -> int:
        """Micro-batches per rank over the epoch (counts every window not counted yet; only
        the packed layout and the ``sorted`` and ``random`` orders plan them to count)."""
        return sum(self.window_batches(w) for w in range(self.num_windows))

    def rank_batches(self, rank: int, start: int = 0) -> Iterator[np.ndarray]:
        """Micro-batches of ``rank`` in order over the epoch, from its local position ``start``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} out of range for world_size {self.world_size}")
        w, pos = self.locate(start)
        world = self.world_size
        while w < self.num_windows:
            win = self.plan_window(w)
            for p in range(pos, win.num_batches):
                yield win.batch(rank + p * world)
            w, pos = w + 1, 0

    def locate(self, position: int) -> tuple[int, int]:
        """(window, position inside it) of a rank's local position in the epoch."""
        if position < 0:
            raise ConfigError(f"position must be >= 0, got {position}")
        w = 0
        while w < self.num_windows and position >= self.window_batches(w):
            position -= self.window_batches(w)
            w += 1
        if w == self.num_windows and position > 0:
            raise ConfigError("position is past the end of the epoch")
        return w, position

    # ------------------------------------------------------------------ whole-epoch view

    def materialize(self, windows: Sequence[int] | None = None) -> PaddedEpochPlan:
        """The windows (all by default) as one padded plan over the sample ids.

        Its schedule is the windows' schedules one after the other; ``stats`` then
        measures the windowed epoch with the whole-epoch figures. Holds every
        planned window in memory: for measuring, not for training at scale.
        """
        if self.config.layout != "pad":
            raise ConfigError("materialize() measures padded plans; layout is "
                              f"{self.config.layout!r}")
        chosen = range(self.num_windows) if windows is None else windows
        lengths = np.zeros(self.num_samples, dtype=np.int64)
        idx, off, tag, seconds = [], [np.zeros(1, dtype=np.int64)], [], 0.0
        counts: dict[str, int] = {}
        for w in chosen:
            win = self.plan_window(w)
            plan = win.plan
            lengths[win.ids] = plan.lengths
            idx.append(win.ids[plan.indices])
            off.append(plan.offsets[1:] + off[-1][-1])
            tag.append(plan.bucket)
            seconds += plan.plan_seconds
            for key, value in plan.counts.items():
                counts[key] = counts.get(key, 0) + value
        return PaddedEpochPlan(indices=np.concatenate(idx), offsets=np.concatenate(off),
                               bucket=np.concatenate(tag), edges=self.edges,
                               edges_note=self._edges_note, lengths=lengths,
                               config=self.config, seed=self.seed, epoch=self.epoch,
                               plan_seconds=seconds, counts=counts)
