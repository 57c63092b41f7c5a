"""Run settings kept beside a log: the world size and the gradient-clipping norm in a
``training_args``/config JSON file.

The mega-batch arithmetic needs the number of data-parallel processes. A log
rarely holds it, but launchers and trainers often save their arguments next
to it. The files looked at, in order, are the log itself when it is one JSON
document and, in the log's folder, ``training_args.json``, ``args.json``,
``config.json`` and ``run_config.json``; the keys are ``world_size``,
``num_processes``, ``n_gpu`` and ``num_gpus`` for the world size and
:data:`CLIP_KEYS` for the clipping norm (top level, or under ``args``,
``training_args`` or ``config``).

Example::

    >>> import json, tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "training_args.json").write_text(json.dumps({"world_size": 4}))
    >>> world_size_beside(d / "train.jsonl")
    (4, 'training_args.json')
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CONFIG_FILES = ("training_args.json", "args.json", "config.json", "run_config.json")
WORLD_KEYS = ("world_size", "num_processes", "n_gpu", "num_gpus")
#: keys of the gradient-clipping norm (Hugging Face ``max_grad_norm``, lengthwise's ``clip``)
CLIP_KEYS = ("max_grad_norm", "clip", "grad_clip", "clip_grad_norm", "gradient_clipping")
NESTED = ("args", "training_args", "config")
#: files larger than this are not read for settings
MAX_BYTES = 4 << 20


def _setting(doc: Any, keys: tuple[str, ...], whole: bool) -> float | None:
    """The first of ``keys`` that ``doc`` holds as a positive number (an int when ``whole``)."""
    if not isinstance(doc, dict):
        return None
    for scope in (doc, *(doc.get(k) for k in NESTED)):
        if not isinstance(scope, dict):
            continue
        for key in keys:
            value = scope.get(key)
            if isinstance(value, dict):  # W&B config.yaml style {"value": ...}
                value = value.get("value")
            kinds = int if whole else int | float
            if isinstance(value, kinds) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _read(path: Path) -> Any:
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def setting_beside(log: str | os.PathLike[str], keys: tuple[str, ...],
                   whole: bool = False) -> tuple[float | None, str | None]:
    """The first of ``keys`` recorded with the log at ``log`` and the file it came from."""
    path = Path(log)
    folder = path if path.is_dir() else path.parent
    found = [path] if path.suffix == ".json" else []
    found += [folder / name for name in CONFIG_FILES if folder / name != path]
    for f in found:
        value = _setting(_read(f), keys, whole)
        if value is not None:
            return value, f.name
    return None, None


def world_size_beside(log: str | os.PathLike[str]) -> tuple[int | None, str | None]:
    """The world size recorded with the log at ``log`` and the file it came from."""
    value, name = setting_beside(log, WORLD_KEYS, whole=True)
    return (None, None) if value is None else (int(value), name)


def settings_beside(log: str | os.PathLike[str],
                    keys: dict[str, tuple[str, ...]]) -> tuple[dict[str, float], str | None]:
    """Each of ``keys`` (a name and its aliases) recorded with the log, and the first file
    one came from."""
    found: dict[str, float] = {}
    source = None
    for name, aliases in keys.items():
        value, where = setting_beside(log, aliases)
        if value is not None:
            found[name] = float(value)
            source = source or where
    return found, source


def clip_beside(log: str | os.PathLike[str]) -> tuple[float | None, str | None]:
    """The gradient-clipping norm recorded with the log at ``log`` (``max_grad_norm``, ...)."""
    return setting_beside(log, CLIP_KEYS)
