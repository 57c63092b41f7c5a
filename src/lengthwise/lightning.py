"""PyTorch Lightning: a batch sampler Lightning can rebuild, and a callback for epochs and resume.

With its default ``use_distributed_sampler=True``, Lightning's ``Trainer`` rebuilds a
loader's batch sampler around its own ``DistributedSampler``.
:class:`LightningBatchSampler` is a :class:`~lengthwise.BucketBatchSampler` that
survives this: Lightning rebuilds it with the same lengths and options, taking only
the ranks from its ``DistributedSampler``, so a sampler built before the process group
exists still plans the right share. Lightning then calls :meth:`set_epoch` itself.

:class:`LengthwiseCallback` sets the epoch on any lengthwise sampler of the training
loader (also a plain ``BucketBatchSampler`` under ``use_distributed_sampler=False``)
and saves the sampler's place in Lightning's checkpoints, counted at the batches the
loop trained, so ``fit(ckpt_path=...)`` continues mid-epoch with the next micro-batch.

Example::

    from lengthwise.lightning import LengthwiseCallback, LightningBatchSampler

    sampler = LightningBatchSampler(lengths, max_tokens=16384)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=sampler.collator(0))
    trainer = L.Trainer(callbacks=[LengthwiseCallback()], ...)
    trainer.fit(model, loader)
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback

from lengthwise.errors import ConfigError
from lengthwise.planning.config import PlanConfig
from lengthwise.pytorch.dist import check_replicas
from lengthwise.pytorch.sampler import BucketBatchSampler
from lengthwise.pytorch.sampler_state import ResumeError

__all__ = ["LengthwiseCallback", "LightningBatchSampler", "lengthwise_samplers"]


class LightningBatchSampler(BucketBatchSampler):
    """A :class:`~lengthwise.BucketBatchSampler` that Lightning's ``Trainer`` can rebuild.

    ``config`` and ``options`` (the plan's, as keywords, and the sampler's own) are the
    sampler's. Lightning rebuilds it as
    ``LightningBatchSampler(lengths, config, sampler=DistributedSampler(...), **options)``: the
    ``DistributedSampler`` gives ``num_replicas`` and ``rank`` (which must agree with
    any given) and nothing else. ``self.sampler`` is the sampler itself, so Lightning's
    ``set_epoch`` on ``loader.batch_sampler.sampler`` reaches it.

    Example::

        >>> s = LightningBatchSampler([5, 3, 8, 2], batch_size=2, order="sorted")
        >>> s.sampler is s, list(s)
        (True, [[3, 1], [0, 2]])
    """

    def __init__(self, lengths: Any, config: PlanConfig | None = None, *, sampler: Any = None,
                 **options: Any) -> None:
        given = dict(options)
        #: check the ranks against the processes when training starts (LengthwiseCallback)
        self.check_world_size_later = bool(options.get("check_world_size", True))
        if sampler is None:  # built before the process group: Lightning rebuilds it
            options["check_world_size"] = False
        else:
            for name in ("num_replicas", "rank"):
                value = getattr(sampler, name, None)
                if value is None:
                    raise ConfigError(f"sampler={type(sampler).__name__} has no {name}: only a "
                                      "DistributedSampler's ranks can be taken over")
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise ConfigError(f"sampler={type(sampler).__name__} has {name}={value!r} "
                                      f"({type(value).__name__}), not an integer")
                value = int(value)  # a NumPy integer, say
                if options.get(name, value) != value:
                    raise ConfigError(f"{name}={options[name]} was given, but Lightning's "
                                     f"DistributedSampler has {name}={value}")
                options[name] = value
        super().__init__(lengths, config, **options)
        self.sampler = self
        # what Lightning re-instantiates the batch sampler from (its saved-arguments protocol)
        setattr(self, "__pl_saved_args", (self.lengths, config))
        setattr(self, "__pl_saved_kwargs", given)
        setattr(self, "__pl_saved_default_kwargs", {"sampler": None})
        setattr(self, "__pl_saved_arg_names", ("lengths", "config"))

    def __iter__(self) -> Iterator[list[int] | list[list[int]]]:
        if self.check_world_size_later and not self.check_world_size:  # not rebuilt by Lightning
            check_replicas(
                self.num_replicas, f"the {type(self).__name__} (built before the process group, "
                "not rebuilt by Lightning under Trainer(use_distributed_sampler=False): keep "
                "the default, or build a BucketBatchSampler in the train_dataloader hook)",
                rank=self.rank)
        return super().__iter__()


def lengthwise_samplers(loaders: Any) -> list[BucketBatchSampler]:
    """The lengthwise batch samplers of a loader, or of a list/dict of them (Lightning's
    ``trainer.train_dataloader``).

    Example::

        >>> from torch.utils.data import DataLoader
        >>> s = BucketBatchSampler([3, 1, 2], batch_size=2)
        >>> lengthwise_samplers({"a": DataLoader(range(3), batch_sampler=s)}) == [s]
        True
    """
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    elif not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    found = []
    for loader in loaders:
        sampler = getattr(loader, "batch_sampler", None)
        if isinstance(sampler, BucketBatchSampler):
            found.append(sampler)
    return found


class LengthwiseCallback(Callback):
    """Set the epoch on the training loader's lengthwise sampler, and resume it mid-epoch.

    At every training epoch's start it calls ``set_epoch`` (so each epoch's batches are
    planned anew, whatever ``use_distributed_sampler`` is). Its state in a checkpoint is
    the sampler's, with ``yielded`` set to the micro-batches the loop has trained in the
    epoch (not those the loader fetched ahead); ``fit(ckpt_path=...)`` loads it before
    the first batch, so training continues with the next planned micro-batch. Resume
    with the same devices, ``accumulate_grad_batches`` and sampler options (a
    ``ResumeError`` names what changed).

    Example::

        trainer = L.Trainer(callbacks=[LengthwiseCallback(), ModelCheckpoint(...)])
        trainer.fit(model, loader, ckpt_path="last")
    """

    def __init__(self) -> None:
        self._trainer: Any = None
        self._pending: dict[str, Any] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = trainer

    def _sampler(self) -> BucketBatchSampler | None:
        trainer = self._trainer
        if trainer is None or trainer.train_dataloader is None:
            return None
        found = lengthwise_samplers(trainer.train_dataloader)
        if len(found) > 1:
            raise ValueError(f"{len(found)} training loaders have lengthwise samplers; "
                             "LengthwiseCallback follows one")
        return found[0] if found else None

    def state_dict(self) -> dict[str, Any]:
        sampler = self._sampler()
        if sampler is None:
            return {} if self._pending is None else {"sampler": self._pending}
        trained = int(self._trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        ahead = 0
        if sampler.epoch == self._trainer.current_epoch:
            ahead = max(0, sampler._position() - trained)  # fetched, not trained yet
        state = sampler._state(ahead)
        return {"sampler": state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, Mapping):
            raise ResumeError(f"the checkpoint's {type(self).__name__} state is a dict (what "
                              f"state_dict() saves), got {type(state_dict).__name__}")
        self._pending = state_dict.get("sampler")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        sampler = self._sampler()
        if sampler is None:
            return
        if getattr(sampler, "check_world_size_later", sampler.check_world_size):
            check_replicas(sampler.num_replicas, f"the training loader's {type(sampler).__name__}",
                           rank=sampler.rank)
        if self._pending is None:
            return
        try:
            sampler.load_state_dict(self._pending)
        except ResumeError as exc:
            raise ResumeError(f"the checkpoint's {type(self).__name__} state: {exc}") from None
        self._pending = None
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        loader = trainer.train_dataloader
        if fetcher is not None and getattr(loader, "num_workers", 0) > 0:
            iter(fetcher)  # workers started on the old position: start them again

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        sampler = self._sampler()
        if sampler is not None:
            sampler.set_epoch(trainer.current_epoch)
