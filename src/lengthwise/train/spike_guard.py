"""Skip optimizer updates whose loss is an outlier against its recent history.

``SpikeGuard.check(loss)`` compares the loss with the median of the last
``window`` losses, measured in robust standard deviations (1.4826 x the median
absolute deviation, MAD). A loss more than ``threshold`` of them *above* the
median is a spike: ``check`` returns ``True`` and the caller skips
``optimizer.step()``. Non-finite losses are always skipped. Every loss, spike or
not, enters the window, so a lasting change of level is accepted after a few
steps instead of being skipped forever.

Example::

    >>> from lengthwise.train import SpikeGuard
    >>> guard = SpikeGuard(window=50, threshold=6.0, warmup=5)
    >>> losses = [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 9.0, 2.0]
    >>> [guard.check(x) for x in losses]
    [False, False, False, False, False, False, True, False]
    >>> guard.skipped
    1
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.pytorch.dist import all_reduce_sum, group_info

__all__ = ["SpikeGuard"]

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its standard deviation


class SpikeGuard:
    """Decide per optimizer step whether to skip the update because the loss spiked.

    Args:
        window: how many recent losses the median and MAD are taken over.
        threshold: skip when ``(loss - median) / (1.4826 * MAD)`` exceeds this.
        warmup: never skip a finite loss before this many losses have been seen.
        min_scale: floor of the robust spread, relative to ``|median|``, so that a
            perfectly flat loss does not turn tiny wiggles into spikes.
        sync: under ``torch.distributed``, average the loss over ranks first so every
            rank takes the same decision (ranks that disagree would fall out of step).
        process_group: group to average over (default: the world).
        logger: a :class:`~lengthwise.train.StepLogger` that gets a ``spike_skip`` event
            per skip. Pass ``skipped=`` to ``StepLogger.step`` to mark the step record.

    Use it between ``backward()`` and ``optimizer.step()``::

        skip = guard.check(loss, step=step)
        if not skip:
            optimizer.step()
        optimizer.zero_grad()
        logger.step(step, skipped=skip)
    """

    def __init__(
        self,
        window: int = 100,
        threshold: float = 6.0,
        warmup: int = 20,
        *,
        min_scale: float = 1e-3,
        sync: bool = True,
        process_group: Any = None,
        logger: Any = None,
    ) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 3:
            raise ConfigError(f"window must be an integer >= 3, got {window!r}")
        if not (isinstance(threshold, int | float) and threshold > 0):
            raise ConfigError(f"threshold must be > 0, got {threshold!r}")
        if not isinstance(warmup, int) or warmup < 3 or warmup > window:
            raise ConfigError(f"warmup must be an integer in [3, window={window}], got {warmup!r}")
        if not min_scale >= 0:
            raise ConfigError(f"min_scale must be >= 0, got {min_scale!r}")
        self.window = window
        self.threshold = float(threshold)
        self.warmup = warmup
        self.min_scale = float(min_scale)
        self.sync = sync
        self.process_group = process_group
        self.logger = logger
        self._history: deque[float] = deque(maxlen=window)
        self.checked = 0
        self.skipped = 0
        self.nonfinite = 0
        self.last_z: float | None = None

    def check(self, loss: Any, *, step: int | None = None) -> bool:
        """Return ``True`` when this update should be skipped; count it.

        ``loss`` is the step's loss (float or scalar tensor). Under
        ``torch.distributed`` with ``sync=True`` every rank must call this.

        Example::

            >>> guard = SpikeGuard(warmup=3)
            >>> guard.check(float("nan"))
            True
        """
        value = self._global_value(loss)
        self.checked += 1
        if not math.isfinite(value):
            self.nonfinite += 1
            self.last_z = None
            return self._skip(value, step, median=None, z=None)
        median, scale = self.reference()
        self.last_z = None if median is None else (value - median) / scale
        self._history.append(value)
        if self.last_z is not None and self.last_z > self.threshold:
            return self._skip(value, step, median=median, z=self.last_z)
        return False

    def reference(self) -> tuple[float | None, float]:
        """Running ``(median, robust spread)``; median is ``None`` during warm-up."""
        if len(self._history) < self.warmup:
            return None, math.nan
        values = np.fromiter(self._history, dtype=np.float64)
        median = float(np.median(values))
        mad = float(np.median(np.abs(values - median)))
        scale = max(_MAD_TO_SIGMA * mad, self.min_scale * abs(median), 1e-12)
        return median, scale

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state, so a resumed run keeps its window and counts."""
        return {"history": list(self._history), "checked": self.checked,
                "skipped": self.skipped, "nonfinite": self.nonfinite}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._history = deque((float(x) for x in state["history"]), maxlen=self.window)
        self.checked = int(state["checked"])
        self.skipped = int(state["skipped"])
        self.nonfinite = int(state["nonfinite"])

    def _skip(self, value: float, step: int | None, *, median: float | None,
              z: float | None) -> bool:
        self.skipped += 1
        if self.logger is not None:
            self.logger.event("spike_skip", step=step, loss=value, median=median, z=z,
                              skipped_total=self.skipped)
        return True

    def _global_value(self, loss: Any) -> float:
        if hasattr(loss, "detach"):
            if loss.numel() != 1:
                raise ConfigError(f"loss must be a scalar, got shape {tuple(loss.shape)}")
            value = float(loss.detach().item())
        elif isinstance(loss, int | float | np.number) and not isinstance(loss, bool):
            value = float(loss)
        else:
            raise TypeError(f"loss must be a number or a scalar tensor, got {type(loss).__name__}")
        info = group_info(self.process_group) if self.sync else None
        if info is not None and info.world_size > 1:
            total = all_reduce_sum(np.array([value], dtype=np.float64), info)
            value = float(total[0]) / info.world_size
        return value
