"""A seeded permutation of ``0..n-1`` evaluated anywhere in O(1) memory.

``permuted(positions, n, seed, epoch)`` is the sample id at each position of the
epoch's global shuffle, computed without materialising the permutation: a
Feistel network over ``Z_a x Z_b`` (``a = ceil(sqrt(n))``, ``b = ceil(n / a)``,
additions modulo the half's size, an even number of rounds), with cycle walking
back into ``[0, n)`` for the fewer than ``a`` values above it. A window of ``N``
positions costs ``O(N)`` time and memory whatever ``n`` is, so a billion-sample
epoch shuffles one window at a time.

Example::

    >>> ids = permuted(np.arange(10), 10, seed=0, epoch=0)
    >>> sorted(ids.tolist()) == list(range(10))
    True
    >>> np.array_equal(ids, permuted(np.arange(10), 10, seed=0, epoch=0))
    True
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["permuted"]

_ROUNDS = 6  # even: the halves end in their own ranges again
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(32)


def _round_keys(seed: int, epoch: int) -> np.ndarray:
    return np.random.SeedSequence([int(seed), int(epoch), 0x5E1F]).generate_state(
        _ROUNDS, dtype=np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a cheap 64-bit hash (wrapping arithmetic)."""
    x = (x + _GOLD) * _M1
    x ^= x >> np.uint64(31)
    x *= _M2
    x ^= x >> np.uint64(29)
    return x


def _encrypt(x: np.ndarray, a: int, b: int, keys: np.ndarray) -> np.ndarray:
    """A bijection of ``[0, a*b)``: ``x = A*b + B``; rounds ``(A, B) -> (B, A + F(B) mod |A|)``."""
    left, right = np.divmod(x, np.uint64(b))
    mod_left, mod_right = np.uint64(a), np.uint64(b)
    for key in keys:
        # F(B) in [0, |A|) by a multiply-shift of its top 32 bits, not a division
        f = ((_mix(right ^ key) >> _SHIFT) * mod_left) >> _SHIFT
        f += left
        f -= mod_left * (f >= mod_left)
        left, right = right, f
        mod_left, mod_right = mod_right, mod_left
    return left * np.uint64(b) + right


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
    if not 1 <= n < 2**62:
        raise ValueError(f"n must lie in [1, 2**62), got {n}")
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise ValueError(f"positions must lie in [0, {n}), got {pos.min()}..{pos.max()}")
    a = max(2, math.isqrt(n - 1) + 1)
    b = max(2, -(-n // a))
    keys = _round_keys(seed, epoch)
    with np.errstate(over="ignore"):
        out = _encrypt(pos.astype(np.uint64), a, b, keys)
        outside = np.flatnonzero(out >= np.uint64(n))
        while outside.size:  # cycle walking: a*b - n < a values lie outside
            out[outside] = _encrypt(out[outside], a, b, keys)
            outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64)
