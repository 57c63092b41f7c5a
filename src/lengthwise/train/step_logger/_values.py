"""Logged values (floats, ints, NumPy scalars, torch scalars) read into plain numbers.

Nothing here imports torch: tensors are recognised by their ``detach`` and ``item``.

Example::

    >>> to_float(np.float32(0.5), "lr"), to_count(3.0, "samples"), to_bucket(np.int64(2))
    (0.5, 3, 2)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError


def is_tensor(x: Any) -> bool:
    """Whether ``x`` looks like a torch tensor.

    Example::

        >>> is_tensor(1.0)
        False
    """
    return hasattr(x, "detach") and hasattr(x, "item")


def to_float(x: Any, name: str) -> float | None:
    """A real scalar (number, 1-element array or tensor) as a float; ``None`` stays ``None``.

    Example::

        >>> to_float(np.array([2]), "loss")
        2.0
    """
    if x is None:
        return None
    if is_tensor(x):
        x = x.detach()
        if x.numel() != 1:
            raise ConfigError(f"{name} must be a scalar, got a tensor of shape {tuple(x.shape)}")
        return float(x.item())
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise ConfigError(f"{name} must be a scalar, got an array of shape {x.shape}")
        return float(x.reshape(()))
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def to_count(x: Any, name: str) -> int | None:
    """A non-negative whole number as an int; ``None`` stays ``None``.

    Example::

        >>> to_count(np.int32(7), "real_tokens"), to_count(2**53 + 1, "step")
        (7, 9007199254740993)
    """
    exact = _integral(x)
    if exact is not None:  # integers stay exact, also above 2**53
        if exact < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {x!r}")
        return exact
    value = to_float(x, name)
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ConfigError(f"{name} must be a non-negative integer, got {x!r}")
    return int(value)


def _integral(x: Any) -> int | None:
    """``x`` as an exact int if it is an integer scalar (int, NumPy, torch), else ``None``."""
    if is_tensor(x):
        if x.numel() != 1 or x.dtype.is_floating_point or x.dtype.is_complex:
            return None
        x = x.detach().reshape(()).item()
    elif isinstance(x, np.ndarray):
        if x.size != 1 or x.dtype.kind not in "iu":
            return None
        x = x.reshape(()).item()
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        return None
    return int(x)


def to_bucket(x: Any) -> int | None:
    """A bucket id as a non-negative int; ``None`` stays ``None``.

    Example::

        >>> to_bucket(None), to_bucket(np.array([4]))
        (None, 4)
    """
    if x is None:
        return None
    if (is_tensor(x) and x.numel() == 1) or (isinstance(x, np.ndarray) and x.size == 1):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or int(x) < 0:
        raise ConfigError(f"bucket must be a non-negative integer or None, got {x!r}")
    return int(x)


def is_column(value: Any) -> bool:
    """Whether ``value`` holds one entry per micro-batch (a 1-D sequence, array or tensor).

    Example::

        >>> is_column([1, 2]), is_column(3), is_column("ab")
        (True, False, False)
    """
    if isinstance(value, np.ndarray) or is_tensor(value):
        return value.ndim == 1
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def read_losses(raw: list[Any]) -> list[float | None]:
    """Turn recorded losses into floats, reading all tensors with one device transfer.

    Example::

        >>> read_losses([1.0, None])
        [1.0, None]
    """
    tensors = [x for x in raw if is_tensor(x)]
    if not tensors:
        return list(raw)
    import torch

    try:
        values = iter(torch.stack([t.reshape(()).float() for t in tensors]).cpu().tolist())
    except RuntimeError:  # tensors on different devices
        values = iter([float(t.item()) for t in tensors])
    return [next(values) if is_tensor(x) else x for x in raw]
