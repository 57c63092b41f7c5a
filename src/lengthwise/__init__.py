"""lengthwise: length-aware batch planning for language-model training.

The NumPy core (lengths, edges, plans, metrics) imports nothing heavier than
NumPy; the torch, Hugging Face and plotting adapters load on first use.

Example::

    >>> import numpy as np, lengthwise
    >>> plan = lengthwise.plan_epoch(np.arange(1, 1001), batch_size=8, buckets=4)
    >>> len(plan.rank_batches(0)) == plan.num_batches
    True
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily on first access)
_EXPORTS: dict[str, str] = {
    "load_lengths": "lengthwise.lengths",
    "bundled_names": "lengthwise.lengths",
    "optimal_edges": "lengthwise.edges",
    "plan_epoch": "lengthwise.plan",
    "EpochPlan": "lengthwise.plan",
    "PlanConfig": "lengthwise.plan",
    "PackedEpochPlan": "lengthwise.pack",
    "pack_rows": "lengthwise.pack",
    "CostModel": "lengthwise.cost",
    "recomposition": "lengthwise.metrics",
    "diagnose": "lengthwise.doctor",
    "one_line_verdict": "lengthwise.doctor",
    "BucketBatchSampler": "lengthwise.sampler",
    "ResumeError": "lengthwise.sampler",
    "loader_sampler_state": "lengthwise.sampler",
    "LengthwiseTrainer": "lengthwise.hf_trainer",
    "use_lengthwise": "lengthwise.hf_trainer",
    "PadCollator": "lengthwise.collate",
    "PackCollator": "lengthwise.collate",
    "model_inputs": "lengthwise.collate",
    "batch_metadata": "lengthwise.collate",
    "packed_attention_mask": "lengthwise.collate",
    "RowsDataset": "lengthwise.collate",
    "BudgetError": "lengthwise.collate",
    "Calibration": "lengthwise.calibrate",
    "fit_cost": "lengthwise.calibrate",
    "compute_lengths": "lengthwise.hf_lengths",
    "calibrate": "lengthwise.calibrate",
    "StepLogger": "lengthwise.train.step_logger",
    "bucket_token_shares": "lengthwise.train.step_logger",
    "SpikeGuard": "lengthwise.train.spike_guard",
    "Checkpointer": "lengthwise.train.checkpoint",
    "save_checkpoint": "lengthwise.train.checkpoint",
    "load_checkpoint": "lengthwise.train.checkpoint",
    "latest_checkpoint": "lengthwise.train.checkpoint",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
