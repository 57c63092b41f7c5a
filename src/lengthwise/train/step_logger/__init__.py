"""One JSON object per optimizer step, written off the training thread.

``StepLogger`` collects what each micro-batch contributed (loss, real and
padded tokens, samples, bucket), and at every optimizer step appends one line
to a JSON-lines file: the step's token-weighted loss, throughput, padding, the
buckets it drew from, a running loss per bucket and a *composition-corrected*
loss (the per-bucket running losses weighted by the data set's bucket shares).
When each step draws from one bucket, the raw loss jumps between the bands of
the buckets; the corrected loss follows the trend instead.

Under ``torch.distributed`` it sums the counts and averages the losses over
ranks (token-weighted) and writes on rank 0 only. Disk writes, and the optional
forwarding to TensorBoard or Weights & Biases, run on a background thread.

Modules: :mod:`~lengthwise.train.step_logger.logger` (:class:`StepLogger`) and
:mod:`~lengthwise.train.step_logger.shares` (:func:`bucket_token_shares`); inside,
``_vector`` (a step's sums, all-reduced over ranks), ``_bucket_losses`` (running
per-bucket and corrected losses), ``_record`` (the record's fields), ``_writer``
(the background thread), ``_sinks`` (TensorBoard, W&B) and ``_values`` (input checks).

Example::

    >>> import os, tempfile
    >>> from lengthwise.train import StepLogger
    >>> path = os.path.join(tempfile.mkdtemp(), "train_log.jsonl")
    >>> with StepLogger(path, bucket_shares=[0.5, 0.5]) as log:
    ...     log.record_micro(loss=2.0, real_tokens=30, padded_tokens=32, samples=2, bucket=0)
    ...     log.record_micro(loss=4.0, real_tokens=10, padded_tokens=16, samples=1, bucket=1)
    ...     rec = log.step(step=1, epoch=0, lr=1e-3, grad_norm=0.5)
    >>> rec["loss"], rec["real_tokens"], rec["buckets"], rec["corrected_loss"]
    (2.5, 40, [0, 1], 3.0)
"""

from __future__ import annotations

from lengthwise.train.step_logger._record import RESERVED_FIELDS
from lengthwise.train.step_logger.logger import StepLogger
from lengthwise.train.step_logger.shares import bucket_token_shares

__all__ = ["StepLogger", "bucket_token_shares", "RESERVED_FIELDS"]
