"""A stop asked for by ``SIGTERM`` (a scheduler's, ``kill``'s), taken between optimizer steps.

:class:`StopRequest` replaces the default action of ``SIGTERM`` (the process dies where it
is, losing the steps since the last checkpoint) by a flag; a training loop asks
:meth:`StopRequest.requested` after each step and, when it is set, saves a checkpoint and
exits with status 143 (128 + 15, as if killed by the signal). Under ``torch.distributed``
the flag is summed over the ranks, so every rank stops after the same step even when the
signal reached only some of them. Outside the main thread nothing is installed.

Example::

    >>> with StopRequest() as stop:
    ...     stop.requested(None)
    False
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import numpy as np

from lengthwise.pytorch.dist import all_reduce_sum

__all__ = ["EXIT_STATUS", "StopRequest"]

#: the exit status of a run stopped by SIGTERM: 128 + the signal's number
EXIT_STATUS = 128 + signal.SIGTERM


class StopRequest:
    """Within the block, ``SIGTERM`` sets a flag instead of killing the process."""

    def __init__(self) -> None:
        self._flag = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._flag = True

    def requested(self, info: Any) -> bool:
        """Whether any rank got ``SIGTERM`` (every rank of ``info``'s group must ask together)."""
        if info is None or info.world_size == 1:
            return self._flag

        return bool(all_reduce_sum(np.array([float(self._flag)]), info)[0] > 0)
