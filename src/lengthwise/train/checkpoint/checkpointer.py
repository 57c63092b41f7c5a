"""Saving and loading: the :class:`Checkpointer` (one save at a time, in the background,
published atomically), the :class:`PendingSave` handle of a save in flight, and
:func:`load_checkpoint`, which restores a checkpoint with the backend its manifest names.

Example::

    >>> import tempfile, torch
    >>> root = tempfile.mkdtemp()
    >>> with Checkpointer(root) as ckpt:
    ...     ckpt.save(1, model=torch.nn.Linear(1, 1)).wait().name
    'step_1'
    >>> load_checkpoint(root, model=torch.nn.Linear(1, 1))["step"]
    1
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lengthwise.disk import full_disk_error
from lengthwise.errors import ConfigError, DiskFullError
from lengthwise.pytorch.dist import GroupInfo, group_info
from lengthwise.train.checkpoint.folder import (
    MANIFEST,
    CheckpointError,
    CheckpointLockedError,
    CorruptCheckpointError,
    latest_checkpoint,
    previous_good,
    prune,
    publish,
    resolve_checkpoint,
    step_dirs,
)
from lengthwise.train.checkpoint.lock import WriterLock
from lengthwise.train.checkpoint.state import TrainingState, check_stateful, set_rng_state
from lengthwise.train.checkpoint.torch_backend import TORCH_FILE, load_torch, save_torch

__all__ = ["Checkpointer", "PendingSave", "SharedCheckpointers", "load_checkpoint",
           "save_checkpoint"]


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


class Checkpointer:
    """Save checkpoints into ``directory/step_N/`` without stalling the training loop.

    Args:
        directory: root folder of the run's checkpoints (shared by all ranks).
        keep: how many complete checkpoints to keep (``None`` keeps all).
        async_: write in the background (``False`` blocks until the write is done).
        logger: a :class:`~lengthwise.train.StepLogger` receiving ``checkpoint_begin``,
            ``checkpoint_end`` (with ``blocking_seconds``), ``checkpoint_written`` and
            ``checkpoint_failed`` events.
        process_group: group for the save's collectives; it must have a CPU backend and,
            for ``async_=True``, carry no other traffic (default: a new gloo group over
            all ranks, created on the first save).
        use_dcp: ``None`` picks ``torch.distributed.checkpoint`` exactly when a process
            group is initialised; ``True`` forces it (also in a single process).

    Saves are serialised: a new :meth:`save` first waits for the previous one, and
    re-raises its error if it failed. Under ``torch.distributed`` every rank calls
    :meth:`save` with the same step; rank 0 publishes the folder. The folder has one
    writer: the first save takes its writer lock (see
    :mod:`~lengthwise.train.checkpoint.lock`) until :meth:`close`, and a second
    checkpointer saving there gets :class:`CheckpointLockedError` naming the holder.

    Example::

        >>> import tempfile, torch
        >>> from lengthwise.train.checkpoint import list_checkpoints
        >>> ckpt = Checkpointer(tempfile.mkdtemp(), keep=1)
        >>> model = torch.nn.Linear(1, 1)
        >>> _ = ckpt.save(1, model=model); _ = ckpt.save(2, model=model)
        >>> ckpt.wait().name, [p.name for p in list_checkpoints(ckpt.directory)]
        ('step_2', ['step_2'])
        >>> ckpt.close()
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep: int | None = 3,
        async_: bool = True,
        logger: Any = None,
        process_group: Any = None,
        use_dcp: bool | None = None,
    ) -> None:
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 1):
            raise ConfigError(f"keep must be a positive integer or None, got {keep!r}")
        self.directory = Path(directory)
        self.keep = keep
        self.async_ = async_
        self.logger = logger
        self.process_group = process_group
        self.use_dcp = use_dcp
        self._cpu_group: Any = None
        self._pending: PendingSave | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = WriterLock(self.directory)
        self._lock_settled = False  # whether this save session took the writer lock
        self.closed = False

    # public API
    def save(
        self,
        step: int,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        sampler: Any = None,
        extra: Any = None,
        files: Mapping[str, str] | None = None,
    ) -> PendingSave:
        """Start saving ``step``; returns once the state is copied (or written, if not async).

        Call it between optimizer steps, after the sampler has handed out the
        batches of the steps done so far, so that a resumed run continues exactly.
        ``files``: small text files (name -> text) written into the checkpoint folder
        by rank 0 and covered by its manifest (e.g. a model's config).
        """
        step = _checked_save_args(step, model, optimizer, scheduler, sampler)
        files = _checked_files(files)
        self.closed = False
        info, use_dcp = self._backend()
        rank = info.rank if info is not None else 0
        tmp, final = step_dirs(self.directory, step)
        self._take_lock(info, rank)  # before anything is written or logged
        start = time.perf_counter()
        self._event(rank, "checkpoint_begin", step=step, path=str(final))
        self.wait()  # one save at a time; raises if the previous one failed
        state = TrainingState(step, model, optimizer, scheduler, sampler, extra)
        future = self._write(state, tmp, final, info, use_dcp, rank, start, files)
        blocking = time.perf_counter() - start
        pending = PendingSave(step, final, future, blocking)
        self._event(rank, "checkpoint_end", step=step, path=str(final),
                    blocking_seconds=blocking, backend="dcp" if use_dcp else "torch",
                    async_=self.async_)
        if self.async_:
            self._pending = pending
        else:
            pending.wait()
        return pending

    def wait(self) -> Path | None:
        """Wait for the save in flight (if any); return its path or raise its error.

        A failure that :meth:`PendingSave.wait` already raised is not raised again.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        already_seen = pending.error_seen
        try:
            return pending.wait()
        except CheckpointError:
            if already_seen:
                return None
            raise

    def latest(self) -> Path | None:
        """Newest complete checkpoint in this checkpointer's directory."""
        return latest_checkpoint(self.directory)

    def close(self) -> None:
        """Wait for the last save, stop the writer thread and release the folder's lock.

        A later save starts the thread and takes the lock again.
        """
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._lock.release()
            self._lock_settled = False
            self.closed = True

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # internals
    def _take_lock(self, info: GroupInfo | None, rank: int) -> None:
        """Hold the folder's writer lock from the first save to :meth:`close` (rank 0 takes it).

        Under ``torch.distributed`` rank 0's outcome is broadcast, so every rank raises
        the same :class:`CheckpointLockedError` instead of waiting in the save's collectives.
        """
        if self._lock_settled:
            return
        error = None
        if rank == 0:
            try:
                self._lock.acquire()
            except CheckpointLockedError as exc:
                error = str(exc)
        if info is not None and info.world_size > 1:
            message = [error]
            info.dist.broadcast_object_list(message, group=self._checkpoint_group(info),
                                            group_src=0)
            error = message[0]
        if error is not None:
            raise CheckpointLockedError(error)
        self._lock_settled = True

    def _backend(self) -> tuple[GroupInfo | None, bool]:
        """The process group's info and whether saves go through DCP (checked for the group)."""
        info = group_info(self.process_group)
        use_dcp = self.use_dcp if self.use_dcp is not None else info is not None
        if not use_dcp and info is not None and info.world_size > 1:
            raise ConfigError(
                "use_dcp=False only works in a single process; under torch.distributed "
                "checkpoints go through torch.distributed.checkpoint"
            )
        return info, use_dcp

    def _write(self, state: TrainingState, tmp: Path, final: Path, info: GroupInfo | None,
               use_dcp: bool, rank: int, start: float,
               files: dict[str, str] | None = None) -> Future:
        """Start writing ``state`` with the chosen backend (and wait for it unless async)."""
        step = state.step

        def finish(manifest: dict[str, Any]) -> Path:
            if rank == 0:
                for name, text in (files or {}).items():
                    (tmp / name).write_text(text, encoding="utf-8")
            return self._finish(rank, step, tmp, final, manifest, start)

        def failed(exc: BaseException) -> None:
            self._event(rank, "checkpoint_failed", step=step,
                        error=f"{type(exc).__name__}: {exc}")

        if use_dcp:  # torch.distributed.checkpoint is imported only when used
            from lengthwise.train.checkpoint.dcp_backend import save_dcp

            future = save_dcp(state, tmp, info, self._checkpoint_group, finish, failed)
        else:
            future = save_torch(state, tmp, self._writer_thread(), finish, failed)
        if not self.async_:
            try:
                future.result()
            except BaseException:
                pass  # raised by pending.wait() in save
        return future

    def _event(self, rank: int, name: str, **fields: Any) -> None:
        if self.logger is None or rank != 0:
            return
        try:
            self.logger.event(name, **fields)
        except Exception as exc:  # a closed or broken log must not fail the checkpoint
            warnings.warn(f"could not log {name} for step {fields.get('step')}: {exc}",
                          stacklevel=2)

    def _finish(self, rank: int, step: int, tmp: Path, final: Path, manifest: dict[str, Any],
                start: float) -> Path:
        """Runs after every file is written: publish the folder (rank 0) and prune."""
        if rank == 0:
            publish(tmp, final, manifest)
            prune(self.directory, step, self.keep)
            self._event(rank, "checkpoint_written", step=step, path=str(final),
                        seconds=time.perf_counter() - start)
        return final

    def _writer_thread(self) -> ThreadPoolExecutor:
        """The thread that writes single-process saves, started on the first one."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="lengthwise-checkpoint")
        return self._executor

    def _checkpoint_group(self, info: GroupInfo) -> Any:
        """Group for the save's collectives.

        A background save must not share a group with the training loop's own
        collectives (their order would interleave differently on each rank), and
        ``async_save`` needs a CPU backend; so unless a ``process_group`` was given,
        a gloo group over all ranks is created once, on the first save.
        """
        if self.process_group is not None:
            return self.process_group
        if self._cpu_group is None:
            self._cpu_group = info.dist.new_group(backend="gloo")
        return self._cpu_group


def _checked_save_args(step: Any, model: Any, optimizer: Any, scheduler: Any,
                       sampler: Any) -> int:
    """``step`` as an int, once it, ``model`` and the stateful objects are checked."""
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ConfigError(f"step must be a non-negative integer, got {step!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler),
                      ("sampler", sampler)):
        check_stateful(name, obj)
    return int(step)


class SharedCheckpointers:
    """The checkpointers :func:`save_checkpoint` reuses: one per directory, at most ``size``.

    A call with other settings (``keep``, ``async_``, ``logger``) than the directory's
    checkpointer closes it (waiting for its save) and starts a new one, so settings
    never change under a save in flight. Beyond ``size`` directories the least
    recently used one is closed. :meth:`close` (run at interpreter exit) waits for
    every save and stops the writer threads.

    Example::

        >>> import tempfile, torch
        >>> shared = SharedCheckpointers(size=1)
        >>> a = shared.get(tempfile.mkdtemp(), keep=3, async_=True, logger=None)
        >>> b = shared.get(tempfile.mkdtemp(), keep=3, async_=True, logger=None)
        >>> len(shared), a.closed, b.closed
        (1, True, False)
        >>> shared.close(); b.closed
        True
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._items: OrderedDict[Path, Checkpointer] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, directory: str | os.PathLike, *, keep: int | None, async_: bool,
            logger: Any) -> Checkpointer:
        """The checkpointer of ``directory`` with these settings (closing a stale one)."""
        key = Path(directory).resolve()
        evicted: list[Checkpointer] = []
        with self._lock:
            found = self._items.pop(key, None)
            stale = None
            if found is not None and (found.keep != keep or found.async_ != async_
                                      or found.logger is not logger):
                stale, found = found, None
            if found is None:
                found = Checkpointer(directory, keep=keep, async_=async_, logger=logger)
            self._items[key] = found
            while len(self._items) > self.size:
                evicted.append(self._items.popitem(last=False)[1])
        _close_warning(evicted)  # another directory: its failure is not this call's
        if stale is not None:
            stale.close()  # same directory: a failure of its last save is raised here
        return found

    def close(self) -> None:
        """Wait for every save in flight and stop the writer threads (warns on failures)."""
        with self._lock:
            items = list(self._items.values())
            self._items.clear()
        _close_warning(items)


def _close_warning(checkpointers: list[Checkpointer]) -> None:
    """Close ``checkpointers``, a failed save of theirs a warning rather than an error."""
    for checkpointer in checkpointers:
        try:
            checkpointer.close()
        except CheckpointError as exc:
            warnings.warn(f"a background checkpoint save failed: {exc}", stacklevel=3)


def _checked_files(files: Mapping[str, str] | None) -> dict[str, str] | None:
    """``files`` as a dict, refusing names that are not plain file names or clash with ours."""
    if files is None:
        return None
    out = {}
    for name, text in files.items():
        if (not isinstance(name, str) or not name or Path(name).name != name
                or name.startswith(".") or name == MANIFEST or name.endswith(".distcp")
                or name in (TORCH_FILE, ".metadata")):
            raise ConfigError(f"files: checkpoint file name {name!r} must be a plain file name "
                              "that is not one of the checkpoint's own")
        if not isinstance(text, str):
            raise ConfigError(f"files: checkpoint file {name!r} must be text, got "
                              f"{type(text).__name__}")
        out[name] = text
    return out


_SHARED = SharedCheckpointers()
atexit.register(_SHARED.close)


def save_checkpoint(
    directory: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    sampler: Any = None,
    extra: Any = None,
    logger: Any = None,
    keep: int | None = 3,
    async_: bool = True,
) -> PendingSave:
    """Save a checkpoint of ``step`` into ``directory`` (see :class:`Checkpointer`).

    Calls with the same ``directory`` and settings share one :class:`Checkpointer`, so
    a save waits for the previous one (see :class:`SharedCheckpointers`: a few recent
    directories are kept, and their threads stop at exit). Returns a
    :class:`PendingSave`; ``.wait()`` for the path.

    Example::

        >>> import tempfile, torch
        >>> root = tempfile.mkdtemp()
        >>> save_checkpoint(root, 5, model=torch.nn.Linear(1, 1), async_=False).path.name
        'step_5'
    """
    checkpointer = _SHARED.get(directory, keep=keep, async_=async_, logger=logger)
    return checkpointer.save(step, model=model, optimizer=optimizer, scheduler=scheduler,
                             sampler=sampler, extra=extra)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    sampler: Any = None,
    restore_rng: bool = True,
    strict: bool = True,
    map_location: Any = "cpu",
    process_group: Any = None,
) -> dict[str, Any]:
    """Restore a checkpoint into the given objects; return ``{"step", "extra", "path"}``.

    ``path`` is a ``step_N`` folder or a root folder (its latest complete checkpoint
    that verifies is used, skipping corrupt ones with a warning). The files are checked
    against the checksums of the manifest first: a file missing, cut short or changed
    raises :class:`CorruptCheckpointError` naming it and the previous good checkpoint.
    Objects passed in must have been saved; objects left out are not
    touched. RNG states are restored unless ``restore_rng=False``. Under
    ``torch.distributed`` every rank calls this and gets its own RNG and sampler state.

    Example::

        >>> import tempfile, torch
        >>> from lengthwise.train.checkpoint import save_checkpoint
        >>> root = tempfile.mkdtemp()
        >>> _ = save_checkpoint(root, 3, model=torch.nn.Linear(1, 1), async_=False)
        >>> load_checkpoint(root, model=torch.nn.Linear(1, 1))["step"]
        3
    """
    path, manifest = resolve_checkpoint(path)
    contents = set(manifest.get("contents", []))
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("sampler", sampler)):
        check_stateful(name, obj)
        if obj is not None and name not in contents:
            raise CheckpointError(f"{path} holds no {name} state (it has {sorted(contents)})")
    backend = manifest.get("backend")
    try:
        if backend == "torch":
            aux = load_torch(path, model, optimizer, strict, map_location)
        elif backend == "dcp":
            from lengthwise.train.checkpoint.dcp_backend import load_dcp

            aux = load_dcp(path, manifest, model, optimizer, strict, process_group)
        else:
            raise CheckpointError(f"{path}: unknown checkpoint backend {backend!r}")
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{exc}; {previous_good(path)}") from exc.__cause__
    if not isinstance(aux, dict) or not {"step", "extra", "rng"} <= set(aux):
        raise CorruptCheckpointError(f"{path}: the saved training state is incomplete; "
                                     f"{previous_good(path)}")
    if scheduler is not None:
        scheduler.load_state_dict(aux["scheduler"])
    if sampler is not None:
        sampler.load_state_dict(aux["sampler"])
    if restore_rng:
        try:
            set_rng_state(aux["rng"])
        except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as exc:
            raise CorruptCheckpointError(f"{path}: the saved RNG states cannot be restored: "
                                         f"{type(exc).__name__}: {exc}") from exc
    return {"step": aux["step"], "extra": aux["extra"], "path": path}
