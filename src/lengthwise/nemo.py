"""NeMo Automodel: a lengthwise batch sampler through its ``batch_sampler_config``.

NeMo Automodel's ``DataloaderConfig(batch_sampler_config=...)`` builds a batch sampler
with ``config.build(dataset_len=..., rank=..., world_size=...)`` for its
``ParallelAwareDataloader`` (a torchdata ``StatefulDataLoader``, which saves and
restores the sampler's state with its checkpoints). :class:`LengthwiseSamplerConfig`
is such a config. Its recipes call ``set_epoch`` only on ``loader.sampler``, never
on a batch sampler, so :class:`EpochBatchSampler` moves to the next epoch by itself
when a pass starts after a finished one.

Example::

    from lengthwise.nemo import LengthwiseSamplerConfig

    config = DataloaderConfig(dataset_config=..., batch_size=None,
                              batch_sampler_config=LengthwiseSamplerConfig(
                                  lengths, options={"max_tokens": 16384}))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lengthwise.planning.config import PlanConfig, plan_config
from lengthwise.pytorch.sampler import BucketBatchSampler

__all__ = ["EpochBatchSampler", "LengthwiseSamplerConfig"]


class EpochBatchSampler(BucketBatchSampler):
    """A :class:`~lengthwise.BucketBatchSampler` that starts the next epoch by itself.

    A pass that starts when the current epoch has nothing left (it was trained to the
    end, or a state saved at its end was loaded) plans epoch + 1; ``set_epoch`` still
    works as usual, and a mid-epoch state resumes where it stopped.

    Example::

        >>> s = EpochBatchSampler([5, 3, 8, 2, 7, 1], batch_size=2)
        >>> first, second = list(s), list(s)
        >>> s.epoch, first != second, sorted(sum(second, [])) == list(range(6))
        (1, True, True)
    """

    def __iter__(self) -> Iterator[list[int] | list[list[int]]]:
        if len(self) > 0 and self.remaining() == 0:
            self.set_epoch(self.epoch + 1)
        yield from super().__iter__()


@dataclass
class LengthwiseSamplerConfig:
    """NeMo Automodel's ``BatchSamplerConfig`` for lengthwise: ``lengths``, the plan's
    configuration and the sampler's own options.

    ``options`` are the plan's fields (instead of ``plan``, taken out into it) and
    :class:`~lengthwise.BucketBatchSampler`'s own (``seed``, ``window``...); the ranks come
    from NeMo (its data-parallel ones).

    Example::

        >>> config = LengthwiseSamplerConfig([5, 3, 8, 2], options={"batch_size": 2})
        >>> s = config.build(dataset_len=4, rank=1, world_size=2)
        >>> (s.num_replicas, s.rank, len(s), config.plan == PlanConfig(batch_size=2))
        (2, 1, 1, True)
    """

    lengths: Any
    plan: PlanConfig | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.options = dict(self.options)
        self.plan = plan_config(self.plan, self.options, BucketBatchSampler.__init__,
                                type(self).__name__)

    def build(self, *, dataset_len: int, rank: int, world_size: int) -> EpochBatchSampler:
        """The sampler of data-parallel ``rank`` of ``world_size``; checks the data set's size."""
        sampler = EpochBatchSampler(self.lengths, self.plan, num_replicas=world_size, rank=rank,
                                    **self.options)
        sampler.check_dataset(range(dataset_len))
        return sampler
