"""vLLM's ``speculators`` draft-model trainer, fed by lengthwise instead of its multipack sampler.

``speculators`` packs each micro-batch into one row of ``total_seq_len`` tokens
(its ``CollateFn``) and plans the rows with ``MultipackDistributedBatchSamplerV2``.
:class:`SpeculatorsBatchSampler` takes that sampler's arguments and plans the rows
with lengthwise's packed layout (``layout="pack"``, ``max_tokens=total_seq_len``):
stratified, equal counts on every data-parallel rank, every sample once per epoch.
It also answers the trainer's mid-epoch fast-skip, so ``resume_from_checkpoint``
continues with the next planned micro-batch. :func:`use_in_speculators` puts it (and a
collator that checks each row against the budget) into ``speculators.train.dataloader``.

Example::

    from lengthwise.speculators import use_in_speculators

    use_in_speculators()            # before the trainer builds its loaders
    # ... speculators' own training entry point, unchanged
"""

from __future__ import annotations

from typing import Any

from speculators.train import dataloader as _loaders
from speculators.train.data import CollateFn

from lengthwise.errors import ConfigError
from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.collate.budget import BudgetError
from lengthwise.pytorch.sampler import BucketBatchSampler
from lengthwise.pytorch.sampler_state import ResumeError

__all__ = ["CheckedCollateFn", "SpeculatorsBatchSampler", "use_in_speculators"]


class SpeculatorsBatchSampler(BucketBatchSampler):
    """Packed lengthwise micro-batches with ``MultipackDistributedBatchSamplerV2``'s arguments.

    ``batch_max_length`` is the row capacity (``total_seq_len``); longer samples are
    truncated (``truncate_long_samples=True``) or dropped, counted in ``plan.stats``.
    ``plan_options`` are the plan's other :class:`~lengthwise.PlanConfig` fields
    (``{"order": "random"}``...), ``options`` :class:`~lengthwise.BucketBatchSampler`'s own.
    ``max_batches`` (a benchmark's cut of the epoch) is refused: it would leave samples out.

    Example::

        >>> s = SpeculatorsBatchSampler(8, [5, 3, 4, 2], num_replicas=1, rank=0)
        >>> sorted(i for b in s for i in b), all(sum([5, 3, 4, 2][i] for i in b) <= 8 for b in s)
        ([0, 1, 2, 3], True)
    """

    def __init__(self, batch_max_length: int, lengths: Any, num_replicas: int, rank: int,
                 truncate_long_samples: bool = True, seed: int = 0,
                 max_batches: int | None = None, plan_options: dict[str, Any] | None = None,
                 **options: Any) -> None:
        if max_batches is not None:
            raise ConfigError(f"max_batches={max_batches} would cut the epoch short; the "
                             "lengthwise sampler trains every sample once per epoch")
        options.setdefault("check_world_size", _sequence_parallel() == 1)
        config = PlanConfig(max_tokens=batch_max_length, layout="pack",
                            on_overflow="truncate" if truncate_long_samples else "drop",
                            **(plan_options or {}))
        super().__init__(lengths, config, num_replicas=num_replicas, rank=rank, seed=seed,
                         window=None, **options)
        self._skipped = (-1, 0)  # (epoch, micro-batches) the trainer fast-skipped

    def _generate_batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches of ``epoch`` (the trainer's fast-skip asks for them)."""
        self.set_epoch(epoch)
        plan = self.plan
        return [] if plan is None else [b.tolist() for b in plan.rank_batches(self.rank)]

    @property
    def _cached_generated_batches(self) -> tuple[int, list[list[int]]]:
        epoch, skipped = self._skipped
        return self.epoch, self._generate_batches(self.epoch)[skipped if epoch == self.epoch
                                                              else 0:]

    @_cached_generated_batches.setter
    def _cached_generated_batches(self, value: tuple[int, list[Any]]) -> None:
        """The trainer resumes mid-epoch by setting the epoch's remaining micro-batches."""
        epoch, remaining = value
        full = self._generate_batches(epoch)
        skip = len(full) - len(remaining)
        if skip < 0 or [list(map(int, b)) for b in remaining] != full[skip:]:
            raise ResumeError(f"the trainer's remaining micro-batches of epoch {epoch} are not "
                              "the end of this sampler's plan")
        state = self.state_dict()
        state["yielded"] = skip
        self.load_state_dict(state)
        self._skipped = (epoch, skip)

    def __len__(self) -> int:
        """Micro-batches of the epoch, less those fast-skipped on resume (as multipack counts)."""
        epoch, skipped = self._skipped
        return super().__len__() - (skipped if epoch == self.epoch else 0)

    def remaining(self) -> int:
        epoch, skipped = self._skipped
        return super().remaining() + (skipped if epoch == self.epoch else 0)


class CheckedCollateFn(CollateFn):
    """``speculators``' ``CollateFn``, refusing a micro-batch it would cut or leave out.

    Its row holds ``max_len`` tokens; a batch whose samples are longer in all than
    the plan counted them (the data set's ``approx_lengths`` were short) raises
    :class:`~lengthwise.BudgetError` instead of silently losing the tail.
    """

    def __call__(self, batch: Any) -> dict[str, Any]:
        tokens = sum(min(int(item["lengths"].sum()), self.max_len) for item in batch
                     if isinstance(item, dict) and "lengths" in item)
        if tokens > self.max_len:
            raise BudgetError(f"a micro-batch of {len(batch)} samples holds {tokens} tokens, over "
                              f"total_seq_len={self.max_len}: the samples are longer than the "
                              "data set's approx_lengths said")
        return super().__call__(batch)


def use_in_speculators(**options: Any) -> None:
    """Make ``speculators``' trainer build its loaders with lengthwise's packed plan.

    Sets ``MultipackDistributedBatchSamplerV2`` in ``speculators.train.dataloader`` to
    :class:`SpeculatorsBatchSampler` (with ``options``, e.g. ``plan_options=...``) and its
    ``CollateFn`` to :class:`CheckedCollateFn`. Call it before the loaders are built.

    Example::

        use_in_speculators(plan_options={"order": "random"})
        train_loader, val_loader = create_train_val_loaders(...)
    """
    def make(*args: Any, **kwargs: Any) -> SpeculatorsBatchSampler:
        return SpeculatorsBatchSampler(*args, **{**options, **kwargs})

    _loaders.MultipackDistributedBatchSamplerV2 = make
    _loaders.CollateFn = CheckedCollateFn


def _sequence_parallel() -> int:
    """Processes that share a data-parallel rank in ``speculators`` (sequence parallel)."""
    from speculators.train.distributed import get_sp_size

    return int(get_sp_size())
