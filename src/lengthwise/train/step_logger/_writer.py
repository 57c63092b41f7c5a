"""The background thread that appends records to the log file and feeds the sinks.

Example::

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "log.jsonl"
    >>> writer = LogWriter(path, [], flush_every_s=1.0, max_queue=10, mode="a")
    >>> writer.put("record", {"step": 1}); writer.close()
    >>> path.read_text()
    '{"step": 1}\\n'
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise.train.step_logger._values import is_tensor


def json_default(x: Any) -> Any:
    """NumPy scalars and arrays, tensors and paths as JSON values.

    Example::

        >>> json.dumps({"n": np.int64(3), "p": Path("a")}, default=json_default)
        '{"n": 3, "p": "a"}'
    """
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if is_tensor(x):
        return x.detach().cpu().tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} to the training log")


class LogWriter:
    """Background thread that appends records to the file and feeds the sinks.

    :meth:`put` queues ``("record" | "event", dict)``; the file is flushed at least
    every ``flush_every_s`` while records arrive. An error on the thread is kept in
    ``error`` for the training thread to raise.
    """

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
        """Queue one item; blocks only while ``max_queue`` items wait."""
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
                        self.file.write(json.dumps(payload, default=json_default) + "\n")
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
