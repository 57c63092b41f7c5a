"""Named random streams of one ``(seed, epoch)``: a plan is rebuilt anywhere from these.

Each decision of a planner draws from its own stream
``numpy.random.default_rng([seed, epoch, stream])``, so changing how one decision
uses randomness leaves the others as they were, and seeds of different epochs never
collide (``seed + epoch`` would).

Example::

    >>> a = rng(0, 1, BATCHES).integers(1 << 30)
    >>> b = rng(0, 1, BATCHES).integers(1 << 30)
    >>> bool(a == b and a != rng(1, 0, BATCHES).integers(1 << 30))
    True
"""

from __future__ import annotations

import numpy as np

__all__ = ["BATCHES", "EVEN", "ORDER", "PACK_DEAL", "PACK_EVEN", "PACK_ORDER", "rng"]

# padded layout
BATCHES, ORDER, EVEN = 1, 2, 3
# packed layout
PACK_DEAL, PACK_EVEN, PACK_ORDER = 11, 12, 13


def rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    """The generator of ``stream`` for ``(seed, epoch)``."""
    return np.random.default_rng([seed, epoch, stream])
