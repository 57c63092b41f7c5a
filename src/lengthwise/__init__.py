"""lengthwise: length-aware batch planning for language-model training.

The NumPy core (lengths, edges, plans, metrics) imports nothing heavier than
NumPy; the torch, Hugging Face and plotting adapters load on first use.

Example::

    >>> import numpy as np, lengthwise
    >>> plan = lengthwise.plan_epoch(np.arange(1, 1001), batch_size=8)
    >>> len(plan.rank_batches(0)) == plan.num_batches
    True
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily on first access)
_EXPORTS: dict[str, str] = {
    "load_lengths": "lengthwise.planning.lengths",
    "open_lengths": "lengthwise.planning.lengths",
    "WindowedPlan": "lengthwise.planning.windowed",
    "bundled_names": "lengthwise.planning.lengths",
    "optimal_edges": "lengthwise.planning.edges",
    "plan_epoch": "lengthwise.planning.plan",
    "EpochPlan": "lengthwise.planning.schedule",
    "PaddedEpochPlan": "lengthwise.planning.padded",
    "PlanConfig": "lengthwise.planning.config",
    "PackedEpochPlan": "lengthwise.planning.packed",
    "pack_rows": "lengthwise.planning.packed",
    "CostModel": "lengthwise.planning.cost",
    "recomposition": "lengthwise.planning.metrics",
    "batch_stats": "lengthwise.planning.metrics",
    "diagnose": "lengthwise.doctor",
    "verdict_for": "lengthwise.doctor",
    "BucketBatchSampler": "lengthwise.pytorch.sampler",
    "ResumeError": "lengthwise.pytorch.sampler",
    "loader_sampler_state": "lengthwise.pytorch.sampler",
    "LengthwiseTrainer": "lengthwise.hf.trainer",
    "use_lengthwise": "lengthwise.hf.trainer",
    "PadCollator": "lengthwise.pytorch.collate",
    "PackCollator": "lengthwise.pytorch.collate",
    "model_inputs": "lengthwise.pytorch.collate",
    "batch_metadata": "lengthwise.pytorch.collate",
    "packed_attention_mask": "lengthwise.pytorch.collate",
    "RowsDataset": "lengthwise.pytorch.collate",
    "BudgetError": "lengthwise.pytorch.collate",
    "Calibration": "lengthwise.pytorch.calibrate",
    "fit_cost": "lengthwise.pytorch.calibrate",
    "compute_lengths": "lengthwise.hf.lengths",
    "calibrate": "lengthwise.pytorch.calibrate",
    "StepLogger": "lengthwise.train.step_logger",
    "bucket_token_shares": "lengthwise.train.step_logger",
    "SpikeGuard": "lengthwise.train.spike_guard",
    "Checkpointer": "lengthwise.train.checkpoint",
    "save_checkpoint": "lengthwise.train.checkpoint",
    "load_checkpoint": "lengthwise.train.checkpoint",
    "latest_checkpoint": "lengthwise.train.checkpoint",
    "list_checkpoints": "lengthwise.train.checkpoint",
    "PendingSave": "lengthwise.train.checkpoint",
    "CheckpointError": "lengthwise.train.checkpoint",
    "CorruptCheckpointError": "lengthwise.train.checkpoint",
    "CheckpointLockedError": "lengthwise.train.checkpoint",
    "group_info": "lengthwise.pytorch.dist",
    "LengthwiseError": "lengthwise.errors",
    "ConfigError": "lengthwise.errors",
    "DataError": "lengthwise.errors",
    "MissingDependencyError": "lengthwise.errors",
    "LoopConfig": "lengthwise.train.config",
    "TrainLoop": "lengthwise.train.loop",
    "Task": "lengthwise.train.loop",
    "MicroOut": "lengthwise.train.loop",
    "lr_factor": "lengthwise.train.schedule",
    "setup_distributed": "lengthwise.train.device",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
