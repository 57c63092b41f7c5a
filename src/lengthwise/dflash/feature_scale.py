"""A per-dimension scale of the target features before the draft's ``fc``, folded at export.

A target's hidden states can carry most of their squared norm in a few
dimensions (SmolLM2-135M: 40-52 % in 2-3 of 576). With ``standardize_features``
the draft multiplies its features by ``feature_scale``, one over the root mean
square of each dimension over the first training tokens
(:func:`feature_scale`), so every dimension reaches ``fc`` at about unit size.
The reference draft's ``fc`` has no bias, so the features are scaled, not
centred: ``fc(x * s) = (W * s) x`` folds into ``fc`` exactly
(:func:`folded_state`), and the served format stays the reference's.

Example::

    >>> import torch
    >>> rows = [torch.tensor([[3.0, 0.0], [-3.0, 2.0]])]
    >>> feature_scale(rows).tolist()
    [0.3333333432674408, 0.7071067690849304]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from lengthwise.errors import DataError

__all__ = ["SCALE", "feature_scale", "folded_state"]

#: the draft's buffer that holds the scale (absent from drafts without it)
SCALE = "feature_scale"


def feature_scale(rows: Iterable[torch.Tensor], *, floor: float = 1e-6) -> torch.Tensor:
    """One over the root mean square of each feature dimension over every row of ``rows``.

    ``rows``: tensors ``(tokens, F)`` of real (not padded) tokens' features; a
    dimension whose root mean square is below ``floor`` keeps the scale ``1 / floor``
    no larger than that (a dimension that is always zero stays zero). No rows is a
    :class:`~lengthwise.errors.DataError`.
    """
    total, count = None, 0
    for r in rows:
        sq = r.double().pow(2).sum(dim=0)
        total = sq if total is None else total + sq
        count += int(r.shape[0])
    if total is None or count == 0:
        raise DataError("standardize_features: no training tokens to measure the features on")
    rms = (total / count).sqrt().clamp(min=floor)
    return (1.0 / rms).float()


def folded_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with ``feature_scale`` folded into ``fc.weight`` and dropped.

    ``fc(x * s) = (W * s) x``: the draft of the folded state, without the scale, gives
    the same output. A state without the scale is returned as it is.

    Example::

        >>> s = {"fc.weight": torch.ones(2, 3), SCALE: torch.tensor([1.0, 2.0, 3.0])}
        >>> folded_state(s)["fc.weight"].tolist(), SCALE in folded_state(s)
        ([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], False)
    """
    if SCALE not in state:
        return state
    out = {k: v for k, v in state.items() if k != SCALE}
    w = state["fc.weight"]
    out["fc.weight"] = (w.double() * state[SCALE].double().to(w.device)[None, :]).to(w.dtype)
    return out
