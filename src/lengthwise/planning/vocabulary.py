"""The names a plan is configured with: orders, layouts and policies, defined once.

The planner, the sampler, the command line and the demo
all read these tuples, so a name means the same thing everywhere.

Example::

    >>> "stratified" in ORDERS and "stratified" in PACK_ORDERS
    True
    >>> OVERFLOW_POLICIES + ("split",) == PACK_OVERFLOW_POLICIES
    True
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "BALANCE", "EVEN_OUT", "LAYOUTS", "ORDERS", "OVERFLOW_POLICIES", "PACK_ORDERS",
    "PACK_OVERFLOW_POLICIES", "SEQUENCE_ORDERS", "Balance", "EvenOut", "Layout", "Order",
    "OverflowPolicy",
]

#: the order of micro-batches in an epoch (padded layout)
Order = Literal["sorted", "random", "bucket-random", "interleave", "stratified"]
ORDERS: tuple[str, ...] = ("sorted", "random", "bucket-random", "interleave", "stratified")
#: the orders that cut micro-batches along one sequence of all the samples; the others cut
#: them inside buckets (the same batches, whatever order they then put them in)
SEQUENCE_ORDERS: tuple[str, ...] = ("sorted", "random")
#: the orders the packed layout supports
PACK_ORDERS: tuple[str, ...] = ("stratified", "random")

#: how a micro-batch holds its samples: one padded row each, or packed rows of ``max_tokens``
Layout = Literal["pad", "pack"]
LAYOUTS: tuple[str, ...] = ("pad", "pack")

#: what happens to a sample longer than ``max_len`` (or than one row of the budget)
OverflowPolicy = Literal["truncate", "drop", "error"]
OVERFLOW_POLICIES: tuple[str, ...] = ("truncate", "drop", "error")
#: the packed layout can also cut a long sample into pieces of one row each
PACK_OVERFLOW_POLICIES: tuple[str, ...] = (*OVERFLOW_POLICIES, "split")

#: how micro-batch counts are made equal across ranks
EvenOut = Literal["split", "drop", "repeat"]
EVEN_OUT: tuple[str, ...] = ("split", "drop", "repeat")

#: what the padded stratified order puts first: every step's length mix (``"none"``), or
#: ranks that wait alike, every step holding micro-batches of one cost level (``"level"``)
Balance = Literal["none", "level"]
BALANCE: tuple[str, ...] = ("none", "level")
