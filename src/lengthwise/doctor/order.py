"""The batch order a run already uses, read from its log, so the doctor never prescribes it.

A :class:`~lengthwise.train.TrainLoop` log starts with a ``plan`` event naming
its order (``{"event": "plan", "order": "stratified", "layout": "pad"}``); any
log can carry one. Without it the order is unknown (``None``) and the doctor
prescribes as before.

Example::

    >>> logged_order([{"event": "plan", "order": "stratified"}, {"step": 1, "loss": 2.0}])
    'stratified'
    >>> logged_order([{"step": 1, "loss": 2.0}]) is None
    True
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable
from typing import Any

__all__ = ["PLAN_EVENT", "logged_order", "logged_plan", "logged_view"]

#: the event that names a log's batch order
PLAN_EVENT = "plan"
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
