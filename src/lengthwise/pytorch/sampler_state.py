"""A saved :class:`~lengthwise.pytorch.sampler.BucketBatchSampler` state, read and checked.

Every key of a state is checked for its type, range and consistency before a
sampler resumes from it; a bad one raises :class:`ResumeError` naming the key. The
windowed keys are checked by the same code
(:func:`lengthwise.planning.state_checks.window_place`).

Example::

    >>> read_state({"version": 2, "seed": 0, "epoch": 2, "yielded": -3})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lengthwise.pytorch.sampler_state.ResumeError: not a BucketBatchSampler state (what \
state_dict() saves): it has ['epoch', 'seed', 'version', 'yielded'], missing [...]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from lengthwise.planning import state_checks as checks
from lengthwise.planning.state_checks import WINDOW_KEYS, StateError, WindowPlace

T = TypeVar("T")

__all__ = ["STATE_KEYS", "STATE_VERSION", "ResumeError", "SavedState", "read_state"]

#: version of the :meth:`BucketBatchSampler.state_dict` layout (2: ``options`` names every
#: option, ``balance`` included, and ``lengths_crc`` reads every length)
STATE_VERSION = 2

STATE_KEYS = ("version", "seed", "epoch", "yielded", "world_size", "grad_accum",
              "fingerprint", "num_samples", "lengths_crc", "resumed", "options")


class ResumeError(StateError):
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
    #: a windowed sampler's place in its window (``None`` in a whole-epoch state)
    window: WindowPlace | None = None


def count(name: str, value: Any, minimum: int = 0, below: int | None = None) -> int:
    """A whole number of a state, at least ``minimum`` (and below ``below``), else ResumeError.

    Example::

        >>> count("yielded", 3)
        3
    """
    return _checked(checks.count, name, value, minimum, below)


def _checked(check: Callable[..., T], *args: Any) -> T:
    """``check(*args)``, its :class:`StateError` raised as a :class:`ResumeError`."""
    try:
        return check(*args)
    except ResumeError:
        raise
    except StateError as exc:
        raise ResumeError(str(exc)) from None


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

        >>> s = read_state({"version": 2, "seed": 0, "epoch": 2, "yielded": 5, "world_size": 2,
        ...                 "grad_accum": 1, "fingerprint": 7, "num_samples": 10,
        ...                 "lengths_crc": 9, "resumed": [], "options": {}})
        >>> s.epoch, s.yielded
        (2, 5)
    """
    if not isinstance(state, Mapping):
        raise ResumeError(f"a sampler state is a dict, got {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        has = sorted(map(str, state))
        shown = repr(has) if len(repr(has)) <= 80 else repr(has)[:77] + "..."
        raise ResumeError(f"not a BucketBatchSampler state (what state_dict() saves): it has "
                          f"{shown}, missing {missing}")
    version = state["version"]
    if isinstance(version, int) and not isinstance(version, bool) and 0 < version < STATE_VERSION:
        raise ResumeError(f"sampler state version {version} is from an older lengthwise, which "
                          f"this version does not read (it reads version {STATE_VERSION}); "
                          "start the epoch over with set_epoch()")
    if isinstance(version, bool) or version != STATE_VERSION:
        raise ResumeError(f"sampler state version {version!r} is not supported "
                          f"(this version reads {STATE_VERSION})")
    window = None
    if any(k in state for k in WINDOW_KEYS):
        window = _checked(checks.window_place, state)
    return SavedState(
        seed=count("seed", state["seed"]), epoch=count("epoch", state["epoch"]),
        yielded=count("yielded", state["yielded"]),
        world_size=count("world_size", state["world_size"], 1),
        grad_accum=count("grad_accum", state["grad_accum"], 1),
        fingerprint=count("fingerprint", state["fingerprint"], 0, 2**32),
        num_samples=count("num_samples", state["num_samples"], 1),
        lengths_crc=count("lengths_crc", state["lengths_crc"], 0, 2**32),
        resumed=_checked(checks.segments, "resumed", state["resumed"]),
        options=_options(state["options"]), window=window)
