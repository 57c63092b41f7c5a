"""Restoring a checkpoint into the model, optimizer, scheduler, sampler and RNGs.

See :func:`load_checkpoint`; the files are read by the backend named in the manifest.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lengthwise.train.checkpoint.dcp_backend import load_dcp
from lengthwise.train.checkpoint.errors import CheckpointError, CorruptCheckpointError
from lengthwise.train.checkpoint.layout import previous_good, resolve_checkpoint
from lengthwise.train.checkpoint.state import check_stateful, set_rng_state
from lengthwise.train.checkpoint.torch_backend import load_torch

__all__ = ["load_checkpoint"]


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
