"""Run settings recorded with a log: its ``plan`` event, and the world size and the
gradient-clipping norm in a ``training_args``/config JSON file beside it.

The batch order a run already uses is read from its log, so the doctor never
prescribes it: a :class:`~lengthwise.train.TrainLoop` log starts with a ``plan``
event naming its order (``{"event": "plan", "order": "stratified", "layout":
"pad"}``); any log can carry one. Without it the order is unknown (``None``).

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
    >>> logged_order([{"event": "plan", "order": "stratified"}, {"step": 1, "loss": 2.0}])
    'stratified'
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable
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


#: the event that names a log's batch order
PLAN_EVENT = "plan"
#: the ``view`` of a log whose lines are single micro-batches (its ``plan`` event)
MICRO_VIEW = "micro-batch"
#: lines read from the top of a log file for the plan event (it is written first)
HEAD_LINES = 64


def logged_order(source: Any) -> str | None:
    """The ``order`` of the first ``plan`` event in a JSONL log (a path or row dicts), or None."""
    order = logged_plan(source).get("order")
    return order if isinstance(order, str) and order else None


def logged_view(source: Any) -> str | None:
    """What each line of the log is, from its ``plan`` event's ``view``: ``"micro-batch"``
    when every line holds one micro-batch's loss (of one rank), else None (optimizer steps).

    Example::

        >>> logged_view([{"event": "plan", "order": "bucket-random", "view": "micro-batch"}])
        'micro-batch'
    """
    view = logged_plan(source).get("view")
    return view if isinstance(view, str) and view else None


def logged_plan(source: Any) -> dict[str, Any]:
    """The first ``plan`` event of a JSONL log (a path or row dicts); ``{}`` when none."""
    rows: Iterable[Any]
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.isfile(path) or not path.endswith((".jsonl", ".json", ".jsonl.gz")):
            return {}
        rows = _head(path)
    elif isinstance(source, list):
        rows = source[:HEAD_LINES]
    else:
        return {}
    for row in rows:
        if isinstance(row, dict) and row.get("event") == PLAN_EVENT:
            return row
    return {}


def _head(path: str) -> list[Any]:
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            for _, line in zip(range(HEAD_LINES), fh, strict=False):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        return []  # the log reader reports an unreadable file itself
    return out
