"""Every rank of a data-parallel job in one process: the micro-batches of ``world`` ranks, in turn.

A job of ``W`` ranks with ``G`` accumulation micro-batches per rank plans each
optimizer step as ``W x G`` micro-batches, spread over the ranks. One process can
train exactly those steps: :class:`SimulatedWorld` holds a sampler per rank (each
planned for ``num_replicas=W``) and yields, for each accumulation slot, rank 0's
micro-batch, then rank 1's, and so on. A loop that accumulates ``W x G``
micro-batches per step (gradients of a sum over the step's tokens) then takes the
update the ``W``-rank job takes, and micro-batch ``k`` of a step is rank ``k % W``'s.

Example::

    >>> import numpy as np
    >>> from lengthwise.train.config import LoopConfig
    >>> lengths = np.random.default_rng(0).integers(8, 200, 400)
    >>> cfg = LoopConfig(steps=4, grad_accum=8, max_tokens=512, max_len=256)
    >>> world = simulated_sampler("bucket-random", lengths, cfg, world=8)
    >>> first = next(iter(world))
    >>> first == next(iter(world.samplers[0]))  # rank 0's first micro-batch comes first
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.train.config import LoopConfig

__all__ = ["SimulatedWorld", "simulated_sampler"]


class SimulatedWorld:
    """The samplers of ranks ``0 .. W-1``, iterated slot by slot (rank 0 first in each slot).

    Plan, edges, epoch and collator are those of rank 0's sampler: every rank plans
    the same epoch.
    """

    def __init__(self, samplers: list[Any]) -> None:
        if not samplers:
            raise ConfigError("a simulated world needs at least one rank's sampler")
        self.samplers = list(samplers)

    @property
    def world(self) -> int:
        """Number of simulated ranks."""
        return len(self.samplers)

    @property
    def epoch(self) -> int:
        return int(self.samplers[0].epoch)

    @property
    def plan(self) -> Any:
        return self.samplers[0].plan

    @property
    def edges(self) -> list[int] | None:
        return self.samplers[0].edges

    @property
    def config(self) -> Any:
        return self.samplers[0].config

    def collator(self, *args: Any, **kwargs: Any) -> Any:
        return self.samplers[0].collator(*args, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.samplers:
            sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return sum(len(s) for s in self.samplers)

    def __iter__(self) -> Iterator[Any]:
        for batches in zip(*(iter(s) for s in self.samplers), strict=True):
            yield from batches


def simulated_sampler(order: str, lengths: np.ndarray, cfg: LoopConfig, *,
                      world: int) -> SimulatedWorld:
    """A :class:`SimulatedWorld` of ``world`` ranks for ``order``.

    ``cfg.grad_accum`` counts the micro-batches of a whole step (every rank's), so it
    must be a multiple of ``world``; each rank accumulates ``cfg.grad_accum // world``.
    """

    from lengthwise.train.loop import make_sampler

    if world < 1 or cfg.grad_accum % world:
        raise ConfigError(f"grad_accum={cfg.grad_accum} must be a multiple of the simulated "
                          f"world size {world}")
    per_rank = replace(cfg, grad_accum=cfg.grad_accum // world)
    return SimulatedWorld([make_sampler(order, lengths, per_rank, rank=r, world=world,
                                        check_world_size=False) for r in range(world)])
