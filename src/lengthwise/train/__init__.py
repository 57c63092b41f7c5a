"""Instrumentation for any PyTorch training loop.

- :class:`StepLogger`: one JSON line per optimizer step (loss, throughput, padding,
  per-bucket and composition-corrected loss), reduced over ranks, written off-thread.
- :class:`Checkpointer` / :func:`save_checkpoint` / :func:`load_checkpoint`: atomic,
  asynchronous checkpoints of model, optimizer, scheduler, sampler and RNG states.
- :class:`SpikeGuard`: skip updates whose loss is an outlier against its running median.
- :class:`TrainLoop` (:mod:`~lengthwise.train.loop`): sampler + collator, AdamW, warm-up then
  constant or cosine learning rate (:func:`lr_factor`), the logger, asynchronous checkpoints
  with exact resume, the guard and DDP under ``torchrun``, for any :class:`Task`;
  :class:`LoopConfig` holds its settings and :mod:`~lengthwise.train.device` its rank and device.

Importing this package does not import torch; the checkpoint functions load it on use.

Example::

    >>> from lengthwise.train import StepLogger, SpikeGuard
    >>> guard = SpikeGuard(warmup=3)
    >>> [guard.check(x) for x in [1.0, 1.1, 0.9, 1.0, 50.0]]
    [False, False, False, False, True]
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

_EXPORTS = {
    "StepLogger": "lengthwise.train.step_logger",
    "bucket_token_shares": "lengthwise.train.step_logger",
    "SpikeGuard": "lengthwise.train.spike_guard",
    "Checkpointer": "lengthwise.train.checkpoint",
    "PendingSave": "lengthwise.train.checkpoint",
    "CheckpointError": "lengthwise.train.checkpoint",
    "CorruptCheckpointError": "lengthwise.train.checkpoint",
    "CheckpointLockedError": "lengthwise.train.checkpoint",
    "save_checkpoint": "lengthwise.train.checkpoint",
    "load_checkpoint": "lengthwise.train.checkpoint",
    "latest_checkpoint": "lengthwise.train.checkpoint",
    "list_checkpoints": "lengthwise.train.checkpoint",
    "LoopConfig": "lengthwise.train.config",
    "TrainLoop": "lengthwise.train.loop",
    "Task": "lengthwise.train.loop",
    "MicroOut": "lengthwise.train.loop",
    "lr_factor": "lengthwise.train.schedule",
    "setup_distributed": "lengthwise.train.device",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
