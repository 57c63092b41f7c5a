"""The numbers of a saved place in an epoch, checked: counts, resumed segments, a window's place.

One set of checks serves the whole-epoch sampler state and the windowed one, so
both refuse the same bad values with an error naming the key.

Example::

    >>> segments("window_resumed", [[2, 1, -3]])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lengthwise.planning.state_checks.StateError: invalid sampler state: window_resumed[0] ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError

__all__ = ["WINDOW_KEYS", "StateError", "WindowPlace", "count", "segments", "window_place"]

#: the keys a windowed sampler adds to its state
WINDOW_KEYS = ("window_index", "window_yielded", "window_resumed")


class StateError(ConfigError):
    """A saved place (sampler or cursor state) with a value that cannot be a place."""


def count(name: str, value: Any, minimum: int = 0, below: int | None = None) -> int:
    """A whole number of a state, at least ``minimum`` (and below ``below``), else StateError.

    Example::

        >>> count("yielded", 3)
        3
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise StateError(f"invalid sampler state: {name} must be a whole number, "
                         f"got {value!r}")
    if value < minimum or (below is not None and value >= below):
        bounds = f">= {minimum}" if below is None else f"in [{minimum}, {below})"
        raise StateError(f"invalid sampler state: {name} must be {bounds}, got {value}")
    return int(value)


def segments(name: str, value: Any) -> tuple[tuple[int, int, int], ...]:
    """Earlier ``[world_size, grad_accum, yielded]`` segments: ranks and accumulation >= 1.

    Example::

        >>> segments("resumed", [[4, 1, 20]])
        ((4, 1, 20),)
    """
    if not isinstance(value, (list, tuple)):
        raise StateError(f"invalid sampler state: {name} must be a list of [world_size, "
                         f"grad_accum, yielded] triples, got {value!r}")
    out = []
    for i, seg in enumerate(value):
        if not isinstance(seg, (list, tuple)) or len(seg) != 3:
            raise StateError(f"invalid sampler state: {name}[{i}] must be a [world_size, "
                             f"grad_accum, yielded] triple, got {seg!r}")
        out.append((count(f"{name}[{i}] world_size", seg[0], 1),
                    count(f"{name}[{i}] grad_accum", seg[1], 1),
                    count(f"{name}[{i}] yielded", seg[2], 0)))
    return tuple(out)


@dataclass(frozen=True)
class WindowPlace:
    """A rank's checked place in a windowed epoch."""

    window_index: int
    window_yielded: int
    window_resumed: tuple[tuple[int, int, int], ...]
    yielded: int


def window_place(state: Any) -> WindowPlace:
    """The window keys of a state (and its ``yielded``), each checked.

    Example::

        >>> window_place({"window_index": 1, "window_yielded": 2, "window_resumed": [],
        ...               "yielded": 9}).window_yielded
        2
    """
    if not isinstance(state, Mapping):
        raise StateError(f"a sampler state is a dict, got {type(state).__name__}")
    missing = [k for k in (*WINDOW_KEYS, "yielded") if k not in state]
    if missing:
        raise StateError(f"not a windowed sampler state: missing {missing}")
    place = WindowPlace(window_index=count("window_index", state["window_index"]),
                        window_yielded=count("window_yielded", state["window_yielded"]),
                        window_resumed=segments("window_resumed", state["window_resumed"]),
                        yielded=count("yielded", state["yielded"]))
    if place.window_yielded > place.yielded:
        raise StateError(f"invalid sampler state: window_yielded={place.window_yielded} is more "
                         f"than the epoch's yielded={place.yielded}")
    return place
