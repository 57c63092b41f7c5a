"""``lengthwise doctor --watch LOG``: follow a growing log and print each new finding once.

A cause is printed the first time it shows, and again only when it comes back after
``cooldown`` seconds; at the end the watcher prints the findings shown and the last verdict.

Example::

    >>> import io, json, tempfile
    >>> from pathlib import Path
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> log = Path(tempfile.mkdtemp()) / "train_log.jsonl"
    >>> _ = log.write_text("".join(
    ...     json.dumps({"step": s, "loss": 3.0 - 0.4 * b + 0.05 * rng.standard_normal(),
    ...                 "bucket": b}) + "\\n"
    ...     for s, b in enumerate(rng.integers(0, 3, 1500).tolist(), 1)))
    >>> out = io.StringIO()
    >>> w = Watcher(log, out=out)
    >>> w.poll(now=0.0), w.poll(now=1.0)  # the second look finds nothing new
    (True, False)
    >>> out.getvalue().splitlines()[0].startswith("[step 1500] 3 loss bands")
    True
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from lengthwise.doctor.analyses import diagnose as diagnose_log
from lengthwise.doctor.errors import LogError, LogNotFoundError

__all__ = ["Watcher", "watch"]

#: seconds between looks at the log unless ``--interval`` says otherwise
DEFAULT_INTERVAL = 10.0
#: seconds before a finding that went away is printed again when it comes back
DEFAULT_COOLDOWN = 300.0
#: the longest ``--interval``, ``--max-seconds`` or ``--cooldown`` taken: a year
MAX_SECONDS = 365 * 24 * 3600.0


class Watcher:
    """Diagnoses a log each time it changes and prints the findings not printed before."""

    def __init__(self, path: str | os.PathLike[str], *, options: Mapping[str, Any] | None = None,
                 cooldown: float = DEFAULT_COOLDOWN, out: TextIO | None = None,
                 diagnose: Callable[..., Any] | None = None) -> None:
        self.path = Path(path)
        self.options = dict(options or {})
        self.cooldown = float(cooldown)
        self.out = out if out is not None else sys.stdout
        self._diagnose = diagnose or diagnose_log
        self._signature: tuple[Any, ...] | None = None
        self._shown: dict[str, float] = {}  # cause -> when it was last printed
        self._present: set[str] = set()
        self._waiting: str | None = None
        self._clean_shown = False
        self.report: Any = None
        self.diagnoses = 0
        self.printed = 0

    def poll(self, now: float | None = None) -> bool:
        """Look at the log once; diagnose and print when it changed. True when it changed."""
        now = time.monotonic() if now is None else now
        signature = _signature(self.path)
        if signature == self._signature:
            return False
        try:
            report = self._diagnose(self.path, **self.options)
        except (LogError, LogNotFoundError) as exc:  # not yet readable: say so once
            self._signature = signature
            self._wait(" ".join(str(exc).split()))
            return True
        # only a finished diagnosis marks the log as read: one cut short (Ctrl-C) is redone
        self._signature = signature
        self.report, self._waiting = report, None
        self.diagnoses += 1
        self._print_new(report, now)
        return True

    def summary(self) -> str:
        """The findings printed and the verdict of the last diagnosis (what was not tested)."""
        if self.report is None:
            why = f": {self._waiting}" if self._waiting else ""
            return f"summary: {self.path}: no diagnosis yet{why}"
        step = _last_step(self.report)
        return (f"summary: {self.path}: {self.diagnoses} diagnosis(es), {self.printed} "
                f"finding(s) printed; at step {step}: {self.report.verdict.summary}")

    def _wait(self, why: str) -> None:
        if why != self._waiting:
            self._emit(f"waiting: {why}")
        self._waiting = why

    def _print_new(self, report: Any, now: float) -> None:
        step = _last_step(report)
        names = set()
        for cause in report.verdict.causes:
            names.add(cause.name)
            last = self._shown.get(cause.name)
            back = cause.name not in self._present and last is not None
            if last is None or (back and now - last >= self.cooldown):
                fix = f" -> {cause.fix[0]}" if cause.fix else ""
                self._emit(f"[step {step}] {cause.claim}{fix}")
                self._shown[cause.name] = now
                self.printed += 1
        self._present = names
        if report.verdict.clean is True and not self._clean_shown:
            self._emit(f"[step {step}] clean so far: {report.verdict.summary}")
            self._clean_shown = True
        elif report.verdict.clean is not True:
            self._clean_shown = False

    def _emit(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def watch(path: str | os.PathLike[str], *, interval: float = DEFAULT_INTERVAL,
          max_seconds: float | None = None, cooldown: float = DEFAULT_COOLDOWN,
          options: Mapping[str, Any] | None = None) -> int:
    """Follow the log at ``path`` until ``max_seconds`` (None: until Ctrl-C); the exit status:
    0 when ``max_seconds`` ran out, 130 after Ctrl-C (the summary is printed first)."""
    watcher = Watcher(path, options=options, cooldown=cooldown)
    start = time.monotonic()
    try:
        while True:
            watcher.poll()
            if max_seconds is not None and time.monotonic() - start >= max_seconds:
                break
            wait = interval
            if max_seconds is not None:
                wait = min(wait, max(0.0, max_seconds - (time.monotonic() - start)))
            time.sleep(wait)
        watcher.poll()  # what was written during the last wait
    except KeyboardInterrupt:
        try:  # the summary reads the log as it is now (a second Ctrl-C skips that)
            watcher.poll()
        except KeyboardInterrupt:
            pass
        watcher._emit(watcher.summary())
        return 130
    watcher._emit(watcher.summary())
    return 0


def _signature(path: Path) -> tuple[Any, ...]:
    """What changes when the log grows: size and time of the file, or of a folder's files."""
    try:
        if path.is_dir():
            return tuple(sorted((str(p), st.st_size, st.st_mtime_ns)
                                for p in path.rglob("*") if p.is_file()
                                for st in (p.stat(),)))
        st = path.stat()
    except OSError:
        return ("missing",)
    return (st.st_size, st.st_mtime_ns)


def _last_step(report: Any) -> str:
    series = report.series
    if series is None or not series.step.size:
        return "-"
    return f"{float(series.step[-1]):g}"
