"""Atomic, asynchronous training checkpoints that resume a run exactly.

A checkpoint holds the model, the optimizer, the learning-rate scheduler, the
sampler's position (anything with ``state_dict``/``load_state_dict``), the RNG
states of Python, NumPy, torch and CUDA, the step and free-form ``extra`` data.

How it is written:

- **Under torch.distributed** (a process group is initialised) it uses PyTorch's
  distributed checkpointing, ``torch.distributed.checkpoint.async_save``: every
  rank stages its shard into CPU memory (the only part that blocks the loop) and a
  background thread writes it. Sharded models (FSDP, DTensor) save and load
  through ``get_model_state_dict``/``get_optimizer_state_dict``. The save's own
  collectives run on a separate gloo group (created once, on the first save), so
  they neither interleave with the loop's collectives nor need a CPU backend in
  the training group. Every rank's RNG and sampler states are kept, per rank.
- **In a single process** (no process group) it copies the state to CPU memory and
  a background thread writes it with ``torch.save`` to ``state.pt``.

Either way the files go to ``step_N.tmp/`` first; once all are written a
``COMPLETE`` manifest is added and the folder is renamed to ``step_N/``, so a
crash in the middle of a save leaves the previous checkpoint as the latest
complete one. Only the newest ``keep`` complete checkpoints are kept.

Checkpoints are pickles: load only files you wrote.

Example::

    >>> import tempfile, torch
    >>> from lengthwise.train import Checkpointer, load_checkpoint
    >>> model = torch.nn.Linear(2, 2)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> root = tempfile.mkdtemp()
    >>> with Checkpointer(root, keep=2) as ckpt:
    ...     pending = ckpt.save(10, model=model, optimizer=opt, extra={"note": "hi"})
    ...     path = pending.wait()
    >>> path.name
    'step_10'
    >>> load_checkpoint(root, model=model, optimizer=opt)["extra"]
    {'note': 'hi'}
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lengthwise.train._dist import GroupInfo, group_info

__all__ = [
    "Checkpointer",
    "CheckpointError",
    "PendingSave",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
]

MANIFEST = "COMPLETE"
FORMAT = "lengthwise-checkpoint"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_DIR = re.compile(r"^step_(\d+)\.tmp$")
_TORCH_FILE = "state.pt"
_NO_DIST_SAVE_NOTICE = "torch.distributed is disabled, unavailable or uninitialized, assuming"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


# -- finding checkpoints -------------------------------------------------------------------
def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    return manifest


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``directory``, oldest step first.

    Example::

        >>> import tempfile
        >>> list_checkpoints(tempfile.mkdtemp())
        []
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and _read_manifest(child) is not None:
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step under ``directory``, or ``None``.

    Example::

        >>> import tempfile
        >>> latest_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    found = list_checkpoints(directory)
    return found[-1] if found else None


# -- state capture ---------------------------------------------------------------------------
def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        for device, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)


def _cpu_copy(obj: Any) -> Any:
    """Deep copy with every tensor copied to CPU memory (the training loop may go on)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _cpu_copy(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_cpu_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_cpu_copy(v) for v in obj)
    return obj


def _check_stateful(name: str, obj: Any) -> None:
    if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
        raise TypeError(f"{name} must have state_dict() and load_state_dict(), got {type(obj)}")


def _aux_state(step: int, optimizer: Any, scheduler: Any, sampler: Any, extra: Any,
               param_groups_only: bool) -> bytes:
    aux = {
        "step": step,
        "extra": extra,
        "rng": _rng_state(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "sampler": None if sampler is None else sampler.state_dict(),
        "optimizer_param_groups": (
            optimizer.state_dict()["param_groups"] if param_groups_only else None
        ),
    }
    return pickle.dumps(_cpu_copy(aux), protocol=pickle.HIGHEST_PROTOCOL)


# -- files --------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _torch_save(obj: Any, path: Path) -> None:
    """Write ``obj`` with ``torch.save`` and push it to the disk."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    path = directory / MANIFEST
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def _remove_tree(path: Path) -> None:
    (path / MANIFEST).unlink(missing_ok=True)  # first stop it counting as complete
    shutil.rmtree(path, ignore_errors=True)


def _publish(tmp: Path, final: Path, manifest: dict[str, Any]) -> None:
    """Mark ``tmp`` complete and rename it to ``final`` (replacing an older ``final``)."""
    _write_manifest(tmp, manifest)
    _fsync_dir(tmp)
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        _remove_tree(old)


# -- saving -----------------------------------------------------------------------------------
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
    :meth:`save` with the same step; rank 0 publishes the folder.

    Example::

        >>> import tempfile, torch
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
            raise ValueError(f"keep must be a positive integer or None, got {keep!r}")
        self.directory = Path(directory)
        self.keep = keep
        self.async_ = async_
        self.logger = logger
        self.process_group = process_group
        self.use_dcp = use_dcp
        self._cpu_group: Any = None
        self._pending: PendingSave | None = None
        self._executor: ThreadPoolExecutor | None = None

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
    ) -> PendingSave:
        """Start saving ``step``; returns once the state is copied (or written, if not async).

        Call it between optimizer steps, after the sampler has handed out the
        batches of the steps done so far, so that a resumed run continues exactly.
        """
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        step = int(step)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        for name, obj in (("optimizer", optimizer), ("scheduler", scheduler),
                          ("sampler", sampler)):
            _check_stateful(name, obj)
        info = group_info(self.process_group)
        use_dcp = self.use_dcp if self.use_dcp is not None else info is not None
        if not use_dcp and info is not None and info.world_size > 1:
            raise ValueError(
                "use_dcp=False only works in a single process; under torch.distributed "
                "checkpoints go through torch.distributed.checkpoint"
            )
        rank = info.rank if info is not None else 0
        final = self.directory / f"step_{step}"
        tmp = self.directory / f"step_{step}.tmp"
        start = time.perf_counter()
        self._event(rank, "checkpoint_begin", step=step, path=str(final))
        self.wait()  # one save at a time; raises if the previous one failed
        if use_dcp:
            future = self._save_dcp(step, tmp, final, info, model, optimizer, scheduler,
                                    sampler, extra, start)
        else:
            future = self._save_torch(step, tmp, final, model, optimizer, scheduler, sampler,
                                      extra, start)
        if not self.async_:
            try:
                future.result()
            except BaseException:
                pass  # raised by pending.wait() below
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
        """Wait for the last save and release the writer thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # internals
    def _event(self, rank: int, name: str, **fields: Any) -> None:
        if self.logger is None or rank != 0:
            return
        try:
            self.logger.event(name, **fields)
        except Exception as exc:  # a closed or broken log must not fail the checkpoint
            warnings.warn(f"could not log {name} for step {fields.get('step')}: {exc}",
                          stacklevel=2)

    def _manifest(self, step: int, backend: str, world_size: int, has_optimizer_state: bool,
                  contents: list[str]) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": 1, "step": step, "backend": backend,
            "world_size": world_size, "time": time.time(),
            "has_optimizer_state": has_optimizer_state, "contents": contents,
        }

    def _finish(self, rank: int, step: int, tmp: Path, final: Path, manifest: dict[str, Any],
                start: float) -> Path:
        """Runs after every file is written: publish the folder (rank 0) and prune."""
        if rank == 0:
            _publish(tmp, final, manifest)
            self._prune(step)
            self._event(rank, "checkpoint_written", step=step, path=str(final),
                        seconds=time.perf_counter() - start)
        return final

    def _prune(self, step: int) -> None:
        if not self.directory.is_dir():
            return
        for child in self.directory.iterdir():
            match = _TMP_DIR.match(child.name)
            if match and int(match.group(1)) < step:  # left by a crashed save
                _remove_tree(child)
        if self.keep is not None:
            for old in list_checkpoints(self.directory)[: -self.keep]:
                _remove_tree(old)

    def _failed(self, rank: int, step: int, exc: BaseException) -> None:
        self._event(rank, "checkpoint_failed", step=step, error=f"{type(exc).__name__}: {exc}")

    def _save_torch(self, step: int, tmp: Path, final: Path, model: torch.nn.Module,
                    optimizer: Any, scheduler: Any, sampler: Any, extra: Any,
                    start: float) -> Future:
        state = {"model": _cpu_copy(model.state_dict())}
        contents = ["model"]
        if optimizer is not None:
            state["optimizer"] = _cpu_copy(optimizer.state_dict())
            contents.append("optimizer")
        state["aux_rank0"] = _aux_state(step, optimizer, scheduler, sampler, extra, False)
        contents += [name for name, obj in (("scheduler", scheduler), ("sampler", sampler))
                     if obj is not None]
        manifest = self._manifest(step, "torch", 1, optimizer is not None, contents)

        def write() -> Path:
            try:
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir(parents=True)
                _torch_save(state, tmp / _TORCH_FILE)
                return self._finish(0, step, tmp, final, manifest, start)
            except BaseException as exc:
                self._failed(0, step, exc)
                raise

        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="lengthwise-checkpoint")
        return self._executor.submit(write)

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

    def _save_dcp(self, step: int, tmp: Path, final: Path, info: GroupInfo | None,
                  model: torch.nn.Module, optimizer: Any, scheduler: Any, sampler: Any,
                  extra: Any, start: float) -> Future:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        rank = info.rank if info is not None else 0
        world_size = info.world_size if info is not None else 1
        # an optimizer without state (before its first step) would be stepped by
        # get_optimizer_state_dict to create one; keep only its hyper-parameters then
        has_opt_state = optimizer is not None and bool(optimizer.state)
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        contents = ["model"]
        if has_opt_state:
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        if optimizer is not None:
            contents.append("optimizer")
        state[f"aux_rank{rank}"] = _aux_state(
            step, optimizer, scheduler, sampler, extra, optimizer is not None and not has_opt_state
        )
        contents += [name for name, obj in (("scheduler", scheduler), ("sampler", sampler))
                     if obj is not None]
        manifest = self._manifest(step, "dcp", world_size, has_opt_state, contents)
        if rank == 0:
            tmp.parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"checkpoint_id": str(tmp)}
        if info is None:
            kwargs["no_dist"] = True
        else:
            kwargs["process_group"] = self._checkpoint_group(info)
        outer: Future = Future()

        def finish(inner: Future) -> None:
            try:
                inner.result()
                outer.set_result(self._finish(rank, step, tmp, final, manifest, start))
            except BaseException as exc:
                self._failed(rank, step, exc)
                outer.set_exception(exc)

        if info is None:
            # single process on purpose; the notice is raised from the writer thread,
            # where a local catch_warnings cannot reach it
            warnings.filterwarnings("ignore", message=_NO_DIST_SAVE_NOTICE, category=UserWarning)
        try:
            inner = dcp.async_save(state, **kwargs)
        except BaseException as exc:
            self._failed(rank, step, exc)
            raise
        upload = getattr(inner, "upload_completion", inner)
        upload.add_done_callback(finish)
        return outer


_SHARED: dict[Path, Checkpointer] = {}
_SHARED_LOCK = threading.Lock()


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

    Calls with the same ``directory`` share one :class:`Checkpointer`, so a save
    waits for the previous one. Returns a :class:`PendingSave`; ``.wait()`` for the path.

    Example::

        >>> import tempfile, torch
        >>> root = tempfile.mkdtemp()
        >>> save_checkpoint(root, 5, model=torch.nn.Linear(1, 1), async_=False).path.name
        'step_5'
    """
    key = Path(directory).resolve()
    with _SHARED_LOCK:
        checkpointer = _SHARED.get(key)
        if checkpointer is None:
            checkpointer = _SHARED[key] = Checkpointer(directory)
    checkpointer.keep = keep
    checkpointer.async_ = async_
    checkpointer.logger = logger
    return checkpointer.save(step, model=model, optimizer=optimizer, scheduler=scheduler,
                             sampler=sampler, extra=extra)


# -- loading ----------------------------------------------------------------------------------
def _resolve(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    path = Path(path)
    manifest = _read_manifest(path)
    if manifest is None:
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(
                f"{path} is neither a complete checkpoint nor a folder holding one"
            )
        path, manifest = latest, _read_manifest(latest)
    assert manifest is not None
    return path, manifest


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
    is used). Objects passed in must have been saved; objects left out are not
    touched. RNG states are restored unless ``restore_rng=False``. Under
    ``torch.distributed`` every rank calls this and gets its own RNG and sampler state.

    Example::

        >>> import tempfile, torch
        >>> root = tempfile.mkdtemp()
        >>> _ = save_checkpoint(root, 3, model=torch.nn.Linear(1, 1), async_=False)
        >>> load_checkpoint(root, model=torch.nn.Linear(1, 1))["step"]
        3
    """
    path, manifest = _resolve(path)
    contents = set(manifest.get("contents", []))
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("sampler", sampler)):
        _check_stateful(name, obj)
        if obj is not None and name not in contents:
            raise CheckpointError(f"{path} holds no {name} state (it has {sorted(contents)})")
    if manifest["backend"] == "torch":
        state = torch.load(path / _TORCH_FILE, map_location=map_location, weights_only=False)
        model.load_state_dict(state["model"], strict=strict)
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        aux = pickle.loads(state["aux_rank0"])
    elif manifest["backend"] == "dcp":
        aux = _load_dcp(path, manifest, model, optimizer, strict, process_group)
    else:
        raise CheckpointError(f"{path}: unknown checkpoint backend {manifest['backend']!r}")
    if scheduler is not None:
        scheduler.load_state_dict(aux["scheduler"])
    if sampler is not None:
        sampler.load_state_dict(aux["sampler"])
    if restore_rng:
        _set_rng_state(aux["rng"])
    return {"step": aux["step"], "extra": aux["extra"], "path": path}


def _load_dcp(path: Path, manifest: dict[str, Any], model: torch.nn.Module, optimizer: Any,
              strict: bool, process_group: Any) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    info = group_info(process_group)
    rank = info.rank if info is not None else 0
    saved_world = int(manifest.get("world_size", 1))
    if rank >= saved_world:
        warnings.warn(
            f"{path} was saved by {saved_world} rank(s); rank {rank} takes rank 0's RNG and "
            "sampler state",
            stacklevel=3,
        )
    aux_key = f"aux_rank{rank if rank < saved_world else 0}"
    state: dict[str, Any] = {"model": get_model_state_dict(model), aux_key: b""}
    load_optimizer_state = optimizer is not None and manifest.get("has_optimizer_state", False)
    if load_optimizer_state:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    kwargs: dict[str, Any] = {"checkpoint_id": str(path)}
    if info is None:
        kwargs["no_dist"] = True
    else:
        kwargs["process_group"] = process_group
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_SAVE_NOTICE, category=UserWarning)
        dcp.load(state, **kwargs)
    options = StateDictOptions(strict=strict)
    set_model_state_dict(model, state["model"], options=options)
    aux = pickle.loads(state[aux_key])
    if load_optimizer_state:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)
    elif optimizer is not None and aux.get("optimizer_param_groups") is not None:
        saved = aux["optimizer_param_groups"]
        if len(saved) != len(optimizer.param_groups):
            raise CheckpointError(
                f"{path}: optimizer has {len(optimizer.param_groups)} param groups, "
                f"checkpoint {len(saved)}"
            )
        for group, saved_group in zip(optimizer.param_groups, saved, strict=True):
            group.update({k: v for k, v in saved_group.items() if k != "params"})
    return aux
