"""The handle of one checkpoint save in flight.

Example::

    >>> from concurrent.futures import Future
    >>> future = Future(); future.set_result(Path("ckpt/step_1"))
    >>> PendingSave(1, Path("ckpt/step_1"), future, 0.01).wait().name
    'step_1'
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from lengthwise.disk import full_disk_error
from lengthwise.errors import DiskFullError
from lengthwise.train.checkpoint.errors import CheckpointError

__all__ = ["PendingSave"]


class PendingSave:
    """Handle of one checkpoint save; :meth:`wait` returns its final path.

    ``blocking_seconds`` is how long :meth:`Checkpointer.save` held up the loop.
    """

    def __init__(self, step: int, path: Path, future: Future, blocking_seconds: float) -> None:
        self.step = step
        self.path = path
        self.blocking_seconds = blocking_seconds
        self._future = future
        self.error_seen = False  # set once wait() has raised the failure to the caller

    def done(self) -> bool:
        """Whether the write has finished (successfully or not)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Path:
        """Block until written; return the checkpoint folder or raise :class:`CheckpointError`."""
        try:
            return self._future.result(timeout)
        except TimeoutError:
            raise
        except BaseException as exc:
            self.error_seen = True
            if isinstance(exc, CheckpointError):
                raise
            full = exc if isinstance(exc, DiskFullError) else full_disk_error(
                exc, self.path.parent, what=f"saving checkpoint step {self.step}")
            if full is not None:  # a full disk, whichever backend wrote: it says which save
                raise CheckpointError(str(full)) from exc
            raise CheckpointError(f"saving checkpoint step {self.step} failed: {exc}") from exc

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"PendingSave(step={self.step}, path={str(self.path)!r}, {state})"
