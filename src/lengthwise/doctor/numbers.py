"""Numbers as the report writes them: integral floats as ints, NaN/inf as null.

Example::

    >>> num(3.0), num(2.5), num(None)
    (3, 2.5, None)
    >>> json_ready({"a": float("nan"), "b": [1.0, float("inf")]})
    {'a': None, 'b': [1.0, None]}
    >>> fmt_num(0.123456), fmt_num(2.0, 3), fmt_num(None)
    ('0.1235', '2', '-')
    >>> significant(0.000123456), significant(None)
    (0.0001235, None)
    >>> with_error(46.6162, 0.0731), with_error(50.0, None)
    ('46.62 +/- 0.07', '50')
    >>> counted(1, "evaluation"), counted(3, "evaluation")
    ('1 evaluation', '3 evaluations')
"""

from __future__ import annotations

from typing import Any

import numpy as np


def num(x: float | None, digits: int | None = None) -> int | float | None:
    """``x`` as an int when integral, else a float (rounded to ``digits``); None stays None."""
    if x is None:
        return None
    x = float(x)
    if not np.isfinite(x):
        return None
    if digits is not None:
        x = round(x, digits)
    return int(x) if x.is_integer() else x


def significant(x: float | None, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits (how p-values are reported); None stays None."""
    return None if x is None else float(f"{x:.{digits}g}")


def fmt_num(x: float | None, digits: int = 4) -> str:
    """``x`` as text with ``digits`` significant digits (``g`` format); None is ``-``."""
    if x is None:
        return "-"
    return f"{x:.{digits}g}"


def with_error(x: float, error: float | None) -> str:
    """``x +/- error`` with ``x`` to the decimal of the error's first digit.

    ``x`` alone when there is no error or ``x`` is a whole number; an error of 1
    or more shows as a whole number.
    """
    if error is None or not np.isfinite(error) or error <= 0 or float(x).is_integer():
        return fmt_num(x, 6)
    decimals = max(0, -int(np.floor(np.log10(error))))
    return f"{x:.{decimals}f} +/- {error:.{decimals}f}" if decimals else (
        f"{x:.0f} +/- {max(1, round(error)):.0f}")


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def json_ready(obj: Any) -> Any:
    """Replace NaN/inf floats by None and numpy scalars by Python numbers, recursively."""
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj
