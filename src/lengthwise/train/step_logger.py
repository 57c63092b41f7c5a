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

import atexit
import json
import math
import numbers
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.train._dist import GroupInfo, group_info

__all__ = ["StepLogger", "bucket_token_shares", "RESERVED_FIELDS"]

#: Keys of a step record; extra fields passed to ``step`` must not reuse them.
RESERVED_FIELDS = frozenset(
    {
        "step", "epoch", "loss", "lr", "grad_norm", "real_tokens", "padded_tokens",
        "padding_efficiency", "tokens_per_second", "seconds", "samples", "micro_batches",
        "buckets", "bucket_loss", "corrected_loss", "skipped", "skipped_total", "time", "event",
    }
)

_DEFAULT_NUM_BUCKETS = 64
# fixed part of the vector all-reduced under torch.distributed (see StepLogger._reduce)
_F_REAL, _F_REAL_N, _F_PAD, _F_PAD_N, _F_SAMP, _F_SAMP_N, _F_MICRO, _F_LWSUM, _F_LW = range(9)
_FIXED = 9
_MIN_ENTRIES = 3  # a bucket's running loss keeps at least this many of its steps
_PER_BUCKET = 4  # loss*weight, weight, micro-batches, observed weight (tokens or micro-batches)


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "detach") and hasattr(x, "item")


def _to_float(x: Any, name: str) -> float | None:
    if x is None:
        return None
    if _is_tensor(x):
        x = x.detach()
        if x.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(x.shape)}")
        return float(x.item())
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise ValueError(f"{name} must be a scalar, got an array of shape {x.shape}")
        return float(x.reshape(()))
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def _to_count(x: Any, name: str) -> int | None:
    value = _to_float(x, name)
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"{name} must be a non-negative integer, got {x!r}")
    return int(value)


def _to_bucket(x: Any) -> int | None:
    if x is None:
        return None
    if (_is_tensor(x) and x.numel() == 1) or (isinstance(x, np.ndarray) and x.size == 1):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or int(x) < 0:
        raise ValueError(f"bucket must be a non-negative integer or None, got {x!r}")
    return int(x)


def _normalise_shares(shares: Any) -> dict[int, float]:
    if isinstance(shares, Mapping):
        items = [(_to_bucket(k), _to_float(v, f"bucket_shares[{k!r}]")) for k, v in shares.items()]
    else:
        values = np.asarray(shares, dtype=np.float64)
        if values.ndim != 1:
            raise ValueError(f"bucket_shares must be 1-D or a dict, got shape {values.shape}")
        items = [(i, float(v)) for i, v in enumerate(values)]
    if not items:
        raise ValueError("bucket_shares is empty")
    for bucket, share in items:
        if share is None or not math.isfinite(share) or share < 0:
            raise ValueError(f"bucket_shares[{bucket}] must be finite and >= 0, got {share!r}")
    total = sum(share for _, share in items)
    if total <= 0:
        raise ValueError("bucket_shares must not all be zero")
    return {int(b): s / total for b, s in items}  # type: ignore[arg-type]


def bucket_token_shares(plan: Any, *, by: str = "tokens") -> dict[int, float]:
    """Share of each bucket in an epoch plan, for ``StepLogger(bucket_shares=...)``.

    ``plan`` needs ``bucket``, ``offsets``, ``indices`` and ``lengths`` (as in
    ``lengthwise.EpochPlan``). ``by="tokens"`` (for token-averaged losses) weights
    by real tokens, ``by="samples"`` (for per-sample-averaged losses) by samples.

    Example::

        >>> from types import SimpleNamespace
        >>> import numpy as np
        >>> plan = SimpleNamespace(bucket=[0, 1], offsets=np.array([0, 2, 3]),
        ...                        indices=np.array([0, 1, 2]), lengths=np.array([1, 3, 4]))
        >>> bucket_token_shares(plan)
        {0: 0.5, 1: 0.5}
        >>> bucket_token_shares(plan, by="samples")[0]
        0.6666666666666666
    """
    bucket = np.asarray(plan.bucket, dtype=np.int64)
    offsets = np.asarray(plan.offsets, dtype=np.int64)
    if offsets.shape != (bucket.size + 1,):
        raise ValueError(
            f"plan.offsets must have one more entry than plan.bucket ({bucket.size + 1}), "
            f"got {offsets.size}"
        )
    if by == "tokens":
        lengths = np.asarray(plan.lengths, dtype=np.float64)
        cum = np.concatenate([[0.0], np.cumsum(lengths[np.asarray(plan.indices, dtype=np.int64)])])
        weights = cum[offsets[1:]] - cum[offsets[:-1]]
    elif by == "samples":
        weights = np.diff(offsets).astype(np.float64)
    else:
        raise ValueError(f"by must be 'tokens' or 'samples', got {by!r}")
    if bucket.size == 0 or weights.sum() <= 0:
        raise ValueError("the plan has no tokens to take shares from")
    totals = np.bincount(bucket, weights=weights)
    return {int(b): float(t / totals.sum()) for b, t in enumerate(totals) if t > 0}


def _json_default(x: Any) -> Any:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if _is_tensor(x):
        return x.detach().cpu().tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} to the training log")


class _TensorBoardSink:
    def __init__(self, logdir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "tensorboard_dir needs torch and tensorboard: pip install torch tensorboard"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(logdir))

    def record(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        for key, value in _numeric_items(rec):
            self.writer.add_scalar(f"train/{key}", value, step)
        for bucket, value in rec.get("bucket_loss", {}).items():
            self.writer.add_scalar(f"bucket_loss/{bucket}", value, step)

    def event(self, rec: dict[str, Any]) -> None:
        step = rec.get("step")
        if not isinstance(step, int):
            return
        for key, value in _numeric_items(rec):
            self.writer.add_scalar(f"event/{rec['event']}/{key}", value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandbSink:
    def __init__(self, init_kwargs: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                "wandb=True needs the wandb package: pip install wandb"
            ) from exc
        self.wandb = wandb
        self.owns_run = wandb.run is None
        if self.owns_run:
            wandb.init(**init_kwargs)

    def record(self, rec: dict[str, Any]) -> None:
        data = {f"train/{key}": value for key, value in _numeric_items(rec)}
        data.update({f"bucket_loss/{b}": v for b, v in rec.get("bucket_loss", {}).items()})
        self.wandb.log(data, step=rec["step"])

    def event(self, rec: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.owns_run:
            self.wandb.finish()


def _numeric_items(rec: dict[str, Any]) -> list[tuple[str, float]]:
    skip = {"step", "time", "event"}
    return [
        (k, float(v))
        for k, v in rec.items()
        if k not in skip and isinstance(v, numbers.Real) and v is not None
    ]


class _Writer:
    """Background thread that appends records to the file and feeds the sinks."""

    def __init__(self, path: Path | None, sinks: list[Any], flush_every_s: float,
                 max_queue: int, mode: str) -> None:
        self.file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, mode, encoding="utf-8")  # noqa: SIM115 - closed by the thread
        self.sinks = sinks
        self.flush_every_s = flush_every_s
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max_queue)
        self.error: BaseException | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="lengthwise-step-logger",
                                       daemon=True)
        self.thread.start()

    def put(self, kind: str, payload: Any) -> None:
        self.queue.put((kind, payload))

    def _flush(self) -> None:
        if self.file is not None:
            self.file.flush()
        for sink in self.sinks:
            sink.flush()

    def _run(self) -> None:
        dirty = False
        last_flush = time.monotonic()
        while True:
            try:
                kind, payload = self.queue.get(timeout=self.flush_every_s)
            except queue.Empty:
                kind, payload = "tick", None
            try:
                if kind in ("record", "event"):
                    if self.file is not None:
                        self.file.write(json.dumps(payload, default=_json_default) + "\n")
                    for sink in self.sinks:
                        getattr(sink, kind)(payload)
                    dirty = True
                elif kind in ("flush", "stop"):
                    self._flush()
                    dirty = False
                    last_flush = time.monotonic()
                if dirty and time.monotonic() - last_flush >= self.flush_every_s:
                    self._flush()
                    dirty = False
                    last_flush = time.monotonic()
            except BaseException as exc:  # reported to the training thread on its next call
                if self.error is None:
                    self.error = exc
            if kind == "stop":
                for closer in [s.close for s in self.sinks] + (
                    [self.file.close] if self.file is not None else []
                ):
                    try:
                        closer()
                    except BaseException as exc:
                        if self.error is None:
                            self.error = exc
            if kind in ("flush", "stop"):
                payload.set()
            if kind == "stop":
                return

    def flush(self) -> None:
        done = threading.Event()
        self.put("flush", done)
        done.wait()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        done = threading.Event()
        self.put("stop", done)
        done.wait()
        self.thread.join()


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
            raise ValueError(f"window must be a positive integer, got {window!r}")
        if not flush_every_s > 0:
            raise ValueError(f"flush_every_s must be > 0, got {flush_every_s!r}")
        if not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue must be a positive integer, got {max_queue!r}")
        if mode not in ("a", "w"):
            raise ValueError(f"mode must be 'a' or 'w', got {mode!r}")
        self.shares = None if bucket_shares is None else _normalise_shares(bucket_shares)
        if num_buckets is not None and (not isinstance(num_buckets, int) or num_buckets < 1):
            raise ValueError(f"num_buckets must be a positive integer, got {num_buckets!r}")
        self.num_buckets = num_buckets or (
            max(self.shares) + 1 if self.shares is not None else None
        )
        self.window = window
        self._process_group = process_group
        info = group_info(process_group)
        self.rank = rank if rank is not None else (info.rank if info else 0)
        self.world_size = world_size if world_size is not None else (
            info.world_size if info else 1
        )
        self._micro: list[tuple[Any, int | None, int | None, int | None, int | None]] = []
        self._windows: dict[int, deque[tuple[int, float, float]]] = {}
        self._observed: dict[int, float] = {}
        self._last_step: int | None = None
        self._t_prev = time.perf_counter()
        self.skipped_total = 0
        self.steps_logged = 0
        self.path = None if path is None else Path(path)
        self._writer: _Writer | None = None
        if self.rank == 0:
            sinks: list[Any] = []
            try:
                if tensorboard_dir is not None:
                    sinks.append(_TensorBoardSink(tensorboard_dir))
                if wandb:
                    sinks.append(_WandbSink(dict(wandb) if isinstance(wandb, dict) else {}))
            except BaseException:
                for sink in sinks:
                    sink.close()
                raise
            self._writer = _Writer(self.path, sinks, float(flush_every_s), max_queue, mode)
            atexit.register(self._writer.close)

    # -- recording -------------------------------------------------------------------------
    def record_micro(
        self,
        *,
        loss: Any = None,
        real_tokens: Any = None,
        padded_tokens: Any = None,
        samples: Any = None,
        bucket: Any = None,
    ) -> None:
        """Record one micro-batch of the current optimizer step.

        ``loss`` is the micro-batch's mean loss per real token (a float or a scalar
        tensor; tensors are read at :meth:`step`, so recording does not synchronise
        the device). Everything is optional; missing counts are left out of the record.

        Example::

            >>> log = StepLogger(None)
            >>> log.record_micro(loss=2.0, real_tokens=100, padded_tokens=128, samples=4, bucket=3)
            >>> log.step(0)["padding_efficiency"]
            0.78125
            >>> log.close()
        """
        self._check_open()
        if loss is not None and _is_tensor(loss):
            if loss.numel() != 1:
                raise ValueError(f"loss must be a scalar, got shape {tuple(loss.shape)}")
            loss = loss.detach()
        elif loss is not None:
            loss = _to_float(loss, "loss")
        b = _to_bucket(bucket)
        if b is not None:
            if self.shares is not None and b not in self.shares:
                raise ValueError(
                    f"bucket {b} has no entry in bucket_shares (buckets {sorted(self.shares)})"
                )
            if self.num_buckets is not None and b >= self.num_buckets:
                raise ValueError(f"bucket {b} is not below num_buckets={self.num_buckets}")
            if self.num_buckets is None and b >= _DEFAULT_NUM_BUCKETS:
                info = group_info(self._process_group)
                if info is not None and info.world_size > 1:
                    self._capacity([b])  # raises: per-bucket sums travel in a fixed-size vector
        self._micro.append(
            (
                loss,
                _to_count(real_tokens, "real_tokens"),
                _to_count(padded_tokens, "padded_tokens"),
                _to_count(samples, "samples"),
                b,
            )
        )

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
        lengths = {name: len(value) for name, value in columns.items() if _is_column(value)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"per-micro-batch lists differ in length: {lengths}")
        n = next(iter(lengths.values())) if lengths else int(
            any(v is not None for v in columns.values())
        )

        def pick(name: str, i: int) -> Any:
            value = columns[name]
            return value[i] if name in lengths else value

        for i in range(n):
            self.record_micro(
                loss=pick("losses", i), real_tokens=pick("real_tokens", i),
                padded_tokens=pick("padded_tokens", i), samples=pick("samples", i),
                bucket=pick("buckets", i),
            )
        return self.step(step, epoch=epoch, loss=loss, lr=lr, grad_norm=grad_norm,
                         skipped=skipped, **fields)

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
            raise ValueError(f"extra fields must not reuse record keys: {sorted(clash)}")
        if step is None:
            step = 0 if self._last_step is None else self._last_step + 1
        step = _to_count(step, "step")
        micro, self._micro = self._micro, []
        user_loss = _to_float(loss, "loss")
        info = group_info(self._process_group)
        distributed = info is not None and info.world_size > 1
        vec = self._local_vector(micro, user_loss, distributed)
        if distributed:
            vec = self._reduce(vec, info)
        now = time.perf_counter()
        seconds = now - self._t_prev
        self._t_prev = now
        rec = self._build_record(vec, step, epoch, lr, grad_norm, bool(skipped), seconds)
        rec.update(fields)
        self._last_step = step
        self.steps_logged += 1
        if self._writer is not None:  # a copy: the caller may change the returned record
            self._writer.put("record", {**rec, "buckets": list(rec["buckets"]),
                                        "bucket_loss": dict(rec["bucket_loss"])})
        return rec

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        """Write a free-form event line ``{"event": name, "time": ..., **fields}`` (rank 0).

        Example::

            >>> log = StepLogger(None)
            >>> log.event("checkpoint_begin", step=100)["event"]
            'checkpoint_begin'
            >>> log.close()
        """
        self._check_open()
        if not isinstance(name, str) or not name:
            raise ValueError(f"event name must be a non-empty string, got {name!r}")
        if "event" in fields or "time" in fields:
            raise ValueError("event fields must not be named 'event' or 'time'")
        rec = {"event": name, "time": time.time(), **fields}
        if self._writer is not None:
            self._writer.put("event", dict(rec))
        return rec

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

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this StepLogger is closed")
        self._raise_writer_error()

    def _raise_writer_error(self) -> None:
        if self._writer is not None and self._writer.error is not None:
            raise RuntimeError("writing the training log failed") from self._writer.error

    def _capacity(self, buckets: list[int]) -> int:
        if self.num_buckets is not None:
            return self.num_buckets
        top = max(buckets, default=-1)
        if top >= _DEFAULT_NUM_BUCKETS:
            raise ValueError(
                f"bucket {top} is not below {_DEFAULT_NUM_BUCKETS}; pass num_buckets= "
                "(or bucket_shares=) to StepLogger for more buckets under torch.distributed"
            )
        return _DEFAULT_NUM_BUCKETS

    def _local_vector(self, micro: list[tuple], user_loss: float | None,
                      distributed: bool) -> np.ndarray:
        losses = _read_losses([m[0] for m in micro])
        buckets = [m[4] for m in micro if m[4] is not None]
        size = (self._capacity(buckets) if distributed else max(buckets, default=-1) + 1)
        vec = np.zeros(_FIXED + _PER_BUCKET * size, dtype=np.float64)
        for loss, (_, real, padded, samples, bucket) in zip(losses, micro, strict=True):
            weight = 1.0 if real is None else float(real)
            vec[_F_MICRO] += 1
            for value, total, count in ((real, _F_REAL, _F_REAL_N), (padded, _F_PAD, _F_PAD_N),
                                        (samples, _F_SAMP, _F_SAMP_N)):
                if value is not None:
                    vec[total] += value
                    vec[count] += 1
            if loss is not None and user_loss is None:
                vec[_F_LWSUM] += loss * weight
                vec[_F_LW] += weight
            if bucket is not None:
                base = _FIXED + _PER_BUCKET * bucket
                vec[base + 2] += 1
                vec[base + 3] += weight
                if loss is not None and math.isfinite(loss):
                    vec[base] += loss * weight
                    vec[base + 1] += weight
        if user_loss is not None:
            weight = vec[_F_REAL] if vec[_F_REAL_N] and vec[_F_REAL] > 0 else 1.0
            vec[_F_LWSUM] = user_loss * weight
            vec[_F_LW] = weight
        return vec

    def _reduce(self, vec: np.ndarray, info: GroupInfo) -> np.ndarray:
        import torch

        tensor = torch.from_numpy(vec).to(info.device())
        info.dist.all_reduce(tensor, op=info.dist.ReduceOp.SUM, group=info.group)
        return tensor.cpu().numpy()

    def _build_record(self, vec: np.ndarray, step: int, epoch: Any, lr: Any, grad_norm: Any,
                      skipped: bool, seconds: float) -> dict[str, Any]:
        def count(total: int, n: int) -> int | None:
            return int(round(vec[total])) if vec[n] > 0 else None

        real = count(_F_REAL, _F_REAL_N)
        padded = count(_F_PAD, _F_PAD_N)
        per_bucket = vec[_FIXED:].reshape(-1, _PER_BUCKET)
        present = [int(b) for b in np.flatnonzero(per_bucket[:, 2] > 0)]
        for b in present:
            self._observed[b] = self._observed.get(b, 0.0) + float(per_bucket[b, 3])
            if not skipped and per_bucket[b, 1] > 0:
                self._windows.setdefault(b, deque()).append(
                    (self.steps_logged, float(per_bucket[b, 0]), float(per_bucket[b, 1]))
                )
        oldest = self.steps_logged - self.window  # entries at or before this index expire
        for entries in self._windows.values():
            while len(entries) > _MIN_ENTRIES and entries[0][0] <= oldest:
                entries.popleft()
        if skipped:
            self.skipped_total += 1
        bucket_loss = {b: _window_mean(w) for b, w in sorted(self._windows.items())}
        return {
            "step": step,
            "epoch": None if epoch is None else _to_count(epoch, "epoch"),
            "loss": float(vec[_F_LWSUM] / vec[_F_LW]) if vec[_F_LW] > 0 else None,
            "lr": _to_float(lr, "lr"),
            "grad_norm": _to_float(grad_norm, "grad_norm"),
            "real_tokens": real,
            "padded_tokens": padded,
            "padding_efficiency": real / padded if real is not None and padded else None,
            "tokens_per_second": real / seconds if real is not None and seconds > 0 else None,
            "seconds": seconds,
            "samples": count(_F_SAMP, _F_SAMP_N),
            "micro_batches": int(round(vec[_F_MICRO])),
            "buckets": present,
            "bucket_loss": {str(b): v for b, v in bucket_loss.items()},
            "corrected_loss": self._corrected(bucket_loss),
            "skipped": skipped,
            "skipped_total": self.skipped_total,
            "time": time.time(),
        }

    def _corrected(self, bucket_loss: dict[int, float]) -> float | None:
        shares = self.shares if self.shares is not None else self._observed
        weights = {b: shares.get(b, 0.0) for b in bucket_loss}
        total = sum(weights.values())
        if total <= 0:
            return None
        return sum(weights[b] * loss for b, loss in bucket_loss.items()) / total


def _is_column(value: Any) -> bool:
    if isinstance(value, np.ndarray) or _is_tensor(value):
        return value.ndim == 1
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _window_mean(window: deque[tuple[int, float, float]]) -> float:
    return sum(s for _, s, _ in window) / sum(w for _, _, w in window)


def _read_losses(raw: list[Any]) -> list[float | None]:
    """Turn recorded losses into floats, reading all tensors with one device transfer."""
    tensors = [x for x in raw if _is_tensor(x)]
    if not tensors:
        return list(raw)
    import torch

    try:
        values = iter(torch.stack([t.reshape(()).float() for t in tensors]).cpu().tolist())
    except RuntimeError:  # tensors on different devices
        values = iter([float(t.item()) for t in tensors])
    return [next(values) if _is_tensor(x) else x for x in raw]
