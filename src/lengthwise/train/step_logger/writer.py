"""The background thread that appends records to the log file and feeds the sinks.

The sinks forward records to TensorBoard and Weights & Biases: a sink has
``record(rec)``, ``event(rec)``, ``flush()`` and ``close()``; both libraries are
imported only when asked for.

Records are serialised on the caller's thread (:func:`json_line`), so a value JSON
cannot hold fails at the call that passed it; the thread only writes lines. After
every flush it checks that the path still names the file it writes to: a log file
deleted, moved or replaced while the run goes on is reopened at its path and the
lines written since the previous check are written again, so no record is lost.

Example::

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "log.jsonl"
    >>> writer = LogWriter(path, [], flush_every_s=1.0, max_queue=10, mode="a")
    >>> rec = {"step": 1}
    >>> writer.put("record", (json_line(rec, "step"), rec)); writer.close()
    >>> path.read_text()
    '{"step": 1}\\n'
"""

from __future__ import annotations

import json
import numbers
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.errors import MissingDependencyError
from lengthwise.finite_json import finite_json_line
from lengthwise.train.step_logger.record import is_tensor


def json_default(x: Any) -> Any:
    """NumPy scalars and arrays, tensors and paths as JSON values."""
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.integer | np.bool_ | np.ndarray):
        return x.tolist()
    if is_tensor(x):
        return x.detach().cpu().tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"JSON cannot hold a {type(x).__module__}.{type(x).__qualname__}")


def json_line(rec: dict[str, Any], call: str) -> str:
    """``rec`` as one line of standard JSON; a value JSON cannot hold raises ``TypeError``.

    ``call`` names the method the value came through, for the message. A non-finite
    number (NaN, infinity), which JSON has no literal for, is written as ``null`` and
    named with its value in the line's ``non_finite`` field
    (:func:`~lengthwise.finite_json.finite_record`).

    Example::

        >>> json_line({"step": 1, "tags": ["a"]}, "step")
        '{"step": 1, "tags": ["a"]}'
        >>> json_line({"step": 2, "loss": float("nan")}, "step")
        '{"step": 2, "loss": null, "non_finite": {"loss": "nan"}}'
        >>> try:
        ...     json_line({"step": 1, "tags": {"a"}}, "step")
        ... except TypeError as exc:
        ...     print(str(exc).split(";")[0])
        step(tags=...): JSON cannot hold a builtins.set
    """
    try:
        return finite_json_line(rec, json_default)
    except (TypeError, ValueError):
        pass
    for key, value in rec.items():
        try:
            finite_json_line({key: value}, json_default)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{call}({key}=...): {exc}; pass numbers, strings, lists or dicts of them "
                "(nothing was logged by this call)"
            ) from exc
    raise TypeError(f"{call}: the record cannot be written as JSON")  # pragma: no cover


def _file_id(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``path``, ``None`` when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def open_log(path: Path, mode: str) -> Any:
    """Open the log file for writing, creating its folders; clear errors for a bad path.

    Example::

        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "afile").write_text("x")
        1
        >>> try:
        ...     open_log(folder / "afile" / "log.jsonl", "a")
        ... except NotADirectoryError as exc:
        ...     print(str(exc).endswith("afile is a file, not a folder"))
        True
    """
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(
                    f"cannot create the training log {path}: {parent} is a file, not a folder"
                )
            break
    if path.is_dir():
        raise IsADirectoryError(
            f"the training log {path} is a folder; give a file path such as "
            f"{path / 'train_log.jsonl'}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, mode, encoding="utf-8")  # noqa: SIM115 - closed by the writer thread


class LogWriter:
    """Background thread that appends records to the file and feeds the sinks.

    :meth:`put` queues ``("record" | "event", (line, record))``; the file is flushed
    at least every ``flush_every_s`` while records arrive. An error on the thread is
    kept in ``error`` for the training thread to raise; each reopening of a vanished
    log file is counted in ``reopened`` and described in ``notices``.
    """

    def __init__(self, path: Path | None, sinks: list[Any], flush_every_s: float,
                 max_queue: int, mode: str) -> None:
        self.path = None if path is None else path.absolute()
        self.file = None
        self._file_id: tuple[int, int] | None = None
        if self.path is not None:
            self.file = open_log(self.path, mode)
            self._file_id = _file_id(self.path)
        self._unchecked: list[str] = []  # lines written since the file was last seen in place
        self.reopened = 0
        self.notices: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.sinks = sinks
        self.flush_every_s = flush_every_s
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max_queue)
        self.error: BaseException | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="lengthwise-step-logger",
                                       daemon=True)
        self.thread.start()

    def put(self, kind: str, payload: Any) -> None:
        """Queue one item; blocks only while ``max_queue`` items wait."""
        self.queue.put((kind, payload))

    def _write(self, kind: str, line: str, rec: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(line + "\n")
            self._unchecked.append(line)
        for sink in self.sinks:
            getattr(sink, kind)(rec)

    def _flush(self) -> None:
        if self.file is not None:
            self.file.flush()
            self._check_in_place()
        for sink in self.sinks:
            sink.flush()

    def _check_in_place(self) -> None:
        """Reopen the log if its path no longer names the open file; rewrite unchecked lines."""
        assert self.path is not None and self.file is not None
        now = _file_id(self.path)
        if now is not None and now == self._file_id:
            self._unchecked.clear()
            return
        lines, self._unchecked = self._unchecked, []
        old = self.file
        self.file = None
        try:
            old.close()
        except OSError:
            pass
        self.file = open_log(self.path, "a")
        self._file_id = _file_id(self.path)
        self.reopened += 1
        what = "was deleted or moved" if now is None else "was replaced by another file"
        note = {"event": "log_reopened", "time": time.time(), "reason": what,
                "rewritten_lines": len(lines)}
        for line in [json.dumps(note, allow_nan=False), *lines]:
            self.file.write(line + "\n")
        self.file.flush()
        self._file_id = _file_id(self.path)
        self.notices.put(
            f"the training log {self.path} {what} while the run was writing it; it was "
            f"reopened and the {len(lines)} line(s) since the last flush were written again"
        )

    def rewrite(self, change: Callable[[Path], Any]) -> Any:
        """Run ``change(path)`` on this thread, with the log file closed, and return its result.

        Everything queued before is written first; the file is opened again (appending)
        afterwards, also when ``change`` raises (its error is raised here).
        """
        done = threading.Event()
        box: list[Any] = []
        self.put("rewrite", (change, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _rewrite(self, change: Callable[[Path], Any], box: list[Any]) -> None:
        assert self.path is not None and self.file is not None
        self._flush()
        self.file.close()
        try:
            box.append(change(self.path))
        except BaseException as exc:
            box.append(exc)
        finally:
            self.file = open_log(self.path, "a")
            self._file_id = _file_id(self.path)
            self._unchecked.clear()

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
                    self._write(kind, *payload)
                    dirty = True
                elif kind == "rewrite":
                    change, box, done = payload
                    try:
                        self._rewrite(change, box)
                    finally:
                        done.set()
                if kind in ("flush", "stop") or (
                        dirty and time.monotonic() - last_flush >= self.flush_every_s):
                    self._flush()
                    dirty = False
                    last_flush = time.monotonic()
            except BaseException as exc:  # reported to the training thread on its next call
                if self.error is None:
                    self.error = exc
            if kind == "stop":
                self._close_all()
            if kind in ("flush", "stop"):
                payload.set()
            if kind == "stop":
                return

    def _close_all(self) -> None:
        closers = [s.close for s in self.sinks]
        if self.file is not None:
            closers.append(self.file.close)
        for closer in closers:
            try:
                closer()
            except BaseException as exc:
                if self.error is None:
                    self.error = exc

    def flush(self) -> None:
        """Block until everything queued so far is written and flushed."""
        done = threading.Event()
        self.put("flush", done)
        done.wait()

    def close(self) -> None:
        """Write what is queued, close the sinks and the file, and end the thread. Idempotent."""
        if self.closed:
            return
        self.closed = True
        done = threading.Event()
        self.put("stop", done)
        done.wait()
        self.thread.join()


def numeric_items(rec: dict[str, Any]) -> list[tuple[str, float]]:
    """The record's numeric fields as floats, without ``step``, ``time`` and ``event``."""
    skip = {"step", "time", "event"}
    return [(k, float(v)) for k, v in rec.items()
            if k not in skip and isinstance(v, numbers.Real)]


class TensorBoardSink:
    """Scalars ``train/<field>``, ``bucket_loss/<bucket>`` and ``event/<name>/<field>``."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(
                "tensorboard_dir needs torch and tensorboard: pip install torch tensorboard"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(logdir))

    def record(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        for key, value in numeric_items(rec):
            self.writer.add_scalar(f"train/{key}", value, step)
        for bucket, value in rec.get("bucket_loss", {}).items():
            self.writer.add_scalar(f"bucket_loss/{bucket}", value, step)

    def event(self, rec: dict[str, Any]) -> None:
        step = rec.get("step")
        if not isinstance(step, int):
            return
        for key, value in numeric_items(rec):
            self.writer.add_scalar(f"event/{rec['event']}/{key}", value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One ``wandb.log`` per step; reuses an existing ``wandb.run``, else starts (and ends) one."""

    def __init__(self, init_kwargs: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise MissingDependencyError(
                "wandb=True needs the wandb package: pip install wandb"
            ) from exc
        self.wandb = wandb
        self.owns_run = wandb.run is None
        if self.owns_run:
            wandb.init(**init_kwargs)

    def record(self, rec: dict[str, Any]) -> None:
        data = {f"train/{key}": value for key, value in numeric_items(rec)}
        data.update({f"bucket_loss/{b}": v for b, v in rec.get("bucket_loss", {}).items()})
        self.wandb.log(data, step=rec["step"])

    def event(self, rec: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.owns_run:
            self.wandb.finish()


def open_sinks(tensorboard_dir: str | os.PathLike | None,
               wandb: bool | dict[str, Any]) -> list[Any]:
    """The sinks asked for; if one fails to open, those already open are closed."""
    sinks: list[Any] = []
    try:
        if tensorboard_dir is not None:
            sinks.append(TensorBoardSink(tensorboard_dir))
        if wandb:
            sinks.append(WandbSink(dict(wandb) if isinstance(wandb, dict) else {}))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks
