"""The single-process backend: state copied to CPU memory, written by a thread with ``torch.save``.

The checkpoint folder holds one file, ``state.pt``: the model's and optimizer's state
dicts and ``aux_rank0``, the rest of the training state as JSON text (see
:mod:`~lengthwise.train.checkpoint.state`). It is read with
``torch.load(weights_only=True)``, which builds tensors and plain containers only.

Example::

    >>> import tempfile
    >>> from concurrent.futures import ThreadPoolExecutor
    >>> from lengthwise.train.checkpoint.state import TrainingState
    >>> tmp = Path(tempfile.mkdtemp()) / "step_1.tmp"
    >>> with ThreadPoolExecutor(1) as pool:
    ...     future = save_torch(TrainingState(1, torch.nn.Linear(1, 1)), tmp, pool,
    ...                         finish=lambda manifest: tmp, failed=print)
    ...     sorted(p.name for p in future.result().iterdir())
    ['state.pt']
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from lengthwise.disk import full_disk_error
from lengthwise.train.checkpoint.folder import CheckpointError, CorruptCheckpointError, new_manifest
from lengthwise.train.checkpoint.state import TrainingState, cpu_copy, from_json, state_bytes

TORCH_FILE = "state.pt"


def _torch_save(obj: Any, path: Path) -> None:
    """Write ``obj`` with ``torch.save`` and push it to the disk."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def save_torch(state: TrainingState, tmp: Path, executor: ThreadPoolExecutor,
               finish: Callable[[dict[str, Any]], Path],
               failed: Callable[[BaseException], None]) -> Future:
    """Copy ``state`` to CPU memory now; on ``executor``'s thread write it into ``tmp``.

    Once written, ``finish(manifest)`` publishes the folder and gives the future's
    result; a failure calls ``failed(exc)``, removes ``tmp`` and is the future's
    exception (a full disk as a :class:`~lengthwise.errors.DiskFullError` saying how
    much the checkpoint needs).
    """
    data = {"model": cpu_copy(state.model.state_dict())}
    if state.optimizer is not None:
        data["optimizer"] = cpu_copy(state.optimizer.state_dict())
    data["aux_rank0"] = state.aux(param_groups_only=False)
    manifest = new_manifest(state.step, "torch", 1, state.optimizer is not None,
                            state.contents())

    def write() -> Path:
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            _torch_save(data, tmp / TORCH_FILE)
            return finish(manifest)
        except BaseException as exc:
            failed(exc)
            shutil.rmtree(tmp, ignore_errors=True)  # a half-written folder only takes room
            full = full_disk_error(exc, tmp.parent, needed=state_bytes(data),
                                   what=f"saving checkpoint step {state.step}")
            if full is not None:
                raise full from exc
            raise

    return executor.submit(write)


def load_torch(path: Path, model: torch.nn.Module, optimizer: Any, strict: bool,
               map_location: Any) -> dict[str, Any]:
    """Load the model (and optimizer) from ``path``; return the aux state (read from JSON).

    ``state.pt`` is read with ``torch.load(weights_only=True)``: a file holding
    anything but tensors and plain containers is refused, nothing in it runs.
    """
    file = path / TORCH_FILE
    try:
        with warnings.catch_warnings():  # a refused file may warn of its pickle protocol
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(file, map_location=map_location, weights_only=True)
        text = state["aux_rank0"]
        if not isinstance(text, str):
            raise TypeError(f"its training state is a {type(text).__name__}, not JSON text")
        aux = from_json(text)
        model_state = state["model"]
        optimizer_state = state["optimizer"] if optimizer is not None else None
    except pickle.UnpicklingError as exc:
        raise CorruptCheckpointError(
            f"{file} holds objects other than tensors and plain data; it is refused, not "
            f"loaded (loading such objects can run code){_refusal(exc)}") from None
    except (OSError, EOFError, ValueError, RuntimeError, KeyError, TypeError,
            IndexError) as exc:
        raise CorruptCheckpointError(
            f"{file} cannot be read as a checkpoint: {type(exc).__name__}: "
            f"{_first_line(exc)}") from exc
    try:  # a state of another model, or one without the model's tensors: not a corrupt file
        model.load_state_dict(model_state, strict=strict)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{file}: {state_mismatch(model, model_state, exc)}") from exc
    if optimizer is not None:
        try:
            optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: its optimizer state does not fit the model's "
                                  f"parameters ({_first_line(exc)})") from exc
    return aux


def state_mismatch(model: torch.nn.Module, state: Any, exc: BaseException) -> str:
    """Why ``state`` does not load into ``model``: the tensors missing and unexpected, counted."""
    if not isinstance(state, dict):
        return f"its model state is a {type(state).__name__}, not a dict of tensors"
    wanted, held = set(model.state_dict()), set(state)
    missing, unexpected = sorted(wanted - held), sorted(held - wanted)
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensors missing (e.g. {missing[0]!r})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]!r})")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [""]
    detail = lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]
    found = ", ".join(parts) or detail.rstrip(". ")
    return f"its model state does not fit the model: {found}"


def _refusal(exc: BaseException) -> str:
    """What ``torch.load(weights_only=True)`` refused (its own advice left out), or ``""``."""
    for line in str(exc).splitlines():
        if "Unsupported" in line or "GLOBAL" in line:
            return f": {line.strip()}"
    return ""


def _first_line(exc: BaseException) -> str:
    """The first line of an error's message (``torch.load``'s refusals run to a page)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
