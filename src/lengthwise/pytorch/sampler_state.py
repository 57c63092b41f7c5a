"""A saved :class:`~lengthwise.pytorch.sampler.BucketBatchSampler` state, read and checked.

Every key of a state is checked for its type, range and consistency before a
sampler resumes from it; a bad one raises :class:`ResumeError` naming the key.

Example::

    >>> read_state({"version": 1, "seed": 0, "epoch": 2, "yielded": -3})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lengthwise.pytorch.sampler_state.ResumeError: not a BucketBatchSampler state: missing [...]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError

__all__ = ["STATE_KEYS", "STATE_VERSION", "ResumeError", "SavedState", "read_state"]

#: version of the :meth:`BucketBatchSampler.state_dict` layout
STATE_VERSION = 1

STATE_KEYS = ("version", "seed", "epoch", "yielded", "world_size", "grad_accum",
              "fingerprint", "num_samples", "lengths_crc", "resumed", "options")


class ResumeError(ConfigError):
    """A saved sampler state that does not fit this sampler (other data or settings)."""


@dataclass(frozen=True)
class SavedState:
    """The checked numbers of a sampler state."""

    seed: int
    epoch: int
    yielded: int
    world_size: int
    grad_accum: int
    fingerprint: int
    num_samples: int
    lengths_crc: int
    #: earlier ``(world_size, grad_accum, yielded)`` segments of the epoch
    resumed: tuple[tuple[int, int, int], ...]
    options: dict[str, str]


def count(name: str, value: Any, minimum: int = 0, below: int | None = None) -> int:
    """A whole number of a state, at least ``minimum`` (and below ``below``), else ResumeError.

    Example::

        >>> count("yielded", 3)
        3
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ResumeError(f"invalid sampler state: {name} must be a whole number, "
                          f"got {value!r}")
    if value < minimum or (below is not None and value >= below):
        bounds = f">= {minimum}" if below is None else f"in [{minimum}, {below})"
        raise ResumeError(f"invalid sampler state: {name} must be {bounds}, got {value}")
    return int(value)


def _segments(value: Any) -> tuple[tuple[int, int, int], ...]:
    if not isinstance(value, (list, tuple)):
        raise ResumeError("invalid sampler state: resumed must be a list of [world_size, "
                          f"grad_accum, yielded] triples, got {value!r}")
    out = []
    for i, seg in enumerate(value):
        if not isinstance(seg, (list, tuple)) or len(seg) != 3:
            raise ResumeError(f"invalid sampler state: resumed[{i}] must be a [world_size, "
                              f"grad_accum, yielded] triple, got {seg!r}")
        out.append((count(f"resumed[{i}] world_size", seg[0], 1),
                    count(f"resumed[{i}] grad_accum", seg[1], 1),
                    count(f"resumed[{i}] yielded", seg[2], 0)))
    return tuple(out)


def _options(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ResumeError("invalid sampler state: options must map option names to their "
                          f"saved text, got {shown}")
    return dict(value)


def read_state(state: Any) -> SavedState:
    """Check every key of a saved sampler state; raise :class:`ResumeError` naming a bad one.

    Example::

        >>> s = read_state({"version": 1, "seed": 0, "epoch": 2, "yielded": 5, "world_size": 2,
        ...                 "grad_accum": 1, "fingerprint": 7, "num_samples": 10,
        ...                 "lengths_crc": 9, "resumed": [], "options": {}})
        >>> s.epoch, s.yielded
        (2, 5)
    """
    if not isinstance(state, Mapping):
        raise ResumeError(f"a sampler state is a dict, got {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise ResumeError(f"not a BucketBatchSampler state: missing {missing}")
    version = state["version"]
    if isinstance(version, bool) or version != STATE_VERSION:
        raise ResumeError(f"sampler state version {version!r} is not supported "
                          f"(this version reads {STATE_VERSION})")
    return SavedState(
        seed=count("seed", state["seed"]), epoch=count("epoch", state["epoch"]),
        yielded=count("yielded", state["yielded"]),
        world_size=count("world_size", state["world_size"], 1),
        grad_accum=count("grad_accum", state["grad_accum"], 1),
        fingerprint=count("fingerprint", state["fingerprint"], 0, 2**32),
        num_samples=count("num_samples", state["num_samples"], 1),
        lengths_crc=count("lengths_crc", state["lengths_crc"], 0, 2**32),
        resumed=_segments(state["resumed"]), options=_options(state["options"]))
