"""Per-order results of a GPU benchmark, on disk as soon as each order is measured.

:class:`OrderResults` keeps a benchmark's summary (``OUT.json``) and its table
(``OUT.md``) up to date: both are rewritten atomically (:mod:`lengthwise.atomic`)
after every order, so a crash, an out-of-memory error or a time-out in one order
loses only that order. An order that raises an ``Exception`` is recorded under
``failed`` with its message and the next order runs. With a time budget (seconds
from the start of the script), an order is skipped, and recorded under
``skipped`` with the reason, when the time spent plus the longest order measured
so far would exceed it.

Example::

    >>> import tempfile
    >>> out, now = Path(tempfile.mkdtemp()) / "bench", [0.0]
    >>> def measure(order):
    ...     now[0] += 60.0  # a minute per order
    ...     return {"tokens_per_second": 5.0}
    >>> res = OrderResults(out, {"device": "cpu"}, lambda s: "table\\n", budget=100.0,
    ...                    clock=lambda: now[0])
    >>> res.run("sorted", measure)
    >>> res.run("random", measure)
    >>> sorted(json.loads(out.with_suffix(".json").read_text())["strategies"])
    ['sorted']
    >>> res.summary["skipped"]["random"]
    'time budget: 60 s spent, an order takes about 60 s, 40 s left of 100 s'
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lengthwise.atomic import atomic_open
from lengthwise.demo.report import add_ratios

__all__ = ["OrderResults"]


class OrderResults:
    """A benchmark's per-order rows, skipped and failed orders, written after each order."""

    def __init__(self, out: str | Path, header: dict[str, Any],
                 render: Callable[[dict[str, Any]], str], *, budget: float | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 started: float | None = None) -> None:
        self.out = Path(out)
        self.header = dict(header)
        self.render = render
        self.budget = budget
        self.clock = clock
        self.started = clock() if started is None else started  # the budget's start
        self.rows: dict[str, dict[str, Any]] = {}
        self.seconds: dict[str, float] = {}
        self.skipped: dict[str, str] = {}
        self.failed: dict[str, str] = {}

    @property
    def summary(self) -> dict[str, Any]:
        """The header, the rows with their ratios, the skipped and failed orders."""
        rows = add_ratios({k: dict(v) for k, v in self.rows.items()})
        for row in rows.values():
            row.pop("roughness_ratio", None)
        return {**self.header, "wall_seconds": self.clock() - self.started,
                "time_budget_seconds": self.budget, "strategies": rows,
                "order_seconds": dict(self.seconds), "skipped": dict(self.skipped),
                "failed": dict(self.failed)}

    def skip_reason(self) -> str | None:
        """Why the next order would not fit the time budget (``None``: run it)."""
        if self.budget is None:
            return None
        spent = self.clock() - self.started
        per_order = max(self.seconds.values(), default=0.0)
        if spent + per_order <= self.budget:
            return None
        return (f"time budget: {spent:.0f} s spent, an order takes about {per_order:.0f} s, "
                f"{max(self.budget - spent, 0):.0f} s left of {self.budget:.0f} s")

    def run(self, order: str, measure: Callable[[str], dict[str, Any]]) -> None:
        """Its row ``measure(order)`` unless it would not fit the budget; then the files."""
        reason = self.skip_reason()
        if reason is not None:
            self.skipped[order] = reason
        else:
            began = self.clock()
            try:
                self.rows[order] = measure(order)
            except Exception as exc:  # an OOM in one order must not lose the others
                self.failed[order] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
            self.seconds[order] = self.clock() - began
        self.write()

    def write(self) -> dict[str, Any]:
        """Rewrite ``OUT.json`` and ``OUT.md`` (each whole or not at all); the summary."""
        summary = self.summary
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(self.out.with_suffix(".json"), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(summary, indent=2, default=float) + "\n")
        notes = [f"- {name}: skipped ({why})" for name, why in summary["skipped"].items()]
        notes += [f"- {name}: failed ({why})" for name, why in summary["failed"].items()]
        text = self.render(summary) + ("\n" + "\n".join(notes) + "\n" if notes else "")
        with atomic_open(self.out.with_suffix(".md"), "w", encoding="utf-8") as fh:
            fh.write(text)
        return summary
