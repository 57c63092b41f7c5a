"""One rank's place in a windowed epoch, resumable from a few numbers.

A :class:`WindowCursor` walks the windows of a
:class:`~lengthwise.planning.windowed.WindowedPlan` for one rank and says where it
stands as plain numbers: the window, the position inside it, and the earlier
``(world_size, grad_accum, yielded)`` segments of that window when it was resumed
with other settings. Resuming plans only the current window (O(1) in the number of
windows): with the same settings it continues at the next micro-batch; with other
settings the samples of the window not trained yet are planned again over the new
ranks, and the windows after it are planned with the new settings.

Example::

    >>> import numpy as np
    >>> from lengthwise.planning.config import PlanConfig
    >>> from lengthwise.planning.windowed import WindowedPlan
    >>> lens = np.random.default_rng(0).integers(1, 900, 3000)
    >>> cfg = PlanConfig(max_tokens=4096, world_size=2)
    >>> cur = WindowCursor(WindowedPlan(lens, cfg, window=1000))
    >>> first = [b.tolist() for _, b in zip(range(5), cur.batches(rank=0))]
    >>> again = WindowCursor(WindowedPlan(lens, cfg, window=1000))
    >>> again.load(cur.state(), world_size=2, grad_accum=1)
    >>> rest = [b.tolist() for b in again.batches(rank=0)]
    >>> full = [b.tolist() for b in WindowCursor(WindowedPlan(lens, cfg, window=1000)).batches(0)]
    >>> first + rest == full
    True
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.planning.state_checks import StateError, count, window_place
from lengthwise.planning.windowed import Window, WindowedPlan

__all__ = ["CursorError", "WindowCursor", "resume_window"]


class CursorError(StateError):
    """A saved position that does not fit this windowed epoch."""


def resume_window(plan: WindowedPlan, w: int, segments: list[tuple[int, int, int]],
                  world_size: int, grad_accum: int) -> Window | None:
    """Window ``w`` planned for ``world_size`` ranks without what ``segments`` trained.

    Each segment ``(world, accum, yielded)`` planned what the segments before it
    left, and trained its first ``yielded`` micro-batches on every rank. ``None``
    when nothing of the window is left.
    """
    done = np.zeros(0, dtype=np.int64)
    size = plan.window_bounds(w)[1] - plan.window_bounds(w)[0]
    for world, accum, yielded in segments:
        win = plan.plan_window(w, world_size=world, grad_accum=accum, exclude=done)
        if yielded > win.num_batches:
            raise CursorError(f"the state says {yielded} micro-batches were yielded in window "
                              f"{w}, which has only {win.num_batches} per rank with "
                              f"world_size {world}")
        cut = int(win.plan.offsets[yielded * world])
        done = np.union1d(done, win.ids[win.plan.indices[:cut]])
        if done.size >= size:
            return None
    return plan.plan_window(w, world_size=world_size, grad_accum=grad_accum, exclude=done)


class WindowCursor:
    """Where one rank stands in a windowed epoch (see the module docstring)."""

    def __init__(self, plan: WindowedPlan) -> None:
        self.plan = plan
        self.window = 0  # current window
        self.segments: list[tuple[int, int, int]] = []  # earlier settings of this window
        self.position = 0  # micro-batches yielded in the current window's plan
        self.prior = 0  # micro-batches yielded in the epoch before the current window's plan
        self._current: tuple[tuple, Window | None] | None = None

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def current(self) -> Window | None:
        """The current window's plan (after its earlier segments); ``None``: nothing left."""
        key = (self.window, tuple(self.segments))
        if self._current is None or self._current[0] != key:
            if self.window >= self.plan.num_windows:
                win = None
            else:
                win = resume_window(self.plan, self.window, self.segments, self.world_size,
                                    self.plan.grad_accum)
            self._current = (key, win)
        return self._current[1]

    def _count(self) -> int:
        win = self.current()
        return 0 if win is None else win.num_batches

    def _next_window(self) -> None:
        self.prior += self.position
        self.window += 1
        self.segments, self.position = [], 0

    @property
    def yielded(self) -> int:
        """Micro-batches this rank has yielded in the epoch."""
        return self.prior + self.position

    def __len__(self) -> int:
        """Micro-batches of this rank over the epoch (yielded ones included; plans every
        window after the current one to count them)."""
        later = sum(self.plan.window_batches(w)
                    for w in range(self.window + 1, self.plan.num_windows))
        return self.prior + self._count() + later

    def batches(self, rank: int, *, rows: bool = False) -> Iterator:
        """The rank's micro-batches from the current place on; the place moves as they go.

        With ``rows`` each micro-batch comes as the list of its packed rows.
        """
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} out of range for world_size {self.world_size}")
        while self.window < self.plan.num_windows:
            win = self.current()
            count = 0 if win is None else win.num_batches
            while self.position < count:
                k = rank + self.position * self.world_size
                self.position += 1  # before the yield: a state taken now includes this batch
                yield win.batch_rows(k) if rows else win.batch(k)
            self._next_window()

    def state(self) -> dict:
        """The place as plain numbers."""
        return {"window_index": self.window, "window_yielded": self.position,
                "window_resumed": [list(s) for s in self.segments], "yielded": self.yielded}

    def load(self, state: dict, *, world_size: int, grad_accum: int) -> None:
        """Go to a saved place, saved by ranks of ``world_size`` x ``grad_accum``.

        ``window_yielded`` may run past the end of its window (a loader that counted
        micro-batches handed out since a snapshot): the place then moves on through
        the following windows. The keys are checked as the sampler's whole-epoch
        state is (:func:`~lengthwise.planning.state_checks.window_place`); a bad one
        raises :class:`~lengthwise.planning.state_checks.StateError` naming it.
        """
        place = window_place(state)
        world_size = count("world_size", world_size, 1)
        grad_accum = count("grad_accum", grad_accum, 1)
        w, pos, yielded = place.window_index, place.window_yielded, place.yielded
        segments = list(place.window_resumed)
        if w > self.plan.num_windows:
            raise CursorError(f"invalid sampler state: window_index={w}, but epoch "
                              f"{self.plan.epoch} has {self.plan.num_windows} windows")
        prior = yielded - pos
        while True:  # move on through whole windows the saved settings had finished
            if w >= self.plan.num_windows:
                if pos > 0:
                    raise CursorError(f"the state is {pos} micro-batches past the end of epoch "
                                      f"{self.plan.epoch}")
                break
            win = resume_window(self.plan, w, segments, world_size, grad_accum)
            size = 0 if win is None else win.num_batches
            if pos < size:
                break
            pos, prior, w, segments = pos - size, prior + size, w + 1, []
        if (world_size, grad_accum) != (self.world_size, self.plan.grad_accum) and pos > 0:
            segments = [*segments, (world_size, grad_accum, pos)]
            prior, pos = prior + pos, 0
        self.window, self.segments, self.position, self.prior = w, segments, pos, prior
        self._current = None
        self.current()  # validates the chain of segments now, not at the first batch
