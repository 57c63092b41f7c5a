"""A seeded permutation of ``0..n-1`` evaluated anywhere in O(1) memory.

``permuted(positions, n, seed, epoch)`` is the sample id at each position of the
epoch's global shuffle, computed without materialising the permutation: a
balanced Feistel network on the smallest even number of bits that holds ``n``,
with cycle walking back into ``[0, n)``. A window of ``N`` positions costs
``O(N)`` time and memory whatever ``n`` is, so a billion-sample epoch shuffles
one window at a time.

Example::

    >>> ids = permuted(np.arange(10), 10, seed=0, epoch=0)
    >>> sorted(ids.tolist()) == list(range(10))
    True
    >>> np.array_equal(ids, permuted(np.arange(10), 10, seed=0, epoch=0))
    True
"""

from __future__ import annotations

import numpy as np

__all__ = ["permuted"]

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _round_keys(seed: int, epoch: int) -> np.ndarray:
    return np.random.SeedSequence([int(seed), int(epoch), 0x5E1F]).generate_state(
        _ROUNDS, dtype=np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a cheap bijective 64-bit hash (wrapping arithmetic)."""
    x = (x + _GOLD) * _M1
    x ^= x >> np.uint64(31)
    x *= _M2
    x ^= x >> np.uint64(29)
    return x


def _encrypt(x: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (_mix(right ^ key) & mask)
    return (left << shift) | right


def permuted(positions: np.ndarray, n: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """Sample ids at ``positions`` of the ``(seed, epoch)`` shuffle of ``0..n-1`` (int64).

    A bijection of ``[0, n)``: distinct positions give distinct ids.

    Example::

        >>> ids = permuted(np.arange(1000), 1000, seed=3, epoch=1)
        >>> np.unique(ids).size, int(ids.min()), int(ids.max())
        (1000, 0, 999)
    """
    n = int(n)
    pos = np.asarray(positions, dtype=np.int64)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise ValueError(f"positions must lie in [0, {n}), got {pos.min()}..{pos.max()}")
    if n <= 2:
        flip = n == 2 and bool(np.random.default_rng([int(seed), int(epoch)]).integers(2))
        return (pos ^ 1) if flip else pos.copy()
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    keys = _round_keys(seed, epoch)
    with np.errstate(over="ignore"):
        out = _encrypt(pos.astype(np.uint64), bits // 2, keys)
        outside = np.flatnonzero(out >= np.uint64(n))
        while outside.size:  # cycle walking: at most a few rounds, the domain is < 4n
            out[outside] = _encrypt(out[outside], bits // 2, keys)
            outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64)
