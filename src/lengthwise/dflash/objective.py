"""The DFlash training objective in NumPy: target layers, anchors, block labels and weights.

A draft block starts at an *anchor* position ``a`` of a sample: slot 0 holds
the real token ``input_ids[a]``, slots ``1 .. B-1`` hold a mask token, and slot
``k`` learns to predict ``input_ids[a + k]``. Slot ``k`` weighs
``exp(-(k - 1) / gamma)`` (early slots matter most: a draft token is only used
when every earlier one was accepted), times whether ``a + k`` lies inside the
sample and is supervised.

Anchors are drawn per sample and per step from a generator seeded by
``(seed, step, sample_id)``: the same sample at the same step gets the same
anchors whichever batch, rank or micro-batch it lands in.

Draft slots are budgeted by ``max_slots`` per micro-batch: a sample of ``n``
tokens draws at most ``floor(n * max_slots / (block_size * max_tokens))``
anchors (:func:`anchor_quota`). A planned micro-batch holds at most
``max_tokens`` tokens, so its blocks hold at most ``max_slots`` slots, by
construction, and each sample's quota depends on its own length only.

Example::

    >>> ids = np.array([5, 6, 7, 8, 9])
    >>> mask = np.array([0, 1, 1, 1, 1], dtype=bool)
    >>> labels, weights = block_targets(ids, mask, np.array([1]), block_size=4, gamma=4.0)
    >>> labels.tolist()
    [[-100, 7, 8, 9]]
    >>> np.round(weights, 3).tolist()
    [[0.0, 1.0, 0.779, 0.607]]
"""

from __future__ import annotations

import numpy as np

from lengthwise.errors import ConfigError, DataError

__all__ = ["IGNORE", "anchor_candidates", "anchor_quota", "block_targets", "default_gamma",
           "sample_anchors", "simulated_acceptance_length", "slot_weights", "target_layer_ids"]

#: label of a slot that predicts nothing (slot 0, out of the sample, unsupervised)
IGNORE = -100
#: the decay used with the usual block sizes
_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """Target layers whose outputs feed the draft, spread from layer 1 to ``layers - 3``.

    Ids count decoder layers from 0; the hidden state after layer ``i`` is
    ``hidden_states[i + 1]`` in Hugging Face outputs (index 0 is the embedding).
    One feature takes the middle layer. Small targets clamp the range to their layers;
    where that range holds fewer layers than ``num_features``, the features spread over
    every layer instead, and a target with fewer layers than features is refused: the
    ids are always distinct.

    Example::

        >>> target_layer_ids(36, 5)
        [1, 9, 17, 25, 33]
        >>> target_layer_ids(4, 1), target_layer_ids(4, 2), target_layer_ids(4, 4)
        ([2], [1, 2], [0, 1, 2, 3])
        >>> target_layer_ids(4, 5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: num_features 5: a 4-layer target has only 4 layers ...
    """
    if num_target_layers < 1 or num_features < 1:
        raise ConfigError(f"need num_target_layers >= 1 and num_features >= 1, got "
                          f"{num_target_layers}, {num_features}")
    if num_features > num_target_layers:
        raise ConfigError(f"num_features {num_features}: a {num_target_layers}-layer target "
                          f"has only {num_target_layers} layers to feed the draft; give "
                          f"num_features <= {num_target_layers} (--num-features) or the "
                          "target layers")
    if num_features == 1:
        return [num_target_layers // 2]
    start = min(1, num_target_layers - 1)
    end = max(start, num_target_layers - 3, min(num_target_layers - 1, 2))
    if end - start + 1 < num_features:  # too few layers in the range: spread over them all
        start, end = 0, num_target_layers - 1
    return [int(round(start + i * (end - start) / (num_features - 1)))
            for i in range(num_features)]


def default_gamma(block_size: int) -> float:
    """Weight decay length of the slots: 7 for blocks of 16, 5 for 10, 4 for 8.

    Other sizes take ``0.45 * block_size`` (the same proportion).

    Example::

        >>> default_gamma(16), default_gamma(4)
        (7.0, 1.8)
    """
    if block_size < 2:
        raise ConfigError(f"block_size must be >= 2, got {block_size}")
    return _GAMMA.get(int(block_size), round(0.45 * block_size, 2))


def slot_weights(block_size: int, gamma: float) -> np.ndarray:
    """Per-slot weights ``[0, 1, exp(-1/gamma), ...]`` (slot 0 is the given anchor).

    Example::

        >>> slot_weights(3, 1.0).round(4).tolist()
        [0.0, 1.0, 0.3679]
    """
    if not 0 < gamma < float("inf"):
        raise ConfigError(f"gamma must be a finite number > 0, got {gamma}")
    k = np.arange(block_size, dtype=np.float64)
    w = np.exp(-(k - 1.0) / float(gamma))
    w[0] = 0.0
    return w


def anchor_candidates(loss_mask: np.ndarray) -> np.ndarray:
    """Positions ``t`` with ``loss_mask[t]`` and ``loss_mask[t + 1]`` (int64).

    Example::

        >>> anchor_candidates(np.array([0, 1, 1, 1, 0, 1], dtype=bool)).tolist()
        [1, 2]
    """
    m = np.asarray(loss_mask, dtype=bool)
    if m.size < 2:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(m[:-1] & m[1:]).astype(np.int64)


def anchor_quota(length: int, *, num_anchors: int, block_size: int, max_slots: int | None,
                 max_tokens: int) -> int:
    """Most anchors a sample of ``length`` tokens may draw under a ``max_slots`` budget.

    ``min(num_anchors, floor(length * max_slots / (block_size * max_tokens)))``;
    ``max_slots=None`` leaves ``num_anchors``. Summed over a micro-batch of at most
    ``max_tokens`` tokens, the quotas times ``block_size`` stay within ``max_slots``.

    Example::

        >>> anchor_quota(1000, num_anchors=512, block_size=16, max_slots=32768,
        ...              max_tokens=16384)
        125
        >>> anchor_quota(1000, num_anchors=512, block_size=16, max_slots=None, max_tokens=16384)
        512
    """
    if max_slots is None:
        return int(num_anchors)
    return int(min(num_anchors, (int(length) * int(max_slots)) // (int(block_size)
                                                                   * int(max_tokens))))


def sample_anchors(loss_mask: np.ndarray, *, num_anchors: int, seed: int, step: int,
                   sample_id: int) -> np.ndarray:
    """Up to ``num_anchors`` sorted anchor positions of one sample for one step.

    The draw depends only on ``(seed, step, sample_id)`` and the sample's mask,
    never on its batch-mates. A sample with no two consecutive supervised tokens
    (or ``num_anchors=0``) gets no anchor (it then contributes nothing to the loss).

    Example::

        >>> m = np.ones(10, dtype=bool)
        >>> a = sample_anchors(m, num_anchors=3, seed=0, step=5, sample_id=2)
        >>> a.size, bool((np.diff(a) > 0).all()), bool(a.max() <= 8)
        (3, True, True)
        >>> (a == sample_anchors(m, num_anchors=3, seed=0, step=5, sample_id=2)).all()
        np.True_
    """
    if num_anchors < 0:
        raise ConfigError(f"num_anchors must be >= 0, got {num_anchors}")
    cand = anchor_candidates(loss_mask)
    if num_anchors == 0:
        return cand[:0]
    if cand.size <= num_anchors:
        return cand
    rng = np.random.default_rng([int(seed), int(step), int(sample_id)])
    return np.sort(rng.choice(cand, size=num_anchors, replace=False))


def block_targets(input_ids: np.ndarray, loss_mask: np.ndarray, anchors: np.ndarray, *,
                  block_size: int, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Labels ``(n, B)`` (``IGNORE`` where nothing is predicted) and weights ``(n, B)``.

    Slot ``k`` of the block at anchor ``a`` predicts ``input_ids[a + k]`` with
    weight ``exp(-(k - 1) / gamma)`` when ``a + k`` is inside the sample and
    supervised; slot 0 and every other slot weigh 0.

    Example::

        >>> lab, w = block_targets(np.arange(4), np.ones(4, bool), np.array([2]),
        ...                        block_size=3, gamma=1.0)
        >>> lab.tolist(), w.round(2).tolist()
        ([[-100, 3, -100]], [[0.0, 1.0, 0.0]])
    """
    ids = np.asarray(input_ids)
    mask = np.asarray(loss_mask, dtype=bool)
    if ids.shape != mask.shape or ids.ndim != 1:
        raise DataError(f"input_ids and loss_mask must be 1-D of one shape, got {ids.shape} "
                        f"and {mask.shape}")
    a = np.asarray(anchors, dtype=np.int64).reshape(-1, 1)
    pos = a + np.arange(block_size, dtype=np.int64)
    inside = pos < ids.size
    safe = np.where(inside, pos, 0)
    valid = inside & mask[safe]
    valid[:, 0] = False
    labels = np.where(valid, ids[safe], IGNORE).astype(np.int64)
    weights = np.where(valid, slot_weights(block_size, gamma), 0.0)
    return labels, weights


def simulated_acceptance_length(accuracy: np.ndarray) -> float:
    """Tokens per target forward implied by per-slot accuracies: ``1 + sum_k prod_{j<=k} acc_j``.

    ``accuracy[k - 1]`` is slot ``k``'s teacher-forced top-1 accuracy; the 1 is
    the target's own token that every verification adds. It treats slot
    accuracies as independent, so it estimates the real acceptance length.

    Example::

        >>> simulated_acceptance_length(np.array([0.5, 0.5, 0.0]))
        1.75
    """
    acc = np.asarray(accuracy, dtype=np.float64)
    known = acc[~np.isnan(acc)]
    if known.size and (known.min() < 0 or known.max() > 1):
        raise DataError("accuracies must lie in [0, 1]")
    acc = np.nan_to_num(acc, nan=0.0)
    return float(1.0 + np.cumprod(acc).sum())

