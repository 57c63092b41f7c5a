"""Run settings kept beside a log: the world size in a ``training_args``/config JSON file.

The mega-batch arithmetic needs the number of data-parallel processes. A log
rarely holds it, but launchers and trainers often save their arguments next
to it. The files looked at, in order, are the log itself when it is one JSON
document and, in the log's folder, ``training_args.json``, ``args.json``,
``config.json`` and ``run_config.json``; the keys are ``world_size``,
``num_processes``, ``n_gpu`` and ``num_gpus`` (top level, or under ``args``,
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
NESTED = ("args", "training_args", "config")
#: files larger than this are not read for settings
MAX_BYTES = 4 << 20


def _world(doc: Any) -> int | None:
    if not isinstance(doc, dict):
        return None
    for scope in (doc, *(doc.get(k) for k in NESTED)):
        if not isinstance(scope, dict):
            continue
        for key in WORLD_KEYS:
            value = scope.get(key)
            if isinstance(value, dict):  # W&B config.yaml style {"value": ...}
                value = value.get("value")
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
    return None


def _read(path: Path) -> Any:
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def world_size_beside(log: str | os.PathLike[str]) -> tuple[int | None, str | None]:
    """The world size recorded with the log at ``log`` and the file it came from."""
    path = Path(log)
    folder = path if path.is_dir() else path.parent
    found = [path] if path.suffix == ".json" else []
    found += [folder / name for name in CONFIG_FILES if folder / name != path]
    for f in found:
        w = _world(_read(f))
        if w is not None:
            return w, f.name
    return None, None
