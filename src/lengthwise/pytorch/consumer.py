"""Which loader iterates a batch sampler, and how many of its micro-batches it has handed out.

A ``DataLoader`` with workers asks its batch sampler for ``prefetch_factor x num_workers``
micro-batches ahead of the training loop, and Accelerate's ``DataLoaderShard`` looks one
ahead; a sampler that counted the micro-batches it yielded would save a resume point past
micro-batches that were never trained. :func:`find_consumer` looks, when the sampler's
iteration starts, for the PyTorch ``DataLoader`` iterator that called it (and the
``DataLoaderShard`` around that); :meth:`Consumer.handed_out` then counts what the loop
received. torchdata's ``StatefulDataLoader`` is not followed: it counts by itself
(:func:`lengthwise.pytorch.sampler.loader_sampler_state`).

Example::

    >>> from torch.utils.data import DataLoader
    >>> class Sampler:
    ...     def __iter__(self):
    ...         self.consumer = find_consumer(self)
    ...         return iter([[0], [1], [2]])
    >>> s = Sampler()
    >>> it = iter(DataLoader(range(3), batch_sampler=s))
    >>> _ = next(it)
    >>> s.consumer.handed_out()
    1
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["Consumer", "find_consumer"]

#: the module of PyTorch's own loader iterators, whose ``_num_yielded`` counts the batches
#: returned by ``next()``; subclasses from elsewhere (torchdata) count differently
_TORCH_LOADER = "torch.utils.data.dataloader"
_SEARCH_DEPTH = 12  # frames from the sampler's __iter__ up to an Accelerate DataLoaderShard


@dataclass
class Consumer:
    """A PyTorch loader iterator that iterates a sampler (held weakly), and what it prefetches."""

    iterator: weakref.ReferenceType
    workers: int
    #: Accelerate's ``DataLoaderShard`` around the loader (it holds one batch back), or ``None``
    shard: weakref.ReferenceType | None = None

    @property
    def looks_ahead(self) -> bool:
        """Whether the sampler is asked for micro-batches before the loop receives them."""
        return self.workers > 0 or self.shard is not None

    def describe(self) -> str:
        """What fetched ahead, in words: ``2 loader workers``, ``Accelerate's prepared loader``."""
        parts = [f"{self.workers} loader workers"] if self.workers else []
        if self.shard is not None:
            parts.append("Accelerate's prepared loader")
        return " and ".join(parts) or "the loader"

    def alive(self) -> bool:
        """Whether the loader iterator still exists (a loop may still receive batches)."""
        return self.iterator() is not None

    def handed_out(self) -> int | None:
        """Micro-batches the training loop has received in this pass; ``None`` if unknown."""
        it = self.iterator()
        if it is None:
            return None
        count = int(getattr(it, "_num_yielded", 0))
        shard = None if self.shard is None else self.shard()
        if shard is not None and count > 0 and not getattr(shard, "end_of_dataloader", True):
            count -= 1  # the shard has fetched the next batch to know whether this is the last
        return count


def _loader_iterator(obj: Any) -> bool:
    # its own class, not a subclass: ``_num_yielded`` may be set only after iter(sampler)
    return type(obj).__module__ == _TORCH_LOADER and type(obj).__name__.endswith("DataLoaderIter")


def _accelerate_shard(obj: Any) -> bool:
    module = sys.modules.get("accelerate.data_loader")
    shard = getattr(module, "DataLoaderShard", None) if module is not None else None
    return shard is not None and isinstance(obj, shard)


def find_consumer(sampler: Any) -> Consumer | None:
    """The PyTorch loader iterator whose code called ``iter(sampler)``.

    Call it from the sampler's ``__iter__`` (not a generator: its body runs at ``iter()``;
    the frames of ``sampler``'s own methods, a subclass's ``__iter__``, are passed over).
    ``None`` when something else iterates the sampler (a plain ``for`` loop, torchdata).
    """
    frame = sys._getframe(1)
    while frame is not None and frame.f_locals.get("self") is sampler:
        frame = frame.f_back
    if frame is None:
        return None
    it = frame.f_locals.get("self")
    if not _loader_iterator(it):
        return None
    shard = None
    up = frame.f_back
    for _ in range(_SEARCH_DEPTH):
        if up is None:
            break
        owner = up.f_locals.get("self")
        if _accelerate_shard(owner):
            shard = weakref.ref(owner)
            break
        up = up.f_back
    return Consumer(weakref.ref(it), int(getattr(it, "_num_workers", 0) or 0), shard)
