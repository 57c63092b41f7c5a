"""Lengths made ready for a planner: validated, over-long samples handled, ids chosen.

Example::

    >>> from lengthwise.planning.config import PlanConfig
    >>> lens, ids, counts = prepare_lengths([4, 0, 9], PlanConfig(batch_size=2, max_len=8))
    >>> lens.tolist(), ids.tolist(), counts["truncated"], counts["dropped_empty"]
    ([4, 0, 8], [0, 2], 1, 1)
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np

from lengthwise.errors import ConfigError, DataError
from lengthwise.planning.batching import index_dtype
from lengthwise.planning.config import PlanConfig
from lengthwise.planning.errors import MAX_PLANNED_TOKENS, LengthError
from lengthwise.planning.lengths import (
    apply_overflow,
    load_lengths,
    load_record,
    validate_lengths,
)

#: a plan that cuts more than this share of the tokens warns
CUT_WARNING_SHARE = 0.01

__all__ = ["every_sample", "overflow_error", "prepare_lengths"]


def every_sample(ids: np.ndarray, size: int, indices: np.ndarray | None) -> bool:
    """Whether the planned ``ids`` (of :func:`prepare_lengths` given ``indices``) are every
    sample of ``size`` in order, ``ids[i] == i``: arrays indexed by position are then
    indexed by sample id.

    Example::

        >>> every_sample(np.arange(3), 3, None), every_sample(np.array([2, 1, 0]), 3, [2, 1, 0])
        (True, False)
    """
    return ids.size == size and (indices is None or np.array_equal(ids, np.arange(ids.size)))


def prepare_lengths(lengths, config: PlanConfig, indices: np.ndarray | None = None, *,
                    cap_to_budget: bool = True,
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Validate lengths, apply the overflow policy; return (lengths, planned ids, counts).

    With ``cap_to_budget`` a sample longer than one row of the budget follows
    ``on_overflow`` like one over ``max_len``; the packed layout turns it off to
    split such samples itself (``on_overflow="split"`` truncates only at ``max_len``).
    """
    raw = lengths if isinstance(lengths, np.ndarray) else load_lengths(lengths)
    cut = load_record(raw)  # what load_lengths(max_len=...) cut: counted as truncated too
    raw = validate_lengths(raw)
    max_len = config.sample_limit() if cap_to_budget else config.max_len
    limit_name = (f"the {max_len} tokens one row of the budget holds"
                  if max_len is not None and max_len != config.max_len else None)
    policy = "truncate" if config.on_overflow == "split" else config.on_overflow
    lens, keep, counts = apply_overflow(raw, max_len, policy, limit_name=limit_name, cut=cut)
    check_token_total(lens, max_len, config.pad_multiple)
    warn_if_cut(counts, max_len, config, raw, cut)
    if indices is not None:
        ids = check_indices(indices, raw.size)
        ids = ids[keep[ids]]
    elif counts["dropped_empty"] + counts["dropped_overflow"] == 0:
        ids = np.arange(raw.size, dtype=index_dtype(raw.size))  # every sample kept
    else:
        ids = np.flatnonzero(keep)
    ids = ids.astype(index_dtype(raw.size), copy=False)
    if ids.size == 0:
        raise DataError("no samples left to plan after dropping empty and over-long ones "
                        f"({counts})")
    return lens, ids, counts


def check_token_total(lengths: np.ndarray, limit: int | None, pad_multiple: int = 1) -> None:
    """Raise unless the samples times their longest padded length stay below
    :data:`~lengthwise.planning.errors.MAX_PLANNED_TOKENS`, so that no token sum of a plan
    overflows int64. ``limit`` (the longest a sample is planned at, when known) spares the
    pass over the lengths that finds the longest.

    Example::

        >>> check_token_total(np.array([2**61] * 8), None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lengthwise.planning.errors.LengthError: lengths: 8 samples of up to 2305843009213693952 ...
    """
    n = max(int(lengths.size), 1)
    step = max(int(pad_multiple), 1)  # Python integers: rounded up without wrapping

    def fits(length: int) -> bool:
        return -(-length // step) * step * n < MAX_PLANNED_TOKENS

    if limit is not None and fits(int(limit)):
        return
    top = int(lengths.max()) if lengths.size else 0
    if fits(top):
        return
    raise LengthError(
        f"lengths: {n} samples of up to {top} tokens (row {int(np.argmax(lengths))}) could "
        "pad to 2**62 tokens or more, past what a plan sums exactly as int64; samples x the "
        "longest length must stay below 2**62: set max_len or a token budget, or plan fewer "
        "samples")


def overflow_error(config: PlanConfig, row: int, length: int, longer: int) -> LengthError:
    """The error of ``on_overflow="error"``: sample ``row`` (of ``longer`` such) is too long.

    Example::

        >>> err = overflow_error(PlanConfig(max_tokens=8, on_overflow="error"), 3, 9, 1)
        >>> print(err)  # doctest: +ELLIPSIS
        sample 3 has 9 tokens, but one row holds at most 8 under max_tokens=8 (1 samples ...
    """
    limit = config.sample_limit()
    if limit == config.max_len:
        rule = f"max_len={config.max_len}"
    else:
        rule = (f"max_tokens={config.max_tokens}" if config.max_tokens is not None
                else f"max_cost={config.max_cost} with {config.cost}")
    return LengthError(
        f"sample {row} has {length} tokens, but one row holds at most {limit} under {rule} "
        f"({longer} samples are longer); raise the budget, or use on_overflow='truncate' or "
        "'drop'")


def cut_message(counts: dict, max_len: int | None, config: PlanConfig, *,
                at_load: bool = False, cut_now: int | None = None,
                load_limit: int | None = None) -> str | None:
    """One line saying how much truncation cut, when it is over 1% of the tokens.

    ``at_load``: some of it was cut by ``load_lengths(max_len=...)`` (to
    ``load_limit`` tokens, when known); ``cut_now``: how many samples the plan's
    own limit cut (``None``: unknown), so a limit that cut nothing is not named.

    Example::

        >>> cut_message({"truncated": 2, "truncated_share": 0.75}, 8, PlanConfig(max_tokens=8))
        '75.0% of the tokens are cut: 2 samples truncated to 8 tokens (max_tokens=8)'
        >>> cut_message({"truncated": 2, "truncated_share": 0.75}, 16, PlanConfig(max_tokens=16),
        ...             at_load=True, cut_now=0, load_limit=8)
        ... # doctest: +ELLIPSIS
        '75.0% of the tokens are cut: 2 samples truncated to 8 tokens (the max_len given to ...)'
    """
    if not _cuts_enough_to_say(counts):
        return None
    share = counts["truncated_share"]
    if config.max_len is not None and max_len == config.max_len:
        why = f"max_len={config.max_len}"
    elif config.max_tokens is not None:
        why = f"max_tokens={config.max_tokens}"
    else:
        why = f"max_cost={config.max_cost}"
    parts = [] if max_len is None or cut_now == 0 else [f"to {max_len} tokens ({why})"]
    if at_load:
        parts.append("at the max_len given to load_lengths" if load_limit is None else
                     f"to {load_limit} tokens (the max_len given to load_lengths)")
    return (f"{share:.1%} of the tokens are cut: {counts['truncated']} samples truncated "
            + " or ".join(parts))


def _cuts_enough_to_say(counts: dict) -> bool:
    """Whether truncation cut more than :data:`CUT_WARNING_SHARE` of the tokens."""
    return counts.get("truncated_share", 0.0) > CUT_WARNING_SHARE


def warn_if_cut(counts: dict, max_len: int | None, config: PlanConfig, raw: np.ndarray,
                cut: np.ndarray | None) -> None:
    """Warn (``UserWarning``, at the caller's line) when truncation cuts over 1% of the tokens.

    ``raw``: the lengths before the plan's limit; ``cut``: the tokens cut from each when
    they were loaded (``None``: none). Who cut what is counted only when there is a warning.
    """
    if not _cuts_enough_to_say(counts):
        return
    at_load = cut is not None and bool(cut.any())
    message = cut_message(counts, max_len, config, at_load=at_load,
                          cut_now=0 if max_len is None else int(np.count_nonzero(raw > max_len)),
                          load_limit=int(raw[cut > 0].max()) if at_load else None)
    if message is None:
        return
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message + "; raise the limit, or use on_overflow='drop' or 'error' to keep "
                  "whole samples only", UserWarning, stacklevel=level)


def check_indices(indices, size: int) -> np.ndarray:
    """Sample ids to plan: whole numbers in ``[0, size)``, each at most once.

    Example::

        >>> check_indices([3, 0], 5).tolist()
        [3, 0]
    """
    arr = np.asarray(indices)
    if arr.dtype == bool:
        raise TypeError("indices must be sample ids, got a boolean mask; pass "
                        "np.flatnonzero(mask) to plan the samples it marks")
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"indices must be sample ids (whole numbers), got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ConfigError(f"indices must be one-dimensional, got shape {arr.shape}")
    ids = arr.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= size):
        raise ConfigError(f"indices must lie in [0, {size}), got {ids.min()}..{ids.max()}")
    if np.unique(ids).size != ids.size:
        raise ConfigError("indices must not repeat a sample id")
    return ids
