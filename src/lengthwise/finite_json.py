"""Lines of standard JSON: a NaN or infinity, which JSON has no literal for, is written as null.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which ``jq``,
JavaScript and most JSON readers refuse. Every JSON-lines file lengthwise writes
(the step log and micro-batch log of :class:`~lengthwise.train.StepLogger`)
goes through :func:`finite_json_line`, and the JSON summaries the
commands print (``dflash train``, ``demo --json``) through :func:`finite_json_text`:
such a number becomes ``null``, and the record gets a ``non_finite`` field naming
each one with its value, so nothing is lost and the text stays JSON.

Example::

    >>> finite_json_line({"step": 3, "loss": float("nan")})
    '{"step": 3, "loss": null, "non_finite": {"loss": "nan"}}'
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

__all__ = ["NON_FINITE", "finite_json_line", "finite_json_text", "finite_record"]

#: the field that names the numbers written as ``null`` because they were not finite
NON_FINITE = "non_finite"


def finite_record(rec: dict[str, Any], default: Callable[[Any], Any] | None = None,
                  ) -> dict[str, Any]:
    """``rec`` as plain JSON data with every NaN or infinity replaced by ``None``.

    ``default`` turns other values into JSON data, as in :func:`json.dumps`. When a
    number was replaced, the record gets a ``non_finite`` field: ``{place: value}``,
    the place its field (``grad_norm``, ``acc[2]``, ``stats.loss``), the value
    ``"nan"``, ``"inf"`` or ``"-inf"``.

    Example::

        >>> finite_record({"loss": float("inf"), "acc": [0.5, float("nan")]})
        {'loss': None, 'acc': [0.5, None], 'non_finite': {'loss': 'inf', 'acc[1]': 'nan'}}
    """
    found: dict[str, str] = {}

    def clean(value: Any, place: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            found[place] = repr(value)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{place}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, f"{place}[{i}]") for i, v in enumerate(value)]
        return value

    plain = json.loads(json.dumps(rec, default=default))  # NumPy, tensors...: plain data
    out = {k: clean(v, k) for k, v in plain.items()}
    if found:
        out[NON_FINITE] = found
    return out


def finite_json_line(rec: dict[str, Any], default: Callable[[Any], Any] | None = None) -> str:
    """``rec`` as one line of standard JSON (see :func:`finite_record` for NaN and infinity).

    A value JSON cannot hold raises ``TypeError`` (as :func:`json.dumps` does).

    Example::

        >>> finite_json_line({"lr": 1e-3, "grad_norm": float("inf")})
        '{"lr": 0.001, "grad_norm": null, "non_finite": {"grad_norm": "inf"}}'
    """
    return finite_json_text(rec, default)


def finite_json_text(rec: dict[str, Any], default: Callable[[Any], Any] | None = None, *,
                     indent: int | None = None) -> str:
    """``rec`` as standard JSON text, indented as :func:`json.dumps` indents (``indent``).

    NaN and infinity are written as in :func:`finite_json_line`: ``null``, named in
    ``non_finite``. For summaries printed by a command.

    Example::

        >>> print(finite_json_text({"loss": float("nan")}, indent=1))
        {
         "loss": null,
         "non_finite": {
          "loss": "nan"
         }
        }
    """
    try:
        return json.dumps(rec, default=default, indent=indent, allow_nan=False)
    except ValueError:  # a NaN or infinity (a circular value fails again below)
        return json.dumps(finite_record(rec, default), indent=indent, allow_nan=False)
