"""The :class:`StepLogger`: one JSON record per optimizer step, from its micro-batches.

Example::

    >>> log = StepLogger(None)
    >>> log.step(0, loss=2.0)["loss"]
    2.0
    >>> log.close()
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import ConfigError
from lengthwise.finite_json import NON_FINITE
from lengthwise.pytorch.dist import all_reduce_sum, group_info
from lengthwise.train.step_logger.buckets import BucketLosses, normalise_shares, state_count
from lengthwise.train.step_logger.record import (
    DEFAULT_NUM_BUCKETS,
    RESERVED_FIELDS,
    Micro,
    bucket_columns,
    bucket_ids,
    is_column,
    is_tensor,
    local_vector,
    step_record,
    to_bucket,
    to_count,
    to_float,
    vector_capacity,
)
from lengthwise.train.step_logger.rollback import RolledBack, roll_back
from lengthwise.train.step_logger.writer import LogWriter, json_line, open_sinks

__all__ = ["StepLogger"]

#: the version of :meth:`StepLogger.state_dict`'s layout
STATE_VERSION = 1


class StepLogger:
    """Append one JSON object per optimizer step to ``path`` (default ``train_log.jsonl``).

    Per micro-batch call :meth:`record_micro`, per optimizer step :meth:`step`
    (or do both at once with :meth:`log_step`). Free-form events such as
    checkpoints go through :meth:`event`.

    Args:
        path: JSON-lines file to append to; ``None`` writes no file (only forwards).
        bucket_shares: the data set's share of each bucket (dict ``bucket -> share`` or a
            sequence indexed by bucket), e.g. from :func:`bucket_token_shares`. Use token
            shares for a token-averaged loss. Without it, the shares observed so far in
            the run (real tokens per bucket) stand in.
        window: the per-bucket running loss is the token-weighted mean of the bucket's
            losses in the last ``window`` optimizer steps (at least its last 3 entries, for a
            bucket that has not come up lately). All buckets thus lag the trend by about
            ``window / 2`` steps, however rare they are.
        rank, world_size: default to ``torch.distributed`` when it is initialised, else 0 and 1.
            Only rank 0 writes.
        num_buckets: bucket ids must be below this under ``torch.distributed`` (default: the
            length of ``bucket_shares``, else 64), because per-bucket sums travel in one
            fixed-size all-reduce.
        process_group: group to reduce over (default: the world).
        wandb: ``True`` or a dict of ``wandb.init`` arguments to forward each step to
            Weights & Biases (an existing ``wandb.run`` is reused).
        tensorboard_dir: forward each step to a TensorBoard event file in this directory.
        flush_every_s: the file is flushed at least this often while records arrive.
        max_queue: records waiting for the disk; :meth:`step` only waits when this many
            are pending, i.e. when the disk cannot keep up at all.
        mode: ``"a"`` appends (resumed runs continue the same file), ``"w"`` truncates.

    One training loop, one thread: :meth:`record_micro`, :meth:`step` and
    :meth:`log_step` collect the micro-batches of one loop, so they must come from one
    thread at a time. The first thread that calls them owns the logger (until it ends);
    a call from another thread raises ``RuntimeError`` instead of mixing two loops'
    micro-batches and step numbers. :meth:`event`, :meth:`flush` and :meth:`close` may
    be called from any thread.

    A value JSON cannot hold (a set, a module, a datetime...) raises ``TypeError``
    naming its field at the call that passed it; nothing of that call is logged and the
    logger stays usable. A log file deleted or moved during the run is reopened at
    ``path`` (the lines since the last flush are written again), counted in
    :attr:`reopened` and reported with a ``UserWarning`` on the next call.

    Example::

        >>> log = StepLogger(None)
        >>> rec = log.log_step(0, losses=[1.0, 3.0], real_tokens=[3, 1], buckets=[0, 1])
        >>> rec["loss"], rec["bucket_loss"]
        (1.5, {'0': 1.0, '1': 3.0})
        >>> log.close()
    """

    def __init__(
        self,
        path: str | os.PathLike | None = "train_log.jsonl",
        *,
        bucket_shares: Mapping[int, float] | Sequence[float] | np.ndarray | None = None,
        window: int = 50,
        rank: int | None = None,
        world_size: int | None = None,
        num_buckets: int | None = None,
        process_group: Any = None,
        wandb: bool | dict[str, Any] = False,
        tensorboard_dir: str | os.PathLike | None = None,
        flush_every_s: float = 1.0,
        max_queue: int = 10_000,
        mode: str = "a",
    ) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ConfigError(f"window must be a positive integer, got {window!r}")
        if not flush_every_s > 0:
            raise ConfigError(f"flush_every_s must be > 0, got {flush_every_s!r}")
        if not isinstance(max_queue, int) or max_queue < 1:
            raise ConfigError(f"max_queue must be a positive integer, got {max_queue!r}")
        if mode not in ("a", "w"):
            raise ConfigError(f"mode must be 'a' or 'w', got {mode!r}")
        self.shares = None if bucket_shares is None else normalise_shares(bucket_shares)
        if num_buckets is not None and (not isinstance(num_buckets, int) or num_buckets < 1):
            raise ConfigError(f"num_buckets must be a positive integer, got {num_buckets!r}")
        self.num_buckets = num_buckets or (
            max(self.shares) + 1 if self.shares is not None else None
        )
        self._process_group = process_group
        info = group_info(process_group)
        self.rank = rank if rank is not None else (info.rank if info else 0)
        self.world_size = world_size if world_size is not None else (
            info.world_size if info else 1
        )
        self._micro: list[Micro] = []
        self._bucket_losses = BucketLosses(window)
        self._last_step: int | None = None
        self._t_prev = time.perf_counter()
        self.skipped_total = 0
        self.steps_logged = 0
        #: the lines the last :meth:`roll_back` moved out of the log
        self.rolled_back = RolledBack(0, None)
        self.path = None if path is None else Path(path)
        self._owner: threading.Thread | None = None
        self._owner_lock = threading.Lock()
        self._writer: LogWriter | None = None
        if self.rank == 0:
            sinks = open_sinks(tensorboard_dir, wandb)
            self._writer = LogWriter(self.path, sinks, float(flush_every_s), max_queue, mode)
            atexit.register(self._writer.close)

    @property
    def window(self) -> int:
        """Optimizer steps the per-bucket running losses average over."""
        return self._bucket_losses.window

    @window.setter
    def window(self, value: int) -> None:
        self._bucket_losses.window = value

    @property
    def reopened(self) -> int:
        """How many times the log file vanished (deleted, moved, replaced) and was reopened."""
        return 0 if self._writer is None else self._writer.reopened

    # -- recording -------------------------------------------------------------------------
    def record_micro(
        self,
        *,
        loss: Any = None,
        real_tokens: Any = None,
        padded_tokens: Any = None,
        samples: Any = None,
        bucket: Any = None,
        sample_losses: Any = None,
        sample_weights: Any = None,
    ) -> None:
        """Record one micro-batch of the current optimizer step.

        ``loss`` is the micro-batch's mean loss per real token (a float or a scalar
        tensor; tensors are read at :meth:`step`, so recording does not synchronise
        the device). Everything is optional; missing counts are left out of the record.

        ``sample_losses`` is the mean loss of each sample of the micro-batch (a
        sequence, array or 1-D tensor, in sample order); ``real_tokens`` may then be
        the per-sample token counts (same length), which weight them, or
        ``sample_weights`` gives the weights outright when the loss is not a plain
        per-token mean (else equal weights). The step record gets ``loss_sample_std``,
        the weighted standard deviation of the step's per-sample losses, and
        ``loss_sample_neff``, their effective number: the doctor's sampling-noise floor is
        ``loss_sample_std / sqrt(loss_sample_neff)``.

        Example::

            >>> log = StepLogger(None)
            >>> log.record_micro(loss=2.0, real_tokens=100, padded_tokens=128, samples=4, bucket=3)
            >>> log.step(0)["padding_efficiency"]
            0.78125
            >>> log.record_micro(loss=2.0, real_tokens=[1, 3], sample_losses=[1.0, 2.0])
            >>> round(log.step(1)["loss_sample_std"], 3)
            0.707
            >>> log.close()
        """
        self._check_open()
        weights, real_tokens = _micro_weights(real_tokens, sample_weights, sample_losses)
        sample_losses = _checked_sample_losses(sample_losses, weights)
        loss = _scalar_loss(loss)
        b = self._checked_bucket(bucket)
        self._micro.append(
            (
                loss,
                to_count(real_tokens, "real_tokens"),
                to_count(padded_tokens, "padded_tokens"),
                to_count(samples, "samples"),
                b,
                sample_losses,
                weights if sample_losses is not None else None,
            )
        )

    def set_bucket_shares(self, bucket_shares: Mapping[int, float] | Sequence[float]) -> None:
        """Use new bucket shares from the next micro-batch on, e.g. each epoch's plan's.

        An order that labels micro-batches by their longest sample (``random``) puts
        a different set of buckets in each epoch, so a loop gives each epoch's shares.

        Example::

            >>> log = StepLogger(None, bucket_shares={4: 1.0}, num_buckets=8)
            >>> log.set_bucket_shares({2: 1.0, 4: 3.0})
            >>> log.shares
            {2: 0.25, 4: 0.75}
            >>> log.close()
        """
        shares = normalise_shares(bucket_shares)
        if self.num_buckets is not None and max(shares) >= self.num_buckets:
            raise ConfigError(f"bucket {max(shares)} of bucket_shares is not below "
                              f"num_buckets={self.num_buckets}")
        self.shares = shares

    def _checked_bucket(self, bucket: Any) -> int | None:
        """``bucket`` as an int, checked against bucket_shares, num_buckets and the group."""
        b = to_bucket(bucket)
        if b is not None:
            if self.shares is not None and b not in self.shares:
                raise ConfigError(
                    f"bucket {b} has no entry in bucket_shares (buckets {sorted(self.shares)})"
                )
            if self.num_buckets is not None and b >= self.num_buckets:
                raise ConfigError(f"bucket {b} is not below num_buckets={self.num_buckets}")
            if self.num_buckets is None and b >= DEFAULT_NUM_BUCKETS:
                info = group_info(self._process_group)
                if info is not None and info.world_size > 1:
                    # raises: per-bucket sums travel in a fixed-size vector
                    vector_capacity(self.num_buckets, [b])
        return b

    def log_step(
        self,
        step: int | None = None,
        *,
        losses: Any = None,
        real_tokens: Any = None,
        padded_tokens: Any = None,
        samples: Any = None,
        buckets: Any = None,
        epoch: int | None = None,
        loss: Any = None,
        lr: Any = None,
        grad_norm: Any = None,
        skipped: bool = False,
        **fields: Any,
    ) -> dict[str, Any]:
        """Record a whole optimizer step at once; list arguments hold one entry per micro-batch.

        Scalars are repeated for every micro-batch. Returns the record (see :meth:`step`).

        Example::

            >>> log = StepLogger(None)
            >>> log.log_step(5, losses=[2.0, 2.0], real_tokens=[10, 30], buckets=[1, 1])["buckets"]
            [1]
            >>> log.close()
        """
        columns = {
            "losses": losses, "real_tokens": real_tokens, "padded_tokens": padded_tokens,
            "samples": samples, "buckets": buckets,
        }
        lengths = {name: len(value) for name, value in columns.items() if is_column(value)}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"per-micro-batch lists differ in length: {lengths}")
        n = next(iter(lengths.values())) if lengths else int(
            any(v is not None for v in columns.values())
        )

        def pick(name: str, i: int) -> Any:
            value = columns[name]
            return value[i] if name in lengths else value

        self._check_open()
        pending = len(self._micro)
        try:
            for i in range(n):
                self.record_micro(
                    loss=pick("losses", i), real_tokens=pick("real_tokens", i),
                    padded_tokens=pick("padded_tokens", i), samples=pick("samples", i),
                    bucket=pick("buckets", i),
                )
            return self.step(step, epoch=epoch, loss=loss, lr=lr, grad_norm=grad_norm,
                             skipped=skipped, **fields)
        except BaseException:  # a failed call leaves nothing behind: it can be repeated
            del self._micro[pending:]
            raise

    def step(
        self,
        step: int | None = None,
        *,
        epoch: int | None = None,
        loss: Any = None,
        lr: Any = None,
        grad_norm: Any = None,
        skipped: bool = False,
        **fields: Any,
    ) -> dict[str, Any]:
        """Close the current optimizer step, write its record (rank 0) and return it.

        ``loss`` defaults to the token-weighted mean of the recorded micro-batch
        losses; ``skipped=True`` marks an update that was not applied (its losses
        still appear in ``loss`` but stay out of the per-bucket running losses).
        Extra keyword fields (numbers or strings) are copied into the record as given.
        Under ``torch.distributed`` every rank must call this once per step.

        Example::

            >>> log = StepLogger(None)
            >>> log.step(3, loss=1.25, lr=0.1)["loss"]
            1.25
            >>> log.close()
        """
        self._check_open()
        clash = RESERVED_FIELDS.intersection(fields)
        if clash:
            raise ConfigError(f"extra fields must not reuse record keys: {sorted(clash)}")
        # every argument is checked before anything changes: a bad one loses nothing
        json_line(fields, "step")
        if step is None:
            step = 0 if self._last_step is None else self._last_step + 1
        step = to_count(step, "step")
        user_loss = to_float(loss, "loss")
        epoch = to_count(epoch, "epoch")
        lr, grad_norm = to_float(lr, "lr"), to_float(grad_norm, "grad_norm")
        micro, self._micro = self._micro, []
        info = group_info(self._process_group)
        distributed = info is not None and info.world_size > 1
        ids = bucket_ids(micro, num_buckets=self.num_buckets, distributed=distributed)
        vec = local_vector(micro, user_loss, ids=ids)
        if distributed:
            vec = all_reduce_sum(vec, info)
        now = time.perf_counter()
        seconds = now - self._t_prev
        self._t_prev = now
        skipped = bool(skipped)
        columns = bucket_columns(vec)
        offset = self._bucket_losses.expected_offset(columns, self.shares, ids)
        buckets = self._bucket_losses.add(columns, skipped, self.steps_logged, ids)
        if skipped:
            self.skipped_total += 1
        rec = step_record(vec, step=step, epoch=epoch, lr=lr, grad_norm=grad_norm,
                          seconds=seconds, buckets=buckets,
                          bucket_loss=self._bucket_losses.means(), offset=offset,
                          skipped=skipped, skipped_total=self.skipped_total)
        rec.update(fields)
        self._last_step = step
        self.steps_logged += 1
        if self._writer is not None:  # a copy: the caller may change the returned record
            copy = {**rec, "buckets": list(rec["buckets"]),
                    "bucket_loss": dict(rec["bucket_loss"])}
            self._writer.put("record", (json_line(copy, "step"), copy))
        return rec

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        """Write a free-form event line ``{"event": name, "time": ..., **fields}`` (rank 0).

        Example::

            >>> log = StepLogger(None)
            >>> log.event("checkpoint_begin", step=100)["event"]
            'checkpoint_begin'
            >>> log.close()
        """
        self._check_open(any_thread=True)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"event name must be a non-empty string, got {name!r}")
        if {"event", "time", NON_FINITE}.intersection(fields):
            raise ConfigError(f"event fields must not be named 'event', 'time' or "
                              f"'{NON_FINITE}'")
        rec = {"event": name, "time": time.time(), **fields}
        line = json_line(rec, "event")
        if self._writer is not None:
            self._writer.put("event", (line, dict(rec)))
        return rec

    def state_dict(self) -> dict[str, Any]:
        """The running fields' state as plain JSON data, for a checkpoint's ``extra``.

        A resumed run that loads it (:meth:`load_state_dict`) writes the same
        ``bucket_loss``, ``corrected_loss`` and ``skipped_total`` as an uninterrupted
        one, and its log holds each step once (the lines past the state's step move to
        a side file, see :meth:`roll_back`); the bucket shares are not part of it (give
        them as before).

        Example::

            >>> log = StepLogger(None)
            >>> _ = log.log_step(1, losses=[2.0], buckets=[0], skipped=True)
            >>> state = log.state_dict()
            >>> again = StepLogger(None)
            >>> again.load_state_dict(state)
            >>> again.log_step(2, losses=[3.0], buckets=[0])["skipped_total"]
            1
            >>> log.close(); again.close()
        """
        return {"version": STATE_VERSION, "last_step": self._last_step,
                "steps_logged": self.steps_logged, "skipped_total": self.skipped_total,
                "bucket_losses": self._bucket_losses.state_dict()}

    def load_state_dict(self, state: Any) -> None:
        """Continue from what :meth:`state_dict` returned; :class:`ConfigError` for other data."""
        keys = {"version", "last_step", "steps_logged", "skipped_total", "bucket_losses"}
        if not isinstance(state, dict) or set(state) != keys:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ConfigError(f"not a StepLogger state: expected the keys {sorted(keys)}, "
                              f"got {got}")
        if state["version"] != STATE_VERSION:
            raise ConfigError(f"StepLogger state version {state['version']!r} is not "
                              f"{STATE_VERSION}")
        last, logged, skipped = (None if state[k] is None and k == "last_step"
                                 else state_count(state[k], f"StepLogger state: {k}")
                                 for k in ("last_step", "steps_logged", "skipped_total"))
        self._bucket_losses.load_state_dict(state["bucket_losses"])
        self._last_step, self.steps_logged, self.skipped_total = last, logged, skipped
        if last is not None:
            self.roll_back(last)

    def roll_back(self, step: int, *, key: str = "step") -> RolledBack:
        """Move the log's lines past ``step`` (by their ``key``) to its side file; return them.

        A run that stopped after its last checkpoint logged steps that the resumed run
        logs again: without them, readers of the log see each step once. The log is
        rewritten atomically and the lines moved are appended to
        ``NAME.rolled_back.jsonl`` (:mod:`~lengthwise.train.step_logger.rollback`);
        :meth:`load_state_dict` does this for the state's step. The result is kept in
        :attr:`rolled_back` too. Call it before the steps after ``step`` are logged.
        """
        self._check_open(any_thread=True)
        step = to_count(step, "step")
        if self._writer is not None and self.path is not None:
            self.rolled_back = self._writer.rewrite(lambda path: roll_back(path, step, key=key))
        return self.rolled_back

    def reset_timer(self) -> None:
        """Restart the clock for ``tokens_per_second`` (e.g. after an evaluation pause)."""
        self._t_prev = time.perf_counter()

    # -- lifecycle ---------------------------------------------------------------------------
    def flush(self) -> None:
        """Block until every record so far is written and flushed to the file."""
        if self._writer is not None and not self._writer.closed:
            self._writer.flush()
        self._raise_writer_error()

    def close(self) -> None:
        """Flush and close the file and the forwarders; further logging raises. Idempotent."""
        if self._writer is not None and not self._writer.closed:
            self._writer.close()
            atexit.unregister(self._writer.close)
            self._raise_writer_error()
        self._closed = True

    def __enter__(self) -> StepLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    _closed = False

    def _check_open(self, any_thread: bool = False) -> None:
        if self._closed:
            raise RuntimeError("this StepLogger is closed")
        if not any_thread:
            self._check_thread()
        self._raise_writer_error()

    def _check_thread(self) -> None:
        """Let one thread at a time record micro-batches and steps."""
        me = threading.current_thread()
        owner = self._owner
        if owner is me:
            return
        with self._owner_lock:
            owner = self._owner
            if owner is None or not owner.is_alive():
                self._owner = me
                return
        raise RuntimeError(
            f"StepLogger: thread {me.name!r} called record_micro/step while thread "
            f"{owner.name!r} is logging with this logger; a StepLogger collects the "
            "micro-batches of one training loop, so record and step from one thread (use one "
            "logger per loop; event() may be called from any thread)"
        )

    def _raise_writer_error(self) -> None:
        """Raise the writer's error; warn about each reopening of the log file."""
        if self._writer is None:
            return
        while not self._writer.notices.empty():
            warnings.warn(self._writer.notices.get(), UserWarning, stacklevel=4)
        if self._writer.error is not None:
            raise RuntimeError(
                f"writing the training log {self.path} failed: {self._writer.error}"
            ) from self._writer.error


def _items(column: Any) -> list[Any]:
    """The entries of a 1-D sequence, array or tensor as Python values."""
    if is_tensor(column):
        return column.detach().cpu().tolist()
    if isinstance(column, np.ndarray):
        return column.tolist()
    return list(column)


def _micro_weights(real_tokens: Any, sample_weights: Any, sample_losses: Any,
                   ) -> tuple[list[float] | None, Any]:
    """Per-sample loss weights of a micro-batch, and its real token count."""
    weights = None
    if real_tokens is not None and is_column(real_tokens):
        weights = [to_count(v, "real_tokens") for v in _items(real_tokens)]
        real_tokens = sum(weights)
    if sample_weights is not None:
        if sample_losses is None or not is_column(sample_weights):
            raise ConfigError("sample_weights must be a 1-D sequence of per-sample weights, "
                              "given with sample_losses")
        weights = [to_float(v, "sample_weights") for v in _items(sample_weights)]
        if any(w < 0 for w in weights):
            raise ConfigError("sample_weights must not be negative")
    return weights, real_tokens


def _checked_sample_losses(sample_losses: Any, weights: list[float] | None) -> Any:
    """``sample_losses`` checked to be a column matching ``weights`` (tensors detached)."""
    if sample_losses is not None:
        if not is_column(sample_losses):
            raise ConfigError("sample_losses must be a 1-D sequence, array or tensor of "
                              "per-sample losses")
        if is_tensor(sample_losses):
            sample_losses = sample_losses.detach()
        if weights is not None and len(weights) != len(sample_losses):
            raise ConfigError(f"sample_losses has {len(sample_losses)} entries but the "
                              f"weights have {len(weights)}: one per sample each")
    return sample_losses


def _scalar_loss(loss: Any) -> Any:
    """A micro-batch loss: a detached scalar tensor (read later), a float, or ``None``."""
    if not is_tensor(loss):
        return to_float(loss, "loss")  # None stays None
    if loss.numel() != 1:
        raise ConfigError(f"loss must be a scalar, got shape {tuple(loss.shape)}")
    return loss.detach()
