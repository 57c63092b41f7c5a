"""The PyTorch adapters: the batch sampler, the collators, cost calibration, process groups.

* :mod:`~lengthwise.pytorch.sampler`: :class:`BucketBatchSampler`, a plan fed to a ``DataLoader``
  (its saved state read and checked by :mod:`~lengthwise.pytorch.sampler_state`);
* :mod:`~lengthwise.pytorch.collate`: :class:`PadCollator` and :class:`PackCollator`, and the
  plan's budget every micro-batch is checked against (:class:`BudgetError`);
* :mod:`~lengthwise.pytorch.calibrate`: fitting the cost model to measured step times;
* :mod:`~lengthwise.pytorch.dist`: the ``torch.distributed`` group this process is in.

Example::

    >>> from lengthwise import BucketBatchSampler
    >>> list(BucketBatchSampler([5, 3, 8, 2], batch_size=2, order="sorted"))
    [[3, 1], [0, 2]]
"""

from __future__ import annotations

from lengthwise._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "BucketBatchSampler": "lengthwise.pytorch.sampler",
    "ResumeError": "lengthwise.pytorch.sampler",
    "loader_sampler_state": "lengthwise.pytorch.sampler",
    "PadCollator": "lengthwise.pytorch.collate",
    "PackCollator": "lengthwise.pytorch.collate",
    "RowsDataset": "lengthwise.pytorch.collate",
    "BudgetError": "lengthwise.pytorch.collate",
    "calibrate": "lengthwise.pytorch.calibrate",
    "fit_cost": "lengthwise.pytorch.calibrate",
    "Calibration": "lengthwise.pytorch.calibrate",
    "group_info": "lengthwise.pytorch.dist",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

# ``calibrate`` names a module of this package and its function. Importing the module sets
# the package's attribute to the module, shadowing the lazy export; bind the function now (the
# module imports no torch), so ``from lengthwise.pytorch import calibrate`` is the function
# whatever was imported before.
from lengthwise.pytorch.calibrate import calibrate  # noqa: E402, F401

