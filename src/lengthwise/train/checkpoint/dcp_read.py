"""Reading a ``torch.distributed.checkpoint`` folder without running code from it.

``torch.distributed.checkpoint`` keeps its index, ``.metadata``, as a pickle, and
loads the non-tensor values of a state dict (the optimizer's hyper-parameters, our
JSON training state) with ``torch.load``. Here the index is first read by an
unpickler that builds only the checkpoint index's own classes (and ``torch.Size``,
dtypes, paths): anything else is refused before torch reads the file; the values
are read with ``torch.load(weights_only=True)``. Tensor files are read by torch with
``weights_only=True`` (the default from torch 2.6, which :func:`check_torch` asks for).

Example::

    >>> import io, pickle, torch
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
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

from lengthwise.train.checkpoint.errors import CheckpointError, CorruptCheckpointError

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
    """Refuse torch versions whose distributed checkpoint reader unpickles its tensor files.

    Example::

        >>> check_torch()  # torch 2.6 or newer
    """
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


class _SafeBytes:
    """``load_bytes`` with ``weights_only=True``; ``refused`` names a value that held more."""

    refused: str | None = None

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            self.refused = fqn
            raise
        if self.flatten_state_dict:  # type: ignore[attr-defined]
            set_element(self.original_state_dict,  # type: ignore[attr-defined]
                        self.mappings[fqn], obj)  # type: ignore[attr-defined]
        else:
            self.state_dict[fqn] = obj  # type: ignore[attr-defined]


class SafeLoadPlanner(_SafeBytes, DefaultLoadPlanner):
    """A ``DefaultLoadPlanner`` that reads non-tensor values with ``weights_only=True``.

    ``refused`` names a value that held anything else (then the load fails).
    """
