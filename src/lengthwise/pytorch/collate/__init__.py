"""Collators that turn samples of token ids into model inputs, padded or packed.

Both collators return a dict of torch tensors plus four plain ``int`` entries the
training loop can log (see docs/metrics.md):

* ``real_tokens``: tokens that belong to samples;
* ``padded_tokens``: tokens the micro-batch occupies (``rows * P`` padded,
  ``rows * C`` packed with a row capacity ``C``);
* ``samples``: samples in the micro-batch;
* ``bucket``: bucket id of the micro-batch (``-1`` when unknown or packed).

Strip them with :func:`model_inputs` before calling the model (and read them with
:func:`batch_metadata`), or build the collator with ``metadata=False`` (for
``transformers.Trainer``, which passes the whole batch to the model).

Modules: :mod:`~lengthwise.pytorch.collate.padded` (:class:`PadCollator`,
:func:`bucket_of`), :mod:`~lengthwise.pytorch.collate.packed` (:class:`PackCollator`,
:func:`packed_attention_mask`, :class:`RowsDataset`),
:mod:`~lengthwise.pytorch.collate.samples` (what both share: :func:`model_inputs`,
:func:`batch_metadata`), :mod:`~lengthwise.pytorch.collate.budget` (:class:`Budget`,
:class:`BudgetError`: every micro-batch checked against the plan's budget) and
:mod:`~lengthwise.pytorch.collate.plan` (:func:`collator_for`, what
``BucketBatchSampler.collator()`` returns, and :class:`HeldCollator`: another collator
held to the plan).

Example::

    >>> import lengthwise
    >>> collate = lengthwise.PadCollator(pad_token_id=0, pad_multiple=4, edges=[4, 16])
    >>> batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9, 10, 11, 12]}])
    >>> batch["input_ids"].tolist()
    [[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 10, 11, 12, 0, 0, 0]]
    >>> batch["real_tokens"], batch["padded_tokens"], batch["bucket"]
    (8, 16, 1)
    >>> sorted(model_inputs(batch))
    ['attention_mask', 'input_ids', 'labels']
    >>> batch_metadata(batch)
    {'real_tokens': 8, 'padded_tokens': 16, 'samples': 2, 'bucket': 1}
"""

from __future__ import annotations

from lengthwise.pytorch.collate.budget import Budget, BudgetError
from lengthwise.pytorch.collate.packed import PackCollator, RowsDataset, packed_attention_mask
from lengthwise.pytorch.collate.padded import PadCollator, bucket_of
from lengthwise.pytorch.collate.plan import HeldCollator, collator_for
from lengthwise.pytorch.collate.samples import METADATA_KEYS, batch_metadata, model_inputs

__all__ = [
    "METADATA_KEYS",
    "Budget",
    "BudgetError",
    "HeldCollator",
    "PackCollator",
    "PadCollator",
    "RowsDataset",
    "batch_metadata",
    "bucket_of",
    "collator_for",
    "model_inputs",
    "packed_attention_mask",
]
