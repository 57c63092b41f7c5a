"""Checks of the collators' constructor arguments, with clear errors.

Example::

    >>> check_fields(["input_ids", "attention_mask", "labels"])
    ('input_ids', 'labels')
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.pytorch.collate.budget import Budget

_LAYOUT_WORDS = {"pad": ("padded", "packed"), "pack": ("packed", "padded")}


def check_positive(name: str, value: int | None, *, allow_none: bool = True) -> None:
    """Raise ``ValueError`` unless ``value`` is a positive integer (or ``None``, if allowed).

    Example::

        >>> check_positive("max_length", None)
    """
    if value is None and allow_none:
        return
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def check_token_id(name: str, value: int | None, *, allow_none: bool = False,
                   minimum: int | None = 0) -> int | None:
    """``value`` as an int: an integer (not a bool) of at least ``minimum``, else an error.

    Token ids (``pad_token_id``) are >= 0: an embedding has no row -1. Label fill
    values (``label_pad_id``, usually -100) pass ``minimum=None``.

    Example::

        >>> check_token_id("pad_token_id", 0), check_token_id("label_pad_id", -100, minimum=None)
        (0, -100)
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value} (an embedding has no row "
                          f"{value})")
    return int(value)


def check_fields(fields: Sequence[str]) -> tuple[str, ...]:
    """The fields to collate: must hold ``input_ids``; ``attention_mask`` is dropped.

    Example::

        >>> check_fields("input_ids")
        ('input_ids',)
    """
    if isinstance(fields, str):
        fields = (fields,)
    fields = tuple(fields)
    if "input_ids" not in fields:
        raise ConfigError(f"fields must include 'input_ids', got {fields}")
    if len(set(fields)) != len(fields):
        raise ConfigError(f"fields has duplicates: {fields}")
    # the attention mask is always built from the lengths
    return tuple(f for f in fields if f != "attention_mask")


def check_edges(edges: Sequence[int] | None) -> list[int] | None:
    """Bucket edges as a list of positive, strictly increasing ints (``None`` stays ``None``).

    Example::

        >>> check_edges((4, 16))
        [4, 16]
    """
    if edges is None:
        return None
    out = [int(e) for e in edges]
    if not out or any(e != orig for e, orig in zip(out, edges, strict=True)):
        raise ConfigError(f"edges must be a non-empty list of integer upper edges, got {edges!r}")
    if any(b <= a for a, b in zip(out, out[1:], strict=False)) or out[0] < 1:
        raise ConfigError(f"edges must be positive and strictly increasing, got {out}")
    return out


def check_budget(budget: Budget | None, layout: str, collator: str) -> Budget | None:
    """``budget`` (or ``None``), checked to be a :class:`Budget` of ``layout``.

    Example::

        >>> check_budget(Budget(max_tokens=8, rows=2, layout="pack"), "pack", "PackCollator").rows
        2
    """
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be a lengthwise.pytorch.collate.Budget, got {budget!r}")
    if budget is not None and budget.layout != layout:
        want, got = _LAYOUT_WORDS[layout]
        raise ConfigError(f"{collator} needs a budget of the {want} layout, got a {got} one")
    return budget
