"""Precision and recall of each finding of ``lengthwise doctor``, its false-positive rate by log
length, the error of its noise budget, and what it says about real logs.

* The labelled set comes from :func:`simulated_logs.runs.labelled_set`: every
  batching order (random, bucket-random, stratified, sorted mega-batches) with
  checkpoint spikes, random spikes and NaN losses, three seeds each, including
  deliberately hard cases; plus short logs (40-80 points) and coarsely logged
  ones (every 10 steps, each row the mean of its 10 steps, as Hugging Face logs).
  Each run is written as a JSON-lines file and diagnosed from disk.
* False positives: :func:`simulated_logs.runs.simulate_clean` logs of 30 to
  100,000 points with nothing wrong (AR(1) noise, a schedule change, epoch steps).
* Noise budget: simulated runs with a known per-sample spread.
* Multi-process, per-epoch and aliased cycles: :func:`simulated_logs.hf.simulate_hf_log`
  runs of Hugging Face's length-grouped sampler over 1 to 10 processes, with and
  without ``--world-size``.
* Reading speed of a large log, the real logs of ``../shared/data/real_logs`` and
  the agreement with the labels of ``real_logs2..5`` (``benchmarks/doctor_labels.py``).

It writes ``benchmarks/DOCTOR_RESULTS.md``::

    python benchmarks/doctor_accuracy.py            # the published run (a few minutes)
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
from lengthwise.doctor import diagnose
from lengthwise.doctor.context import apparent_period, megabatch_steps
from lengthwise.doctor.readers import read_log
from lengthwise.doctor.readers import text as jsonl_reader

from simulated_logs.events import (
    dflash_log,
    grad_norm_log,
    with_evals,
    with_resumes,
    with_second_writer,
)
from simulated_logs.hf import simulate_hf_log
from simulated_logs.runs import SimulatedRun, labelled_set, simulate_clean, simulate_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doctor_labels  # noqa: E402  (the labelled real logs, a sibling script)

HERE = Path(__file__).resolve().parent
SHARED_DATA = HERE.parent.parent / "shared" / "data"
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
                       and not lab["nonfinite"] and run.config.get("length_effect", 0) == 0)
        t["verdict clean"].add(clean_truth, report.verdict.clean is True)
        rows.append(
            f"| {name} | {lab['bands']} | {count} | {lab['period'] or '-'} | "
            f"{_g(period)} | {len(truth)} | {len(found)} | "
            f"{_b(lab['checkpoint_associated'])} | {_b(assoc)} "
            f"({_g(report.checkpoint_association.p_value)}) | {seconds:.2f} |"
        )
    return t, rows


def coarse(run: SimulatedRun, every: int) -> SimulatedRun:
    """The run as logged every ``every`` steps: each row the mean loss of its steps (no bucket)."""
    rows = [r for r in run.records if "loss" in r]
    out = []
    for end in range(every, len(rows) + 1, every):
        block = rows[end - every : end]
        out.append({"step": block[-1]["step"], "loss": float(np.mean([r["loss"] for r in block])),
                    "lr": block[-1]["lr"], "epoch": block[-1]["epoch"]})
    lab = dict(run.labels)
    if lab["period"] is not None:
        lab["period"] = apparent_period(float(lab["period"]), float(every))
    lab.update(bands=1, cliffs=[], checkpoint_associated=None, bucket_logged=False)
    return SimulatedRun(records=out, labels=lab, config={**run.config, "every": every})


def tail(run: SimulatedRun, points: int) -> SimulatedRun:
    """The last ``points`` rows of a run (a short log): its bands and period stay."""
    rows = [r for r in run.records if "loss" in r][-points:]
    lab = dict(run.labels)
    lab.update(cliffs=[], checkpoint_associated=None)
    return SimulatedRun(records=rows, labels=lab, config={**run.config, "points": points})


def short_and_coarse_set(seed: int, reps: int) -> list[tuple[str, SimulatedRun]]:
    """Short (40-80 points) and coarsely logged (every 10 steps) labelled runs."""
    runs = []
    for rep in range(reps):
        s = seed + 1000 * rep
        runs += [
            (f"short40_saw5_{rep}", tail(simulate_run("sorted_megabatch", megabatch=5,
                                                       steps=400, seed=s), 40)),
            (f"short60_saw6_{rep}", tail(simulate_run("sorted_megabatch", megabatch=6,
                                                       steps=400, seed=s + 1), 60)),
            (f"short80_bands3_{rep}", tail(simulate_run("bucketed", length_effect=0.6,
                                                         batch_size=32, steps=400,
                                                         seed=s + 2), 80)),
            (f"short40_bands3_{rep}", tail(simulate_run("bucketed", length_effect=0.6,
                                                         batch_size=32, steps=400,
                                                         seed=s + 8), 40)),
            (f"short40_clean_{rep}", tail(simulate_run("random", length_effect=0.0,
                                                        steps=400, seed=s + 3), 40)),
            (f"short80_clean_{rep}", tail(simulate_run("stratified", length_effect=0.0,
                                                        steps=400, seed=s + 4), 80)),
            (f"coarse10_saw50_{rep}", coarse(simulate_run("sorted_megabatch", megabatch=50,
                                                           steps=5000, seed=s + 5), 10)),
            (f"coarse10_saw200_{rep}", coarse(simulate_run("sorted_megabatch", megabatch=200,
                                                            steps=8000, seed=s + 6), 10)),
            (f"coarse10_clean_{rep}", coarse(simulate_run("random", length_effect=0.0,
                                                           steps=5000, seed=s + 7), 10)),
        ]
    return runs


def with_grad_norm(rows: list[dict[str, Any]], *, seed: int, phi: float) -> list[dict[str, Any]]:
    """``rows`` with a healthy ``grad_norm``: 0.4 times exp of AR(1) noise (sd 0.2)."""
    rng = np.random.default_rng([seed, 5])
    a = 0.0
    for row in rows:
        a = phi * a + 0.2 * float(rng.standard_normal())
        row["grad_norm"] = 0.4 * float(np.exp(a))
    return rows


def false_positive_rows(lengths: dict[int, int]) -> list[str]:
    """Clean logs of each length: how often each test fires (none of them should)."""
    rows = ["| log length (points) | logs | period test ran | band test ran | period found | "
            "bands >= 2 | cliffs | epoch step-down (no epochs) | any cause (besides true epoch "
            "steps) | called clean | seconds per log |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, reps in lengths.items():
        count = {"ptested": 0, "btested": 0, "period": 0, "bands": 0, "cliffs": 0, "any": 0,
                 "clean": 0}
        ep_fp = ep_runs = 0
        start = time.perf_counter()
        for k in range(reps):
            phi = (0.0, 0.5, 0.8)[k % 3]
            epochs = (0, 0, 3)[k % 3] if n >= 100 else 0
            log = with_grad_norm(simulate_clean(n, seed=k, phi=phi, epochs=epochs,
                                                fall=(3.0, 100.0)[k % 2], lr_drop=k % 4 != 3),
                                 seed=k, phi=phi)
            r = diagnose(log)
            count["ptested"] += r.periodicity.p_value is not None
            count["btested"] += r.bands.count is not None
            count["clean"] += r.verdict.clean is True
            count["period"] += r.periodicity.period is not None
            count["bands"] += (r.bands.count or 0) > 1
            count["cliffs"] += bool(r.cliffs)
            count["any"] += any(not (epochs and c.name == "epoch_boundaries")
                                for c in r.verdict.causes)
            if not epochs:
                ep_runs += 1
                ep_fp += bool(r.epochs.found)
        sec = (time.perf_counter() - start) / reps
        rate = {k: v / reps for k, v in count.items()}
        rows.append(f"| {n:,} | {reps} | {rate['ptested']:.0%} | {rate['btested']:.0%} | "
                    f"{rate['period']:.1%} | {rate['bands']:.1%} | {rate['cliffs']:.1%} | "
                    f"{(ep_fp / ep_runs if ep_runs else 0):.1%} | {rate['any']:.1%} | "
                    f"{rate['clean']:.0%} | {sec:.2f} |")
    return rows


EVENT_FINDINGS = (
    "resume with rollback (restart found)", "schedule restarted at a resume (lr jumped)",
    "second writer (duplicates, no restart)", "empty steps skipped (not NaN losses)",
    "grad-norm co-spikes", "grad-norm spikes lead loss spikes", "grad clipped often",
    "grad norm rising", "no NaN cause on DFlash logs", "held-out gap widens",
    "over-fitting (held-out loss rises)", "slow steps found at the save interval")


def event_rows(seeds: int, steps: int) -> dict[str, Tally]:
    """Resumes, a second writer, empty DFlash steps and the gradient-norm findings on
    simulated logs whose answer is known by construction."""
    t = {k: Tally() for k in EVENT_FINDINGS}
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 99])
        clean = simulate_clean(steps, seed=seed, phi=0.5)
        for restart in (True, False):
            at = int(rng.integers(steps // 4, steps // 2))
            back = int(rng.integers(1, steps // 10))
            r = diagnose(with_resumes(clean, [(at, at - back)], restart_schedule=restart,
                                      seed=seed))
            t["resume with rollback (restart found)"].add(True, r.input.restart_count == 1)
            t["schedule restarted at a resume (lr jumped)"].add(
                restart, any(r.input.lr_jumped(x) for x in r.input.restarts))
        for lag in (1, 2):
            r = diagnose(with_second_writer(clean, lag=lag, seed=seed))
            t["second writer (duplicates, no restart)"].add(
                True, r.input.duplicate_rows > 0 and r.input.restart_count == 0)
        r = diagnose(clean)
        t["resume with rollback (restart found)"].add(False, r.input.restart_count > 0)
        t["second writer (duplicates, no restart)"].add(False, r.input.duplicate_rows > 0)
        for skipped in ((), tuple(int(x) for x in rng.choice(np.arange(50, steps), 8,
                                                             replace=False))):
            r = diagnose(dflash_log(steps, skipped=skipped, seed=seed))
            t["empty steps skipped (not NaN losses)"].add(bool(skipped), r.skipped.count > 0)
            t["no NaN cause on DFlash logs"].add(
                False, "nonfinite_loss" in {c.name for c in r.verdict.causes})
        for lead in (None, 0, int(rng.integers(1, 6))):
            rows, _ = grad_norm_log(steps, lead=lead, seed=seed)
            g = diagnose(rows).grad_norm
            t["grad-norm co-spikes"].add(lead == 0, g.co_spikes.found)
            t["grad-norm spikes lead loss spikes"].add(lead is not None and lead > 0,
                                                       g.lead.found)
        for rise, level in ((1.0, 0.5), (3.0, 1.5)):
            rows, _ = grad_norm_log(steps, spikes=0, lead=None, rise=rise, level=level,
                                    seed=seed)
            g = diagnose(rows, clip=1.0).grad_norm
            t["grad norm rising"].add(rise > 1, g.rising)
            t["grad clipped often"].add(level > 1, g.clipped_often)
        for flat, rise in ((None, 0.0), (steps // 2, 0.0), (steps // 2, 0.2)):
            e = diagnose(with_evals(clean, steps // 15, flat_from=flat, rise=rise,
                                    seed=seed)).eval_gap
            t["held-out gap widens"].add(flat is not None, e.widening)
            t["over-fitting (held-out loss rises)"].add(rise > 0, e.widening and e.eval_rising)
        for save in (None, steps // 10):
            timed = [{**row, "seconds": 0.5 * float(np.exp(0.1 * rng.standard_normal()))
                      + (4.0 if save and row["step"] % save == 0 else 0.0)} for row in clean]
            st = diagnose(timed, checkpoint_every=steps // 10).step_time
            # found and matched to the saves; a cause only from 5 % of the run's time, which
            # these saves (4 s at every tenth of the run) reach only in short runs
            t["slow steps found at the save interval"].add(
                save is not None, st.matches == "the checkpoint interval")
    return t


def noise_budget_rows(seeds: int, steps: int) -> list[str]:
    """Shares of the noise budget against the simulation's true shares."""
    cases = [("bucketed", 0.3, 0.5), ("bucketed", 0.6, 0.3), ("bucketed", 0.0, 0.3),
             ("random", 0.0, 0.5), ("random", 0.3, 0.3), ("stratified", 0.3, 0.8),
             ("random", 0.3, 0.05)]
    rows = ["| order | length effect | per-sample std | true shares (sampling / composition "
            "/ unexplained) | doctor's shares | largest error | excess |",
            "|---|---|---|---|---|---|---|"]
    errors = []
    for order, effect, std in cases:
        for seed in range(seeds):
            run = simulate_run(order, steps=steps, seed=seed, length_effect=effect,
                               sample_std=std)
            noise = diagnose(run.records).noise
            truth = run.labels["noise_shares"]
            err = max(abs(noise.shares[k] - truth[k]) for k in truth)
            errors.append(err)
            rows.append(
                f"| {order} | {effect} | {std} | {truth['sampling']:.2f} / "
                f"{truth['composition']:.2f} / {truth['unexplained']:.2f} | "
                f"{noise.shares['sampling']:.2f} / {noise.shares['composition']:.2f} / "
                f"{noise.shares['unexplained']:.2f} | {err:.3f} | {noise.excess:.2f} |")
    rows += ["", f"Largest error over all {len(errors)} runs: {max(errors):.3f}; mean "
             f"{float(np.mean(errors)):.3f}; within 0.1 in {np.mean(np.array(errors) <= 0.1):.0%} "
             "of the runs."]
    return rows


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


#: (name, simulate_hf_log arguments): multi-process, per-epoch-phase and aliased cycles
HF_CASES: list[tuple[str, dict[str, Any]]] = [
    ("ddp4_every10", dict(steps=1210, steps_per_epoch=403, world_size=4, interval=10,
                          amplitude=0.3)),
    ("ddp2_every1", dict(steps=3000, steps_per_epoch=500, world_size=2, interval=1)),
    ("ddp8_every5", dict(steps=1500, steps_per_epoch=300, world_size=8, interval=5,
                         amplitude=0.3)),
    ("ddp10_every10_cancels", dict(steps=2600, steps_per_epoch=276, world_size=10,
                                   interval=10)),
    ("epoch_phase_every10", dict(steps=630, steps_per_epoch=210, world_size=1, interval=10)),
    ("epoch_phase_every1", dict(steps=2100, steps_per_epoch=210, world_size=1, interval=1)),
    ("ungrouped_ddp4_every10", dict(steps=1210, steps_per_epoch=403, world_size=4,
                                    interval=10, grouped=False)),
    ("ungrouped_every1", dict(steps=3000, steps_per_epoch=500, world_size=1, interval=1,
                              grouped=False, phi=0.6)),
]


def hf_cycle_rows(seeds: int) -> tuple[dict[str, Tally], list[str]]:
    """Each HF case and seed diagnosed with no option and with ``--world-size``."""
    t = {k: Tally() for k in ("periodic (no option)", "period within 5% (no option)",
                              "periodic (--world-size)", "period within 5% (--world-size)",
                              "cause is the mega-batch cycle (--world-size)")}
    rows = ["| run | true cycle (steps) | seen in the log (steps) | found, no option | "
            "found, --world-size | cause with --world-size |", "|---|---|---|---|---|---|"]
    for name, kw in HF_CASES:
        for seed in range(seeds):
            records = simulate_hf_log(seed=seed, **kw)
            cycle = megabatch_steps(kw["steps_per_epoch"], kw["world_size"])
            seen = (apparent_period(cycle, float(kw["interval"]))
                    if kw.get("grouped", True) else None)
            found = []
            for label, opts in (("no option", {}), ("--world-size", {
                    "world_size": kw["world_size"]})):
                r = diagnose(records, **opts)
                period = r.periodicity.period
                t[f"periodic ({label})"].add(seen is not None, period is not None)
                if seen is not None:
                    t[f"period within 5% ({label})"].add(
                        True, period is not None and abs(period - seen) <= PERIOD_TOLERANCE * seen)
                found.append((period, r))
            names = [c.name for c in found[1][1].verdict.causes]
            t["cause is the mega-batch cycle (--world-size)"].add(
                seen is not None, "sorted_batches_cycle" in names)
            rows.append(f"| {name}_{seed} | {cycle:g}{'' if kw.get('grouped', True) else ' (off)'}"
                        f" | {_g(seen)} | {_g(found[0][0])} | {_g(found[1][0])} | "
                        f"{', '.join(names) or 'clean'} |")
    return t, rows


def label_rows(data: Path) -> list[str]:
    """Agreement with the labels of real_logs2..5 (``benchmarks/doctor_labels.py``)."""
    if not any((data / s / "labels.json").is_file() for s in doctor_labels.SETS):
        return [f"`{data}/real_logs2..5` are not present: skipped."]
    return doctor_labels.table(doctor_labels.rows(data)).splitlines()


def real_log_rows(real_logs: Path) -> list[str]:
    """One row per real log: what the doctor says about it."""
    if not real_logs.is_dir():
        return [f"`{real_logs}` is not present: skipped."]
    rows = ["| log | points (every) | stable region (points) | bands | period (steps) | "
            "epoch step-down | cliffs (phase) | clean | verdict |",
            "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(real_logs.glob("*.jsonl")):
        r = diagnose(path)
        per = r.periodicity
        period = ("not tested" if per.p_value is None else _g(per.period) if per.period
                  else "none")
        bands = ("not tested" if r.bands.count is None else "none" if r.bands.count <= 1
                 else str(r.bands.count))
        ep = {True: f"yes ({len(r.epochs.starts)})", False: "no", None: "-"}[r.epochs.found]
        phases: dict[str, int] = {}
        for c in r.cliffs:
            phases[c.phase] = phases.get(c.phase, 0) + 1
        cl = f"{len(r.cliffs)}" + (f" ({', '.join(f'{v} {k}' for k, v in phases.items())})"
                                   if phases else "")
        rows.append(
            f"| {path.name} | {r.input.loss_rows:,} ({r.context.interval:g}) | "
            f"{r.phases.start:g}..{r.phases.end:g} ({r.stats.points:,}) | {bands} | {period} | "
            f"{ep} | {cl} | {_b(r.verdict.clean)} | {r.verdict.summary.replace('|', '/')} |"
        )
    return rows


def seeds_text(quick: bool) -> str:
    return "One seed per case." if quick else "Three seeds per case."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    parser.add_argument("--steps", type=int, default=None, help="steps per simulated run")
    parser.add_argument("--lines", type=int, default=None, help="lines of the timing log")
    parser.add_argument("--out", default=None, help="output markdown path")
    parser.add_argument("--no-real", action="store_true", help="skip the real logs")
    parser.add_argument("--data", default=str(SHARED_DATA),
                        help="folder holding real_logs and real_logs2..5 (default ../shared/data)")
    args = parser.parse_args(argv)
    steps = args.steps or (1500 if args.quick else 3000)
    lines = args.lines or (100_000 if args.quick else 500_000)
    fpr_lengths = ({30: 20, 100: 20, 1000: 6, 10_000: 2} if args.quick else
                   {30: 200, 50: 200, 100: 150, 300: 100, 1000: 60, 3000: 30, 10_000: 12,
                    100_000: 4})
    out = Path(args.out) if args.out else HERE / (
        "DOCTOR_RESULTS.quick.md" if args.quick else "DOCTOR_RESULTS.md")
    runs = labelled_set(seed=0, steps=steps)
    short = short_and_coarse_set(seed=7, reps=1 if args.quick else 3)
    if args.quick:
        runs = [r for r in runs if r[0].endswith("_0")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        tallies, rows = score_runs(runs, work)
        scored = time.perf_counter() - start
        short_tallies, short_rows = score_runs(short, work)
        timing = time_reading(lines, work)
    start = time.perf_counter()
    fpr = false_positive_rows(fpr_lengths)
    fpr_seconds = time.perf_counter() - start
    budget = noise_budget_rows(1 if args.quick else 3, 1500 if args.quick else 3000)
    start = time.perf_counter()
    events = event_rows(2 if args.quick else 6, steps)
    event_seconds = time.perf_counter() - start
    start = time.perf_counter()
    hf_tallies, hf_rows = hf_cycle_rows(1 if args.quick else 3)
    hf_seconds = time.perf_counter() - start
    data = Path(args.data)
    real = [] if args.no_real else real_log_rows(data / "real_logs")
    labelled = [] if args.no_real else label_rows(data)
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
        f"{len(runs)} simulated runs of {steps} steps (`simulated_logs.runs.labelled_set`, "
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
        "## Short and coarsely logged runs",
        "",
        f"{len(short)} runs: the last 40-80 rows of simulated runs (a 5- or 6-step mega-batch "
        "saw-tooth, 3 bands from single-bucket steps of 32 samples with a strong length effect, "
        "clean), and runs logged every 10 "
        "steps with each row the mean of its 10 steps (a 50-step and a 200-step mega-batch "
        "cycle, clean), the way Hugging Face's `logging_steps` logs. The true period of a "
        "coarse log is the cycle as its rows see it (`context.apparent_period`); a 50-step "
        "saw-tooth logged every 10 steps shows as 5 distinct levels, which the band test may "
        "count as bands although the label says 1.",
        "",
        "| finding | positives | TP | FP | FN | TN | precision | recall |",
        "|---|---|---|---|---|---|---|---|",
        *(tally.row(name) for name, tally in short_tallies.items()
          if tally.tp + tally.fp + tally.fn + tally.tn),
        "",
        "## False-positive rate by log length",
        "",
        "Clean logs from `simulated_logs.runs.simulate_clean` (nothing wrong by "
        "construction): the loss falls 3x or 100x, AR(1) noise with lag-1 autocorrelation 0, "
        "0.5 or 0.8 in turn, a learning-rate cut at 60 % of the run that lowers the loss 2 % "
        "(three runs in four), a gradient norm of AR(1) log-normal noise (with the loss's "
        "autocorrelation), and in every third log of 100+ points three epochs that each "
        "start 5 % lower (a step-down the doctor should report as `epoch_boundaries`, not count "
        "here). Period and band tests are calibrated so that each fires on at most 5 % of "
        "them; \"test ran\" says how often the stable region held enough points (for bands: "
        "enough about independent ones, autocorrelated residuals being thinned) to test at "
        "all. A log whose tests could not run is reported as not tested (`clean: null`), "
        f"never as clean. {fpr_seconds:.0f} s.",
        "",
        *fpr,
        "",
        "## Resumes, a second writer, empty steps and the gradient norm",
        "",
        f"Per seed ({2 if args.quick else 6} seeds, {steps} steps): a clean log "
        "(`simulate_clean`) resumed once at a random step with a random rollback, its "
        "schedule restarted or resumed (`simulated_logs.events.with_resumes`); the same log "
        "written "
        "by two processes 1 or 2 rows apart (`with_second_writer`) and as it is (the "
        "negatives); a DFlash recipe's step log (`dflash_log`: one micro-batch a step) with "
        "and without 8 empty steps; a log with 6 loss spikes and a gradient norm with a spike "
        "at each (co-spike), 1-5 steps before each (lead) or none (`grad_norm_log`); a gradient "
        "norm flat at 0.5 or rising 3-fold from 1.5 against a clip of 1.0; 15 evaluations "
        "that follow the training loss, stop falling half-way, or climb from there by 0.2 "
        "(`with_evals`); log-normal step times (sd 0.1) with or without 4 s more at every "
        "tenth of the run (a save). "
        f"{event_seconds:.0f} s.",
        "",
        "| finding | positives | TP | FP | FN | TN | precision | recall |",
        "|---|---|---|---|---|---|---|---|",
        *(tally.row(name) for name, tally in events.items()),
        "",
        "## Multi-process, per-epoch and aliased cycles",
        "",
        "Runs simulated by `simulated_logs.hf.simulate_hf_log` as Hugging Face's "
        "Trainer logs them: the length-grouped sampler's saw-tooth of "
        "`min(N // (4 * batch), 50) / W` steps over `W` processes, its phase reset at each "
        "epoch start, AR(1) step noise, each row the mean of the `logging_steps` it covers and "
        "`epoch` written as progress rounded to 2 decimals (so the last row of an epoch reads "
        "k.0). The true period is the cycle as the rows see it (`context.apparent_period`); "
        "a 5-step cycle logged every 10 steps cancels (label: none). Ungrouped runs are the "
        f"false-positive check. {seeds_text(args.quick)} {hf_seconds:.0f} s.",
        "",
        "| finding | positives | TP | FP | FN | TN | precision | recall |",
        "|---|---|---|---|---|---|---|---|",
        *(tally.row(name) for name, tally in hf_tallies.items()),
        "",
        *hf_rows,
        "",
        "## Noise budget against known shares",
        "",
        "Simulated runs whose rows carry `loss_sample_std` (the per-sample spread of a batch of "
        "8 samples, estimated from the batch) and whose true shares of the step-to-step "
        "variance are known: sampling `sample_std^2 / 8`, composition the part of the length "
        "effect the logged bucket carries, unexplained the rest (extra step noise and, for "
        "bucketed runs, the length variation within a bucket). The doctor's composition share "
        "comes from the bucket R^2, or from sequence-length deciles when no single bucket is "
        "logged (which captures most, not all, of a continuous length effect).",
        "",
        *budget,
        "",
        "## Per run",
        "",
        "| run | true bands | found | true period | found | true cliffs | found | "
        "true ckpt assoc | found (p) | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        *short_rows,
        "",
        "## Reading speed",
        "",
        *timing,
        "",
        "## Real logs (`../shared/data/real_logs`)",
        "",
        "What the doctor says about real training logs, as it says it, with no option given "
        "(steps per epoch come from each log's `epoch` field where it has one). Nothing was "
        "tuned to these logs; their README records each run's settings (length grouping, "
        "schedule, epochs, saves) to judge the verdicts by.",
        "",
        *real,
        "",
        "## Labelled real logs (`../shared/data/real_logs2..5`)",
        "",
        "Agreement with each log's labels (`labels.json`, taken from the run's own "
        "configuration), with no option and with the options that configuration justifies; "
        "`python benchmarks/doctor_labels.py` prints the same table. A log agrees when every "
        "label that is not null agrees.",
        "",
        *labelled,
        "",
    ]
    out.write_text("\n".join(head))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
