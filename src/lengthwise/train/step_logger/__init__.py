"""One JSON object per optimizer step, written off the training thread.

``StepLogger`` collects what each micro-batch contributed (loss, real and
padded tokens, samples, bucket), and at every optimizer step appends one line
to a JSON-lines file: the step's token-weighted loss, throughput, padding, the
buckets it drew from, a running loss per bucket and a *composition-corrected*
loss: the step's loss minus the offset its bucket mix is expected to have (from
the earlier steps' bucket means, against their data-share-weighted mean). When
each step draws from one bucket, the raw loss jumps between the bands of the
buckets; the corrected loss keeps only the step's own noise. With
``record_micro(sample_losses=...)`` the record also gets ``loss_sample_std``,
the spread of the step's per-sample losses (the sampling-noise floor).

Under ``torch.distributed`` it sums the counts and averages the losses over
ranks (token-weighted) and writes on rank 0 only. Disk writes, and the optional
forwarding to TensorBoard or Weights & Biases, run on a background thread.

Modules: :mod:`~lengthwise.train.step_logger.logger` (:class:`StepLogger`),
:mod:`~lengthwise.train.step_logger.buckets` (:func:`bucket_token_shares`, the running
per-bucket losses and the mix offset of the corrected loss),
:mod:`~lengthwise.train.step_logger.record` (values read, a step's sums all-reduced
over ranks, the record's fields), :mod:`~lengthwise.train.step_logger.writer` (the
background thread, TensorBoard, W&B) and :mod:`~lengthwise.train.step_logger.rollback`
(a resumed run's log without the steps past its checkpoint). Every line is standard
JSON: a NaN or infinity is written ``null`` and named in the line's ``non_finite`` field.

Example::

    >>> import os, tempfile
    >>> from lengthwise.train import StepLogger
    >>> path = os.path.join(tempfile.mkdtemp(), "train_log.jsonl")
    >>> with StepLogger(path, bucket_shares=[0.5, 0.5]) as log:
    ...     log.record_micro(loss=2.0, real_tokens=30, padded_tokens=32, samples=2, bucket=0)
    ...     log.record_micro(loss=4.0, real_tokens=10, padded_tokens=16, samples=1, bucket=1)
    ...     rec = log.step(step=1, epoch=0, lr=1e-3, grad_norm=0.5)
    ...     log.record_micro(loss=1.0, real_tokens=20, padded_tokens=24, samples=1, bucket=0)
    ...     nxt = log.step(step=2)
    >>> rec["loss"], rec["real_tokens"], rec["buckets"], rec["bucket_loss"]
    (2.5, 40, [0, 1], {'0': 2.0, '1': 4.0})
    >>> nxt["corrected_loss"]  # bucket 0 runs 1.0 below the half-and-half mean 3.0
    2.0
"""

from __future__ import annotations

from lengthwise.train.step_logger.buckets import bucket_token_shares
from lengthwise.train.step_logger.logger import StepLogger
from lengthwise.train.step_logger.record import RESERVED_FIELDS

__all__ = ["StepLogger", "bucket_token_shares", "RESERVED_FIELDS"]
