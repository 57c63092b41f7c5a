"""Precision and recall of each finding of ``lengthwise doctor`` over labelled simulated logs.

The labelled set comes from :func:`lengthwise.doctor.simulate.labelled_set`: every
batching order (random, bucket-random, stratified, sorted mega-batches) with
checkpoint spikes, random spikes and NaN losses, three seeds each, including
deliberately hard cases (weak length effects, low spikes). Each run is written
as a JSON-lines file and diagnosed from disk, like a user would. The script
also times reading a million-line log, and runs the doctor over the real logs
of ``../shared/data/real_logs`` when that folder exists. It writes
``benchmarks/DOCTOR_RESULTS.md``::

    python benchmarks/doctor_accuracy.py            # the published run (~2-3 minutes)
    python benchmarks/doctor_accuracy.py --quick    # smaller: DOCTOR_RESULTS.quick.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lengthwise import __version__
from lengthwise.doctor import diagnose, one_line_verdict
from lengthwise.doctor.readers import jsonl as jsonl_reader
from lengthwise.doctor.readers import read_log
from lengthwise.doctor.simulate import labelled_set

HERE = Path(__file__).resolve().parent
REAL_LOGS = HERE.parent.parent / "shared" / "data" / "real_logs"
#: a detected cliff matches a true spike starting within this many steps
CLIFF_TOLERANCE = 3
#: a period is right within this relative error
PERIOD_TOLERANCE = 0.05


class Tally:
    """True/false positives and false negatives of one finding."""

    def __init__(self) -> None:
        self.tp = self.fp = self.fn = self.tn = 0

    def add(self, truth: bool, found: bool) -> None:
        self.tp += truth and found
        self.fp += (not truth) and found
        self.fn += truth and not found
        self.tn += (not truth) and not found

    def row(self, name: str) -> str:
        p = self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")
        r = self.tp / (self.tp + self.fn) if self.tp + self.fn else float("nan")
        return (f"| {name} | {self.tp + self.fn} | {self.tp} | {self.fp} | {self.fn} | {self.tn} "
                f"| {_f(p)} | {_f(r)} |")


def _f(x: float) -> str:
    return "-" if x != x else f"{x:.3f}"


def score_runs(runs: list[tuple[str, Any]], workdir: Path) -> tuple[dict[str, Tally], list[str]]:
    """Diagnose every labelled run from disk and tally each finding."""
    t: dict[str, Tally] = {k: Tally() for k in (
        "banded (bands >= 2)", "band count exact (banded runs)", "periodic", "period within 5%",
        "cliff events", "checkpoint-associated = true", "checkpoint-associated = false",
        "non-finite loss", "bucket explains (R^2 >= 0.2, p < 0.01)", "verdict clean")}
    rows = []
    for name, run in runs:
        path = run.write(workdir / f"{name}.jsonl")
        start = time.perf_counter()
        report = diagnose(path)
        seconds = time.perf_counter() - start
        lab = run.labels
        banded_true = lab["bands"] >= 2
        count = report.bands.count or 1
        t["banded (bands >= 2)"].add(banded_true, count >= 2)
        if banded_true:
            t["band count exact (banded runs)"].add(True, count == lab["bands"])
        period = report.periodicity.period
        t["periodic"].add(lab["period"] is not None, period is not None)
        if lab["period"] is not None:
            ok = period is not None and abs(period - lab["period"]) <= PERIOD_TOLERANCE * lab[
                "period"]
            t["period within 5%"].add(True, ok)
        found = [c.step for c in report.cliffs]
        truth = lab["cliffs"]
        matched = [any(abs(f - s) <= CLIFF_TOLERANCE for s in truth) for f in found]
        hit = [any(abs(f - s) <= CLIFF_TOLERANCE for f in found) for s in truth]
        c = t["cliff events"]
        c.tp += sum(hit)
        c.fn += len(hit) - sum(hit)
        c.fp += len(matched) - sum(matched)
        assoc = report.checkpoint_association.associated
        if lab["checkpoint_associated"] is not None:
            t["checkpoint-associated = true"].add(lab["checkpoint_associated"] is True,
                                                  assoc is True)
            t["checkpoint-associated = false"].add(lab["checkpoint_associated"] is False,
                                                   assoc is False)
        t["non-finite loss"].add(lab["nonfinite"], report.stats.nonfinite.count > 0)
        if lab["bucket_logged"] and report.attribution.bucket_r2 is not None:
            t["bucket explains (R^2 >= 0.2, p < 0.01)"].add(
                banded_true or lab["period"] is not None, report.attribution.bucket_explains)
        clean_truth = (not banded_true and lab["period"] is None and not truth
                       and not lab["nonfinite"])
        t["verdict clean"].add(clean_truth, report.verdict is not None and report.verdict.clean)
        rows.append(
            f"| {name} | {lab['bands']} | {count} | {lab['period'] or '-'} | "
            f"{_g(period)} | {len(truth)} | {len(found)} | "
            f"{_b(lab['checkpoint_associated'])} | {_b(assoc)} "
            f"({_g(report.checkpoint_association.p_value)}) | {seconds:.2f} |"
        )
    return t, rows


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _b(x: bool | None) -> str:
    return {True: "true", False: "false", None: "null"}[x]


def write_big_log(path: Path, lines: int, seed: int = 0) -> None:
    """A log of ``lines`` step rows in the project's logger format (streamed to disk)."""
    rng = np.random.default_rng(seed)
    block = 100_000
    with open(path, "w") as f:
        for start in range(0, lines, block):
            n = min(block, lines - start)
            step = np.arange(start + 1, start + n + 1)
            loss = 2.0 + 0.05 * rng.standard_normal(n)
            bucket = rng.integers(0, 6, n)
            tokens = rng.integers(20_000, 32_000, n)
            f.write("".join(
                f'{{"step": {s}, "epoch": 0, "loss": {lo:.6f}, "lr": 0.0003, '
                f'"grad_norm": 0.51, "real_tokens": {t}, "padded_tokens": 32768, '
                f'"tokens_per_second": 25000.5, "samples": 16, "buckets": [{b}], '
                f'"corrected_loss": {lo:.6f}}}\n'
                for s, lo, t, b in zip(step.tolist(), loss.tolist(), tokens.tolist(),
                                       bucket.tolist(), strict=True)))


def time_reading(lines: int, workdir: Path) -> list[str]:
    """Seconds to read (and to diagnose) a log of ``lines`` lines, and per-line json.loads."""
    path = workdir / "big.jsonl"
    write_big_log(path, lines)
    size = path.stat().st_size

    def clock(fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def per_line() -> None:
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)

    baseline = clock(per_line)
    fast = clock(lambda: read_log(path))
    original = jsonl_reader._fast_loads
    jsonl_reader._fast_loads = lambda: json.loads
    try:
        stdlib = clock(lambda: read_log(path))
    finally:
        jsonl_reader._fast_loads = original
    full = clock(lambda: diagnose(path))
    try:
        import orjson  # noqa: F401

        accel = "orjson installed"
    except ImportError:
        accel = "orjson not installed: both rows use the standard library"
    return [
        f"A {lines:,}-line log in the step logger's format ({size / 2**20:.0f} MiB, "
        f"one bucket per step); {accel}.",
        "",
        "| what | seconds | vs. json.loads per line |",
        "|---|---|---|",
        f"| `json.loads` on every line, nothing else (reference) | {baseline:.2f} | 1.00 |",
        f"| `read_log`, standard-library parser | {stdlib:.2f} | {stdlib / baseline:.2f} |",
        f"| `read_log`, fast parser when installed | {fast:.2f} | {fast / baseline:.2f} |",
        f"| `diagnose` (read + every analysis) | {full:.2f} | {full / baseline:.2f} |",
    ]


def real_log_rows() -> list[str]:
    """One row per real log: what the doctor says about it."""
    if not REAL_LOGS.is_dir():
        return [f"`{REAL_LOGS}` is not present: skipped."]
    rows = ["| log | steps | stable region | bands | period (steps) | cliffs | roughness | "
            "verdict |", "|---|---|---|---|---|---|---|---|"]
    for path in sorted(REAL_LOGS.glob("*.jsonl")):
        r = diagnose(path)
        per = r.periodicity.period
        rows.append(
            f"| {path.name} | {r.input.loss_rows:,} | {r.phases.start:g}..{r.phases.end:g} | "
            f"{r.bands.count if r.bands.count is not None else 'not tested'} | "
            f"{_g(per)} | {len(r.cliffs)} | {r.stats.loss_roughness:.4g} | "
            f"{one_line_verdict(r).replace('|', '/')} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    parser.add_argument("--steps", type=int, default=None, help="steps per simulated run")
    parser.add_argument("--lines", type=int, default=None, help="lines of the timing log")
    parser.add_argument("--out", default=None, help="output markdown path")
    args = parser.parse_args(argv)
    steps = args.steps or (1500 if args.quick else 3000)
    lines = args.lines or (200_000 if args.quick else 1_000_000)
    out = Path(args.out) if args.out else HERE / (
        "DOCTOR_RESULTS.quick.md" if args.quick else "DOCTOR_RESULTS.md")
    runs = labelled_set(seed=0, steps=steps)
    if args.quick:
        runs = [r for r in runs if r[0].endswith("_0")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        tallies, rows = score_runs(runs, work)
        scored = time.perf_counter() - start
        timing = time_reading(lines, work)
    real = real_log_rows()
    head = [
        "# Doctor accuracy",
        "",
        f"Generated by `python benchmarks/doctor_accuracy.py{' --quick' if args.quick else ''}` "
        f"on {_dt.date.today().isoformat()}; do not edit by hand.",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python "
        f"{platform.python_version()}, NumPy {np.__version__}, lengthwise {__version__}.",
        "",
        "## Findings over the labelled simulated set",
        "",
        f"{len(runs)} simulated runs of {steps} steps (`lengthwise.doctor.simulate.labelled_set`, "
        f"seed 0), each written as JSONL and diagnosed from disk in {scored:.0f} s. Labels are "
        "known by construction: the number of bands is the number of clear modes (a valley at "
        "least 20 % deep) of the true per-step loss density of the simulated composition plus "
        "noise; the period is the mega-batch length; cliffs are the injected spikes (matched "
        f"within {CLIFF_TOLERANCE} steps); checkpoint association is true for spikes injected "
        "after saves, false for spikes placed at least 25 steps away from saves. Hard cases are "
        "included on purpose (spikes of 0.15 over step noise ~0.05, a 2-bucket set with a weak "
        "length effect, a weak 200-step sawtooth), so not every figure is 1.",
        "",
        "| finding | positives | TP | FP | FN | TN | precision | recall |",
        "|---|---|---|---|---|---|---|---|",
        *(tally.row(name) for name, tally in tallies.items()),
        "",
        "## Per run",
        "",
        "| run | true bands | found | true period | found | true cliffs | found | "
        "true ckpt assoc | found (p) | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "## Reading speed",
        "",
        *timing,
        "",
        "## Real logs (`../shared/data/real_logs`)",
        "",
        "What the doctor says about real training logs, as it says it (nothing tuned per log).",
        "",
        *real,
        "",
    ]
    out.write_text("\n".join(head))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
