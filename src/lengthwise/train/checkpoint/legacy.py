"""Converting checkpoints of the old format (versions 1 and 2) to the JSON one, once.

Old checkpoints kept the training state (step, extra, RNG, scheduler and sampler
states) as a Python pickle, which can run code when it is read, so lengthwise no
longer loads them (:class:`LegacyCheckpointError`). :func:`convert_legacy_checkpoint`
rewrites one, or every old one under a folder, in the current format. It reads the
old state with an unpickler that builds only what lengthwise wrote there (plain
containers, NumPy arrays and scalars, tensors): a file that names anything else is
refused and nothing in it runs. Still, it reads a format made for trusted files, so
it asks ``trust=True`` (``--trust-legacy-checkpoint`` on the command line): convert
only checkpoints you wrote.

Example::

    >>> import tempfile
    >>> try:
    ...     convert_legacy_checkpoint(tempfile.mkdtemp())
    ... except CheckpointError as exc:
    ...     print(str(exc).split("; ")[-1])
    pass trust=True (--trust-legacy-checkpoint) to convert checkpoints you wrote
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from lengthwise.errors import ConfigError
from lengthwise.train.checkpoint.atomic import publish, remove_tree
from lengthwise.train.checkpoint.errors import CheckpointError, CorruptCheckpointError
from lengthwise.train.checkpoint.integrity import verify_files
from lengthwise.train.checkpoint.layout import (
    MANIFEST,
    STEP_DIR,
    VERSION,
    is_legacy,
    read_manifest,
)
from lengthwise.train.checkpoint.state_json import to_json
from lengthwise.train.checkpoint.torch_backend import TORCH_FILE

__all__ = ["convert_legacy_checkpoint"]


def _storage_from_bytes(data: bytes) -> Any:
    """A storage an old state pickled (``torch.save`` bytes), read with ``weights_only=True``."""
    return torch.load(io.BytesIO(data), weights_only=True)


_NUMPY = {"scalar", "_reconstruct", "_frombuffer"}
_ALLOWED: dict[str, set[str]] = {
    "numpy": {"dtype", "ndarray"},
    "numpy.core.multiarray": _NUMPY, "numpy._core.multiarray": _NUMPY,
    "numpy.core.numeric": _NUMPY, "numpy._core.numeric": _NUMPY,
    "torch._utils": {"_rebuild_tensor_v2"},
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    "builtins": {"complex", "set", "frozenset", "bytearray"},
}


class _OldStateUnpickler(pickle.Unpickler):
    """Builds what an old checkpoint's training state holds, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.storage" and name == "_load_from_bytes":
            return _storage_from_bytes
        if module == "numpy.dtypes" and name.endswith("DType"):
            return super().find_class(module, name)
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"it names {module}.{name}, which a checkpoint's state cannot hold")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent id")


def _old_state(data: Any, where: Path) -> Any:
    if not isinstance(data, bytes | bytearray):
        raise CorruptCheckpointError(f"{where}: the old training state is a "
                                     f"{type(data).__name__}, not a pickle")
    try:
        return _OldStateUnpickler(io.BytesIO(bytes(data))).load()
    except Exception as exc:
        raise CheckpointError(f"{where}: the old training state cannot be converted: "
                              f"{exc}") from None


def _as_json(state: Any, where: Path) -> str:
    try:
        return to_json(state)
    except ConfigError as exc:
        raise CheckpointError(f"{where}: {exc}; convert it with the lengthwise version that "
                              "wrote it, after making that part plain data") from None


def _convert_torch(path: Path, tmp: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            state = torch.load(path / TORCH_FILE, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, OSError, EOFError, RuntimeError) as exc:
            raise CorruptCheckpointError(f"{path / TORCH_FILE} cannot be read as an old "
                                         f"checkpoint: {str(exc).splitlines()[0]}") from None
    if not isinstance(state, dict) or "aux_rank0" not in state:
        raise CorruptCheckpointError(f"{path / TORCH_FILE} holds no training state")
    state["aux_rank0"] = _as_json(_old_state(state["aux_rank0"], path / TORCH_FILE),
                                  path / TORCH_FILE)
    with open(tmp / TORCH_FILE, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _convert_dcp(path: Path, tmp: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from lengthwise.train.checkpoint.dcp_read import (
        SafeLoadPlanner,
        SafeReader,
        check_metadata,
        check_torch,
    )

    check_torch()
    check_metadata((path / ".metadata").read_bytes(), path / ".metadata")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            index = SafeReader(path).read_metadata()
            state: dict[str, Any] = {
                fqn: (torch.empty(meta.size, dtype=meta.properties.dtype)
                      if isinstance(meta, TensorStorageMetadata) else "")
                for fqn, meta in index.state_dict_metadata.items()}
            dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner(),
                     no_dist=True)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit | CheckpointError):
                raise
            raise CorruptCheckpointError(f"{path} cannot be read as an old distributed "
                                         f"checkpoint: {type(exc).__name__}: {exc}") from None
        for key in [k for k in state if k.startswith("aux_rank")]:
            state[key] = _as_json(_old_state(state[key], path / key), path / key)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp)), no_dist=True)


def _convert_one(path: Path, manifest: dict[str, Any]) -> None:
    if manifest.get("files") is not None:
        verify_files(path, manifest, skip=(MANIFEST,))
    backend = manifest.get("backend")
    if backend not in ("torch", "dcp"):
        raise CheckpointError(f"{path}: unknown checkpoint backend {backend!r}")
    tmp = path.with_name(f"{path.name}.convert-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        for child in path.iterdir():  # the files saved with it, e.g. a model's config
            if child.is_file() and not child.is_symlink() and child.name != MANIFEST and not (
                    child.name == TORCH_FILE or child.name == ".metadata"
                    or child.suffix == ".distcp"):
                shutil.copy2(child, tmp / child.name)
        (_convert_torch if backend == "torch" else _convert_dcp)(path, tmp)
        new = {k: v for k, v in manifest.items() if k != "files"}
        new["version"] = VERSION
        publish(tmp, path, new)
    except BaseException:
        remove_tree(tmp)
        raise


def convert_legacy_checkpoint(path: str | os.PathLike, *, trust: bool = False) -> list[Path]:
    """Rewrite old-format checkpoints (a ``step_N`` folder, or all under a folder) as JSON.

    Returns the folders converted (none if all are current). Refused unless ``trust``
    is true: convert only checkpoints you wrote. An old state holding objects other
    than plain data, NumPy arrays and tensors is refused naming them, and nothing in
    it runs; checksums, where the old manifest has them, are checked first.
    """
    if not trust:
        raise CheckpointError(
            f"{path}: an old checkpoint keeps its state as a pickle, a format meant for "
            "trusted files; pass trust=True (--trust-legacy-checkpoint) to convert "
            "checkpoints you wrote")
    root = Path(path)
    if (root / "checkpoints").is_dir() and read_manifest(root) is None:
        root = root / "checkpoints"
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint path {root} does not exist")
    manifest = read_manifest(root)
    if manifest is not None:
        folders = [(root, manifest)]
    else:
        folders = []
        for child in sorted(root.iterdir()):
            found = (read_manifest(child) if STEP_DIR.match(child.name) and not child.is_symlink()
                     else None)
            if found is not None:
                folders.append((child, found))
        if not folders:
            raise FileNotFoundError(f"{root} holds no checkpoint")
    done = []
    for folder, found in folders:
        if is_legacy(found):
            _convert_one(folder, found)
            done.append(folder)
    return done
