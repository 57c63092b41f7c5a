"""The ``torch.distributed.checkpoint`` backend: every rank writes its shard in the background.

``async_save`` stages each rank's shard into CPU memory (the only part that
blocks the loop) and a background thread writes it. Sharded models (FSDP,
DTensor) save and load through ``get_model_state_dict``/``get_optimizer_state_dict``.
Every rank's RNG and sampler state is kept as ``aux_rank<r>``, JSON text (see
:mod:`~lengthwise.train.checkpoint.state`). Without a process group it runs in
one process (``no_dist``). Loading runs nothing from the folder.

``torch.distributed.checkpoint`` keeps its index, ``.metadata``, as a pickle, and
loads the non-tensor values of a state dict (the optimizer's hyper-parameters, our
JSON training state) with ``torch.load``. Here the index is first read by an
unpickler that builds only the checkpoint index's own classes (and ``torch.Size``,
dtypes, paths): anything else is refused before torch reads the file; the values
are read with ``torch.load(weights_only=True)``. Tensor files are read by torch with
``weights_only=True`` (the default from torch 2.6, which :func:`check_torch` asks for).

Example::

    >>> import tempfile
    >>> from lengthwise.train.checkpoint.state import TrainingState
    >>> tmp = Path(tempfile.mkdtemp()) / "step_1.tmp"
    >>> future = save_dcp(TrainingState(1, torch.nn.Linear(1, 1)), tmp, None, None,
    ...                   finish=lambda manifest: tmp, failed=print)
    >>> future.result() == tmp and any(tmp.iterdir())
    True
    >>> import pickle
    >>> check_metadata(pickle.dumps(torch.Size([2, 3])), Path(".metadata"))
    >>> try:
    ...     check_metadata(pickle.dumps(print), Path(".metadata"))
    ... except CorruptCheckpointError as exc:
    ...     print(str(exc).split(": ", 1)[1][:40])
    refuses builtins.print (the index of a d
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element

from lengthwise.pytorch.dist import GroupInfo, group_info
from lengthwise.train.checkpoint.folder import CheckpointError, CorruptCheckpointError, new_manifest
from lengthwise.train.checkpoint.state import TrainingState, from_json

__all__ = ["SafeLoadPlanner", "SafeReader", "check_metadata", "check_torch"]


_INDEX_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo", "_StoragePrefix"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _IndexUnpickler(pickle.Unpickler):
    """Builds the classes of a checkpoint index and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _INDEX_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None),
                                            torch.dtype | torch.layout | torch.memory_format):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refuses {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses a persistent id")


def check_metadata(data: bytes, path: Path) -> None:
    """Raise :class:`CorruptCheckpointError` unless ``data`` (a ``.metadata``) is a plain index.

    Only the index's own classes are built, so nothing the file names is run.
    """
    try:
        _IndexUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise CorruptCheckpointError(
            f"{path}: {exc} (the index of a distributed checkpoint holds only its own classes;"
            " the file is refused, not loaded)") from None
    except Exception as exc:  # a damaged pickle raises anything from EOFError to TypeError
        raise CorruptCheckpointError(
            f"{path} cannot be read as a checkpoint index: {type(exc).__name__}: {exc}") from None


def check_torch() -> None:
    """Refuse torch versions whose distributed checkpoint reader unpickles its tensor files."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 6):
        raise CheckpointError(
            f"reading a distributed checkpoint needs torch 2.6 or newer (torch "
            f"{torch.__version__} reads its tensor files with pickle): pip install -U torch")


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` whose index is checked by :func:`check_metadata` before it is read."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        get_path = getattr(self, "_get_metadata_path", None)
        path = Path(get_path(kwargs.get("rank")) if get_path is not None
                    else Path(self.path) / ".metadata")
        check_metadata(path.read_bytes(), path)
        return super().read_metadata(*args, **kwargs)


class SafeLoadPlanner(DefaultLoadPlanner):
    """A ``DefaultLoadPlanner`` that reads non-tensor values with ``weights_only=True``.

    ``refused`` names a value that held anything else (then the load fails).
    """

    refused: str | None = None

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            self.refused = fqn
            raise
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


_NO_DIST_NOTICE = "torch.distributed is disabled, unavailable or uninitialized, assuming"


def _target(path: Path, info: GroupInfo | None, process_group: Any) -> dict[str, Any]:
    """The ``checkpoint_id`` and either ``no_dist`` or the ``process_group`` of a dcp call."""
    if info is None:
        return {"checkpoint_id": str(path), "no_dist": True}
    return {"checkpoint_id": str(path), "process_group": process_group}


def save_dcp(state: TrainingState, tmp: Path, info: GroupInfo | None,
             checkpoint_group: Callable[[GroupInfo], Any] | None,
             finish: Callable[[dict[str, Any]], Path],
             failed: Callable[[BaseException], None]) -> Future:
    """Start ``async_save`` of ``state`` into ``tmp``; return a future of ``finish(manifest)``.

    ``checkpoint_group(info)`` gives the group for the save's collectives (asked only
    under ``torch.distributed``). A failure calls ``failed(exc)``.
    """
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    rank = info.rank if info is not None else 0
    world_size = info.world_size if info is not None else 1
    optimizer = state.optimizer
    # an optimizer without state (before its first step) would be stepped by
    # get_optimizer_state_dict to create one; keep only its hyper-parameters then
    has_opt_state = optimizer is not None and bool(optimizer.state)
    data: dict[str, Any] = {"model": get_model_state_dict(state.model)}
    if has_opt_state:
        data["optimizer"] = get_optimizer_state_dict(state.model, optimizer)
    data[f"aux_rank{rank}"] = state.aux(
        param_groups_only=optimizer is not None and not has_opt_state)
    manifest = new_manifest(state.step, "dcp", world_size, has_opt_state, state.contents())
    if rank == 0:
        tmp.parent.mkdir(parents=True, exist_ok=True)
    kwargs = _target(tmp, info, None if info is None else checkpoint_group(info))
    outer: Future = Future()

    def on_written(inner: Future) -> None:
        try:
            inner.result()
            outer.set_result(finish(manifest))
        except BaseException as exc:
            failed(exc)
            outer.set_exception(exc)

    if info is None:
        # single process on purpose; the notice is raised from the writer thread,
        # where a local catch_warnings cannot reach it
        warnings.filterwarnings("ignore", message=_NO_DIST_NOTICE, category=UserWarning)
    try:
        inner = dcp.async_save(data, **kwargs)
    except BaseException as exc:
        failed(exc)
        raise
    upload = getattr(inner, "upload_completion", inner)
    upload.add_done_callback(on_written)
    return outer


def load_dcp(path: Path, manifest: dict[str, Any], model: torch.nn.Module, optimizer: Any,
             strict: bool, process_group: Any) -> dict[str, Any]:
    """Load the model (and optimizer) from ``path``; return this rank's aux state (from JSON).

    A rank the checkpoint has no state for (saved by fewer ranks) takes rank 0's, with a
    warning. An optimizer saved before its first step gets its hyper-parameters back.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    check_torch()
    index = path / ".metadata"
    try:
        check_metadata(index.read_bytes(), index)
    except OSError as exc:
        raise CorruptCheckpointError(f"{index} cannot be read: {exc}") from exc
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
    state: dict[str, Any] = {"model": get_model_state_dict(model), aux_key: ""}
    load_optimizer_state = optimizer is not None and manifest.get("has_optimizer_state", False)
    if load_optimizer_state:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    planner = SafeLoadPlanner()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NO_DIST_NOTICE, category=UserWarning)
            dcp.load(state, storage_reader=SafeReader(path), planner=planner,
                     **_target(path, info, process_group))
    except BaseException as exc:  # dcp wraps readers' errors in a BaseException subclass
        if isinstance(exc, CheckpointError | KeyboardInterrupt | SystemExit):
            raise
        if planner.refused is not None:
            raise CorruptCheckpointError(
                f"{path}: the value {planner.refused} holds objects other than tensors and "
                "plain data; it is refused, not loaded (loading such objects can run code)"
            ) from None
        if "files" in manifest:  # the files passed their checksums: the objects do not fit
            raise CheckpointError(
                f"{path} (its files are intact) could not be loaded into the given model or "
                f"optimizer: {type(exc).__name__}: {exc}"
            ) from exc
        raise CorruptCheckpointError(
            f"{path} cannot be read as a distributed checkpoint (a damaged file, or a model "
            f"that does not match it): {type(exc).__name__}: {exc}"
        ) from exc
    try:
        if not isinstance(state[aux_key], str):
            raise TypeError(f"it is a {type(state[aux_key]).__name__}, not JSON text")
        aux = from_json(state[aux_key])
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise CorruptCheckpointError(
            f"{path}: the training state {aux_key} cannot be read: {type(exc).__name__}: {exc}"
        ) from exc
    options = StateDictOptions(strict=strict)
    set_model_state_dict(model, state["model"], options=options)
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
