"""lengthwise side by side with the batching libraries users would pick instead.

One command measures every installed method on the same lengths, with the same
seed, in the same run, using the figures of docs/metrics.md computed by one function
(:func:`lengthwise.planning.metrics.batch_stats`), and writes ``benchmarks/RESULTS.md``
and ``benchmarks/results.png``::

    python benchmarks/compare.py            # the published run (~10-15 minutes on 2 cores)
    python benchmarks/compare.py --quick    # a minute-long check on smaller inputs

The quick run writes ``RESULTS.quick.md`` / ``results.quick.png`` unless told
otherwise, so it never replaces the published tables.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import competitors as comp  # noqa: E402

#: where the figures of the reference run come from (docs/metrics.md)
REFERENCE = {"median": 1050.0, "sigma": 0.5, "low": 16, "high": 8192, "n": 902_087}
WORLDS = (8, 64)
MIB = 1024 * 1024
PACKAGES = ("lengthwise", "numpy", "torch", "transformers", "accelerate", "datasets", "pyarrow",
            "lhotse", "trl", "axolotl", "numba", "fairseq", "matplotlib")
NOT_INSTALLABLE = {
    "fairseq": "fairseq 0.12.2 (its last release) installs but fails to import on Python "
               "3.11: its dataclass configs use mutable defaults (facebookresearch/fairseq "
               "#5012). The table uses a sorted token-budget batcher written from its "
               "documented batch_by_size rule instead.",
    "axolotl": "axolotl 0.19.0 with its dependencies would downgrade numpy (to 2.3.5) and "
               "transformers (to 5.16.1), so it is installed with --no-deps next to numba; "
               "only its MultipackBatchSampler (which needs numpy, numba, torch, accelerate "
               "and transformers) is used.",
}


@dataclass
class Settings:
    """What one run measures."""

    quick: bool
    datasets: list[str]
    reference_n: int
    scale_sizes: list[int]
    batch_size: int = 4
    max_tokens: int = 16384
    capacity: int = 8192
    max_len: int = 8192
    reference_buckets: int = 6
    seed: int = 0
    scale_world: int = 8
    #: a method runs at the largest size only if 10x its time at the size before stays under this
    ten_x_limit_s: float = 120.0
    #: a method runs at the first scaling size only if its projected time stays under this
    first_size_limit_s: float = 100.0
    #: a method whose first epoch on a data set takes longer runs only that epoch there
    slow_run_s: float = 60.0
    subprocess_timeout_s: float = 420.0
    isolate_scaling: bool = True
    only: list[str] = field(default_factory=list)


def settings(quick: bool, only: list[str]) -> Settings:
    from lengthwise.planning.lengths import bundled_names

    if quick:
        return Settings(quick=True, datasets=["coqa", "writingbench", "linuxdoc", "reference"],
                        reference_n=20_000, scale_sizes=[100_000], isolate_scaling=False,
                        slow_run_s=5.0, first_size_limit_s=5.0, ten_x_limit_s=10.0,
                        only=only)
    return Settings(quick=False, datasets=[*bundled_names(), "reference"],
                    reference_n=REFERENCE["n"], scale_sizes=[1_000_000, 10_000_000], only=only)


def reference_lengths(n: int, seed: int = 0) -> np.ndarray:
    """The reference run's shape: log-normal, median 1,050, sigma 0.5, clipped to [16, 8192].

    Example::

        >>> lens = reference_lengths(10_000)
        >>> bool(900 < np.median(lens) < 1200 and lens.min() >= 16 and lens.max() <= 8192)
        True
    """
    rng = np.random.default_rng([seed, 902_087])
    raw = rng.lognormal(np.log(REFERENCE["median"]), REFERENCE["sigma"], n)
    return np.clip(np.rint(raw), REFERENCE["low"], REFERENCE["high"]).astype(np.int64)


def load(name: str, s: Settings) -> np.ndarray:
    if name == "reference":
        return reference_lengths(s.reference_n, s.seed)
    from lengthwise.planning.lengths import load_lengths

    return load_lengths(name, max_len=s.max_len)


def rule_kwargs(rule: str, s: Settings) -> dict:
    return {"rows": {"batch_size": s.batch_size}, "tokens": {"max_tokens": s.max_tokens},
            "pack": {"capacity": s.capacity}}[rule]


def quiet() -> None:
    """Silence progress bars and chatty loggers of the measured libraries."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("transformers", "datasets", "lhotse", "trl", "axolotl", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass


# ---------------------------------------------------------------- quality runs


def _edges_of(run_adapter) -> list[int] | None:
    plan = getattr(run_adapter, "last_plan", None)
    return list(plan.edges) if plan is not None else None


def measure_method(adapter, lengths: np.ndarray, rule: str, s: Settings, buckets,
                   edges: list[int] | None) -> dict:
    """Run one method at every world size (and a second epoch) and compute its figures."""
    from lengthwise.planning.metrics import batch_stats, recomposition_of

    kw = rule_kwargs(rule, s)
    row: dict = {"key": adapter.key, "name": adapter.name, "version": adapter.version,
                 "rule": rule, "notes": []}
    first = None
    for world in WORLDS:
        started = time.perf_counter()
        run = adapter.make_batches(lengths, world_size=world, seed=s.seed, epoch=0,
                                   buckets=buckets, **kw)
        wall = time.perf_counter() - started
        if world == WORLDS[0]:
            first = run
            if edges is None and rule != "pack":
                edges = _edges_of(adapter)
        stats = batch_stats(lengths, run.indices, run.offsets, world_size=world,
                            edges=edges if rule != "pack" else None, capacity=run.capacity,
                            seed=s.seed)
        row[f"w{world}"] = {k: stats[k] for k in (
            "padding_efficiency", "step_length_cv", "step_sample_cv", "step_cv_ratio",
            "rank_imbalance_p50", "rank_imbalance_p99", "max_same_bucket_run",
            "micro_batches", "optimizer_steps")}
        row[f"w{world}"]["coverage"] = comp.coverage(run, lengths.size)
        if rule == "tokens":
            over = np.diff(run.offsets) * batch_longest(lengths, run) > s.max_tokens
            row[f"w{world}"]["over_budget"] = int(over.sum())
        if world == WORLDS[0] and wall > s.slow_run_s and not adapter.static_batches:
            row["notes"].append(f"one epoch took {wall:.0f} s here, so the {WORLDS[1]}-rank "
                                "and second-epoch runs were left out")
            break
    row.setdefault(f"w{WORLDS[1]}", None)
    row["recomposition"] = None
    if row[f"w{WORLDS[1]}"] is not None:
        second = adapter.make_batches(lengths, world_size=WORLDS[0], seed=s.seed, epoch=1,
                                      buckets=buckets, **kw)
        row["recomposition"] = recomposition_of(first.offsets, first.indices,
                                                second.offsets, second.indices)
    row.update(plan_seconds=first.plan_seconds, peak_bytes=first.peak_bytes,
               memory_method=first.memory_method, setup_seconds=first.setup_seconds,
               truncated_tokens=first.truncated_tokens, split_batches=first.split_batches,
               edges=edges)
    row["notes"] += first.notes
    return row


def batch_longest(lengths: np.ndarray, run) -> np.ndarray:
    """Longest sample of each micro-batch of a schedule."""
    return np.maximum.reduceat(lengths[run.indices], run.offsets[:-1])


def run_dataset(name: str, adapters, s: Settings, log) -> dict:
    lengths = load(name, s)
    buckets = s.reference_buckets if name == "reference" else "auto"
    out = {"name": name, "samples": int(lengths.size), "tokens": int(lengths.sum()),
           "median": float(np.median(lengths)), "max": int(lengths.max()),
           "buckets": buckets, "rules": {}}
    for rule in comp.RULES:
        # a fixed-bucket variant only where the data set's own choice differs from it
        methods = [a for a in adapters if rule in a.rules
                   and getattr(a, "buckets", None) in (None, *([] if buckets == "auto"
                                                                 else ["auto"]))]
        if not methods:
            continue
        # lengthwise stratified first: its edges tag every method's batches alike
        methods.sort(key=lambda a: not a.key.startswith("lengthwise_stratified"))
        edges = None
        rows = []
        for adapter in methods:
            started = time.perf_counter()
            try:
                row = measure_method(adapter, lengths, rule, s, buckets, edges)
            except Exception as exc:  # one failing library must not hide the others
                row = {"key": adapter.key, "name": adapter.name, "version": adapter.version,
                       "rule": rule, "error": f"{type(exc).__name__}: {exc}"}
            if adapter.key == "lengthwise_stratified" and row.get("edges"):
                edges = row["edges"]
            rows.append(row)
            log(f"  {name:18s} {rule:6s} {adapter.key:28s} {time.perf_counter() - started:6.1f}s"
                + (f"  ERROR {row['error']}" if "error" in row else ""))
        out["rules"][rule] = rows
    return out


# ---------------------------------------------------------------- plan time and memory at scale


def scaling_jobs(adapters, largest: bool = False) -> list[tuple[str, str]]:
    """(adapter key, rule) pairs measured at scale: each method in its main regime.

    Every lengthwise order runs at the first size; at the largest size only
    stratified does (the orders share the batching and differ little in time).
    """
    jobs = []
    for a in adapters:
        if a.key.startswith("lengthwise_"):
            if a.rules == ("pack",):
                if a.order == "stratified":
                    jobs.append((a.key, "pack"))
            elif a.buckets is not None:
                continue
            elif a.key == "lengthwise_stratified":
                jobs += [(a.key, "rows"), (a.key, "tokens")]
            elif not largest:
                jobs.append((a.key, "rows"))
        else:
            jobs.append((a.key, a.rules[0]))
    return jobs


def measure_once(key: str, rule: str, n: int, s: Settings) -> dict:
    """Plan one epoch of ``n`` synthetic lengths with one method; time and memory."""
    adapter = comp.by_key(key)
    lengths = reference_lengths(n, s.seed)
    kw = rule_kwargs(rule, s)
    buckets = s.reference_buckets
    if isinstance(adapter, comp.LhotseDynamicBucketing):
        adapter.cut_set(lengths, s.seed)  # setup, timed apart
    run = adapter.make_batches(lengths, world_size=s.scale_world, seed=s.seed, epoch=0,
                               buckets=buckets, **kw)
    return {"key": key, "rule": rule, "n": n, "plan_seconds": run.plan_seconds,
            "peak_bytes": run.peak_bytes, "memory_method": run.memory_method,
            "setup_seconds": run.setup_seconds, "micro_batches": run.num_batches,
            "scheduled": int(run.indices.size)}


def run_scaling(adapters, s: Settings, log, data: list[dict]) -> list[dict]:
    """Plan time and memory at the scaling sizes, one fresh process per measurement.

    A method is left out of a size when its time there is projected over a limit:
    at the first size from its reference-shape run above (time x size ratio), at
    later sizes from 10x its time at the size before.
    """
    results: list[dict] = []
    previous: dict[tuple[str, str], dict] = {}
    ref = next((d for d in data if d["name"] == "reference"), None)
    if ref is not None:
        for rule, rows in ref["rules"].items():
            for r in rows:
                if "plan_seconds" in r:
                    previous[(r["key"], rule)] = {"n": ref["samples"], "from": "reference",
                                                  "plan_seconds": r["plan_seconds"],
                                                  "setup_seconds": r["setup_seconds"]}
    for i, n in enumerate(s.scale_sizes):
        for key, rule in scaling_jobs(adapters, largest=i > 0 and i == len(s.scale_sizes) - 1):
            before = previous.get((key, rule))
            if before is not None and "error" in before:
                continue
            if before is not None:
                factor = n / before["n"]
                limit = s.first_size_limit_s if before.get("from") == "reference" \
                    else s.ten_x_limit_s
                projected = factor * (before["plan_seconds"] + (before.get("setup_seconds")
                                                                or 0.0))
                if projected > limit:
                    where = ("its run on the reference shape above" if before.get("from")
                             == "reference" else "its time")
                    results.append({"key": key, "rule": rule, "n": n, "skipped":
                                    f"not run: {where} ({before['n']:,} samples, "
                                    f"{before['plan_seconds']:.1f} s) projects {projected:.0f} s"
                                    f" (limit {limit:.0f} s)"})
                    previous[(key, rule)] = {"error": "skipped"}
                    log(f"  scale {n:>10,} {key:28s} skipped (projected {projected:.0f}s)")
                    continue
            started = time.perf_counter()
            if s.isolate_scaling:
                res = _in_subprocess(key, rule, n, s)
            else:
                try:
                    res = measure_once(key, rule, n, s)
                except Exception as exc:
                    res = {"key": key, "rule": rule, "n": n,
                           "error": f"{type(exc).__name__}: {exc}"}
            results.append(res)
            previous[(key, rule)] = res
            log(f"  scale {n:>10,} {key:28s} {rule:6s} {time.perf_counter() - started:6.1f}s"
                + (f"  plan {res['plan_seconds']:.3f}s" if "plan_seconds" in res else
                   f"  {res.get('error', '')}"))
    return results


def _in_subprocess(key: str, rule: str, n: int, s: Settings) -> dict:
    """One measurement in a fresh interpreter, so peak memory is the method's own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure-one", key, "--rule", rule,
           "--n", str(n)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=s.subprocess_timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"key": key, "rule": rule, "n": n,
                "error": f"timed out after {s.subprocess_timeout_s:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"key": key, "rule": rule, "n": n, "error": f"exit {proc.returncode}: {tail[0]}"}


# ---------------------------------------------------------------- reporting


def fmt(x, spec: str = ".3f", none: str = "—") -> str:
    if x is None:
        return none
    if isinstance(x, float) and not np.isfinite(x):
        return none
    return format(x, spec)


def ratio(a, b, spec: str = ".2f") -> str:
    if a is None or b is None or b == 0:
        return "—"
    return format(a / b, spec) + "x"


def coverage_text(cov: dict) -> str:
    parts = []
    if cov["missing"]:
        parts.append(f"{cov['missing']:,} left out")
    if cov["repeated"]:
        parts.append(f"{cov['repeated']:,} repeated")
    if cov["out_of_range"]:
        parts.append(f"{cov['out_of_range']:,} bad ids")
    return ", ".join(parts) if parts else "exact"


def rule_title(rule: str, s: Settings) -> str:
    return {"rows": f"padded, {s.batch_size} rows per micro-batch",
            "tokens": f"padded, at most {s.max_tokens:,} padded tokens per micro-batch",
            "pack": f"packed, one row of {s.capacity:,} tokens per micro-batch (fill)"}[rule]


def quality_table(rows: list[dict]) -> list[str]:
    ref = next((r for r in rows if r["key"] in ("lengthwise_stratified",
                                                "lengthwise_stratified_pack")
                and "error" not in r), None)
    w0, w1 = WORLDS
    lines = [
        f"| method | padding eff. (fill) | vs lw-strat | step_cv_ratio | rank imb. p50 / p99 "
        f"@{w0} | @{w1} | max same-bucket run | recomposition | plan s | time vs lw-strat | "
        f"peak MiB | coverage @{w0} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} |" + " |" * 10)
            continue
        a, b = r[f"w{w0}"], r[f"w{w1}"]
        eff = a["padding_efficiency"]
        ref_eff = ref[f"w{w0}"]["padding_efficiency"] if ref else None
        run = a["max_same_bucket_run"] if r["rule"] != "pack" else None
        peak = r["peak_bytes"] / MIB if r["peak_bytes"] is not None else None
        wide = (f"{fmt(b['rank_imbalance_p50'])} / {fmt(b['rank_imbalance_p99'])}"
                if b is not None else "not run")
        cov = coverage_text(a["coverage"])
        if r.get("split_batches"):
            cov += f" ({r['split_batches']} batches halved to even out ranks)"
        if a.get("over_budget"):
            cov += f"; {a['over_budget']:,} over the token budget"
        mark = ""
        if r.get("notes"):
            notes.append((r["name"], r["notes"]))
            mark = f" [{len(notes)}]"
        lines.append(
            f"| {r['name']}{mark} | {fmt(eff)} | {ratio(eff, ref_eff, '.3f')} | "
            f"{fmt(a['step_cv_ratio'], '.2f')} | {fmt(a['rank_imbalance_p50'])} / "
            f"{fmt(a['rank_imbalance_p99'])} | {wide} | {fmt(run, 'd')} | "
            f"{fmt(r['recomposition'], '.2f', 'not run')} | {fmt(r['plan_seconds'], '.3f')} | "
            f"{ratio(r['plan_seconds'], ref['plan_seconds'] if ref else None)} | "
            f"{fmt(peak, '.1f')} | {cov} |")
    if notes:
        lines.append("")
        lines += [f"[{i}] {name}: " + "; ".join(n) + "." for i, (name, n)
                  in enumerate(notes, start=1)]
    return lines


def scaling_table(results: list[dict], names: dict[str, str]) -> list[str]:
    lw = {(r["rule"], r["n"]): r for r in results
          if r["key"] in ("lengthwise_stratified", "lengthwise_stratified_pack")
          and "plan_seconds" in r}
    lines = ["| method | regime | samples | plan s | peak MiB | setup s | time vs lengthwise "
             "stratified (same regime) |", "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["n"], comp.RULES.index(r["rule"]),
                                            not r["key"].startswith("lengthwise"), r["key"])):
        name = names.get(r["key"], r["key"])
        if "plan_seconds" not in r:
            lines.append(f"| {name} | {r['rule']} | {r['n']:,} | "
                         f"{r.get('skipped') or r.get('error')} | | | |")
            continue
        base = lw.get((r["rule"], r["n"]))
        peak = r["peak_bytes"] / MIB if r["peak_bytes"] is not None else None
        lines.append(f"| {name} | {r['rule']} | {r['n']:,} | {r['plan_seconds']:.3f} | "
                     f"{fmt(peak, '.0f')} | {fmt(r.get('setup_seconds') or None, '.2f')} | "
                     f"{ratio(r['plan_seconds'], base['plan_seconds'] if base else None)} |")
    return lines


def find(ds: dict, rule: str, key: str) -> dict | None:
    for r in ds["rules"].get(rule, []):
        if r["key"] == key and "error" not in r:
            return r
    return None


def bucket_text(ds: dict) -> str:
    parts = []
    for rule in ("rows", "tokens"):
        r = find(ds, rule, "lengthwise_stratified")
        if r and r.get("edges"):
            parts.append(f"{len(r['edges'])} ({rule})")
    chosen = ", ".join(parts)
    return f"{ds['buckets']}" + (f" -> {chosen}" if ds["buckets"] == "auto" and chosen else "")


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "missed")


def speed_targets(scale: list[dict], s: Settings) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows of the planning-time targets."""
    out = []
    size = s.scale_sizes[0] if s.scale_sizes else 0
    at = {(r["key"], r["rule"]): r for r in scale if r["n"] == size and "plan_seconds" in r}
    lw = at.get(("lengthwise_stratified", "rows"))
    for key, factor, label in (("hf_group_by_length", 5, "LengthGroupedSampler"),
                               ("hf_batch_rebalance", 100, "BatchRebalanceSampler")):
        other = at.get((key, "rows"))
        target = f"lengthwise plans >= {factor}x faster than {label} at {size:,} samples"
        if lw is None or other is None:
            out.append((target, "not measured", "n/a"))
            continue
        speed = other["plan_seconds"] / lw["plan_seconds"]
        out.append((target, f"{speed:.1f}x ({lw['plan_seconds']:.3f} s vs "
                    f"{other['plan_seconds']:.3f} s)", verdict(speed >= factor)))
    return out


def quality_checks(ds: dict, s: Settings) -> dict:
    """The quality targets on one data set: figures of lengthwise and group_by_length."""
    w0, w1 = WORLDS
    lwr = find(ds, "rows", "lengthwise_stratified")
    hf = find(ds, "rows", "hf_group_by_length")
    tok = find(ds, "tokens", "lengthwise_stratified")
    pack = find(ds, "pack", "lengthwise_stratified_pack")

    def get(row, world, key):
        if row is None or row.get(f"w{world}") is None:
            return None
        return row[f"w{world}"][key]

    auto = find(ds, "rows", "lengthwise_stratified_auto")
    out = {"eff": get(lwr, w0, "padding_efficiency"), "hf_eff": get(hf, w0, "padding_efficiency"),
           "eff_auto": get(auto, w0, "padding_efficiency"),
           "steps64": get(lwr, w1, "optimizer_steps")}
    for name, row in (("rows", lwr), ("tokens", tok), ("pack", pack), ("hf", hf)):
        out[f"cv_{name}"] = get(row, w0, "step_cv_ratio")
        out[f"p99_{name}"] = get(row, w1, "rank_imbalance_p99")
    return out


def headline_targets(ds: dict, s: Settings) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows of the quality targets on one data set."""
    q = quality_checks(ds, s)
    w0, w1 = WORLDS
    out = []
    if q["eff"] is not None and q["hf_eff"] is not None:
        out.append((f"padding_efficiency >= group_by_length's ({s.batch_size} rows, "
                    f"{ds['buckets']} buckets)",
                    f"{q['eff']:.3f} vs {q['hf_eff']:.3f}", verdict(q["eff"] >= q["hf_eff"])))
        if q["eff_auto"] is not None:
            out.append((f"padding_efficiency >= group_by_length's ({s.batch_size} rows, "
                        "buckets='auto')", f"{q['eff_auto']:.3f} vs {q['hf_eff']:.3f}",
                        verdict(q["eff_auto"] >= q["hf_eff"])))
    # (key prefix, target, bound, ranks, number format), one row per batch rule
    for key, target, bound, ranks, spec in (("cv", "step_cv_ratio <= 1.0", 1.0, w0, ".2f"),
                                            ("p99", "rank_imbalance p99 <= 1.05", 1.05, w1,
                                             ".3f")):
        for rule, label in (("rows", f"{s.batch_size} rows"),
                            ("tokens", f"{s.max_tokens:,}-token budget"), ("pack", "packed")):
            value = q[f"{key}_{rule}"]
            if value is not None or rule == "rows":
                extra = (f" (group_by_length {fmt(q[f'{key}_hf'], spec)})" if rule == "rows"
                         else "")
                out.append((f"{target} at {ranks} ranks ({label})", f"{fmt(value, spec)}{extra}",
                            verdict(None if value is None else value <= bound)))
    return out


def dataset_targets_table(data: list[dict], s: Settings) -> list[str]:
    """One row per data set: the quality targets, lengthwise (group_by_length)."""
    w0, w1 = WORLDS

    def cell(value, ok: bool | None, hf=None, spec=".2f") -> str:
        if value is None:
            return "—"
        text = fmt(value, spec) + (f" ({fmt(hf, spec)})" if hf is not None else "")
        return text + {True: " met", False: " **missed**", None: ""}[ok]

    def below(value, limit):
        return None if value is None else value <= limit

    lines = [f"| data set | steps @{w1} | padding eff. (gbl) | step_cv_ratio @{w0}: rows (gbl) "
             f"| tokens | packed | rank p99 @{w1}: rows (gbl) | tokens | packed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for ds in data:
        q = quality_checks(ds, s)
        if q["eff"] is None:
            continue
        eff_ok = None if q["hf_eff"] is None else q["eff"] >= q["hf_eff"]
        lines.append(" | ".join([
            f"| {ds['name']}", str(q["steps64"]),
            cell(q["eff"], eff_ok, q["hf_eff"], ".3f"),
            cell(q["cv_rows"], below(q["cv_rows"], 1.0), q["cv_hf"]),
            cell(q["cv_tokens"], below(q["cv_tokens"], 1.0)),
            cell(q["cv_pack"], below(q["cv_pack"], 1.0)),
            cell(q["p99_rows"], below(q["p99_rows"], 1.05), q["p99_hf"], ".3f"),
            cell(q["p99_tokens"], below(q["p99_tokens"], 1.05), spec=".3f"),
            cell(q["p99_pack"], below(q["p99_pack"], 1.05), spec=".3f") + " |"]))
    return lines


def machine() -> list[str]:
    model = platform.processor() or "unknown"
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in text.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return [f"- CPU: {model}, {os.cpu_count()} logical CPUs (shared with other work while "
            "measuring)",
            f"- memory: {fmt(mem, '.1f')} GiB",
            f"- {platform.platform()}, Python {platform.python_version()}"]


def versions() -> list[str]:
    import importlib.metadata as md

    lines = []
    for p in PACKAGES:
        try:
            v = md.version(p)
        except md.PackageNotFoundError:
            v = "not installed"
        lines.append(f"`{p}` {v}")
    return lines


def write_plot(data: list[dict], scale: list[dict], path: Path, s: Settings) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ref = next((d for d in data if d["name"] == "reference"), data[-1] if data else None)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    if ref is not None:
        rows = [r for rule in comp.RULES for r in ref["rules"].get(rule, []) if "error" not in r]
        labels = [f"{r['name'].replace(' (', chr(10) + '(')} [{r['rule']}]" for r in rows]
        colors = ["tab:blue" if r["key"].startswith("lengthwise") else "tab:orange"
                  for r in rows]
        y = np.arange(len(rows))
        w0, w1 = WORLDS
        panels = (
            (axes[0, 0], [r[f"w{w0}"]["padding_efficiency"] for r in rows],
             "padding efficiency (packed: fill)", None),
            (axes[0, 1], [r[f"w{w0}"]["step_cv_ratio"] or np.nan for r in rows],
             f"step_cv_ratio @{w0} ranks (1.0 = random)", 1.0),
            (axes[1, 0], [(r[f"w{w1}"] or {}).get("rank_imbalance_p99") or np.nan
                          for r in rows],
             f"rank_imbalance p99 @{w1} ranks", 1.05),
        )
        for ax, values, title, line in panels:
            ax.barh(y, values, color=colors)
            ax.set_yticks(y, labels, fontsize=6)
            ax.invert_yaxis()
            ax.set_title(f"{title}\n{ref['name']} ({ref['samples']:,} samples)", fontsize=9)
            if line is not None:
                ax.axvline(line, color="k", lw=0.8, ls="--")
    ax = axes[1, 1]
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    names = {a.key: a.name for a in comp.all_adapters()}
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in scale:
        if "plan_seconds" in r:
            series.setdefault((r["key"], r["rule"]), []).append((r["n"], r["plan_seconds"]))
    for (key, rule), pts in sorted(series.items()):
        pts.sort()
        style = "-o" if key.startswith("lengthwise") else "--s"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, ms=4,
                label=f"{names.get(key, key)} [{rule}]")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples")
    ax.set_ylabel("plan seconds (one epoch, 8 ranks)")
    ax.set_title("planning time", fontsize=9)
    ax.legend(fontsize=6)
    fig.suptitle("lengthwise vs other batching methods" + (" (quick run)" if s.quick else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def closing_notes(data: list[dict], scale: list[dict], s: Settings) -> list[str]:
    """Why targets were met or missed, with the figures of this run."""
    notes = []
    w0, w1 = WORLDS
    size = s.scale_sizes[0] if s.scale_sizes else 0
    at = {(r["key"], r["rule"]): r for r in scale if r["n"] == size and "plan_seconds" in r}

    def t(key, rule="rows"):
        r = at.get((key, rule))
        return r["plan_seconds"] if r else None

    strat, brand, rnd = t("lengthwise_stratified"), t("lengthwise_bucket-random"), \
        t("lengthwise_random")
    brs, gbl = t("hf_batch_rebalance"), t("hf_group_by_length")
    if strat and brand:
        text = (f"- **Planning time.** At {size:,} samples lengthwise stratified takes "
                f"{strat:.3f} s and bucket-random {brand:.3f} s: both bucket and batch alike, so "
                f"about {strat - brand:.3f} s is the stratified ordering of the batches.")
        if brs:
            need = brs / 100
            text += (f" The 100x target against BatchRebalanceSampler ({brs:.2f} s) asks for "
                     f"{need * 1000:.0f} ms")
            text += (f", less than lengthwise's plain random order ({rnd:.3f} s), which only "
                     "permutes and cuts." if rnd and rnd > need else ".")
        if gbl:
            text += (f" LengthGroupedSampler takes {gbl:.3f} s ({gbl / strat:.1f}x lengthwise "
                     "stratified).")
        big = [r for r in scale if r["key"] == "lengthwise_stratified" and r["rule"] == "rows"
               and "plan_seconds" in r]
        if len(big) >= 2:
            a, b = sorted(big, key=lambda r: r["n"])[:2]
            text += (f" From {a['n']:,} to {b['n']:,} samples lengthwise stratified grows "
                     f"{b['plan_seconds'] / a['plan_seconds']:.1f}x for "
                     f"{b['n'] / a['n']:.0f}x the samples.")
        notes.append(text)
    gbl_rows = s.batch_size * 50
    ref = next((d for d in data if d["name"] == "reference"), None)
    if ref is not None:
        q = quality_checks(ref, s)
        if q["eff"] is not None and q["hf_eff"] is not None and q["eff"] < q["hf_eff"]:
            notes.append(
                f"- **Padding against group_by_length.** LengthGroupedSampler sorts random "
                f"windows of 50 x batch size = {gbl_rows} samples and cuts them into batches of "
                f"{s.batch_size}, so a batch's samples are neighbours in a sort of {gbl_rows}: "
                f"with {s.batch_size}-row batches that pads less ({q['hf_eff']:.3f} on the "
                f"reference) than {bucket_text(ref)} fixed buckets padded to their upper edges "
                f"({q['eff']:.3f}, the reference run's bucketed shuffle)."
                + (f" With buckets='auto' lengthwise reaches {q['eff_auto']:.3f} on the same "
                   "lengths." if q["eff_auto"] is not None else "")
                + " Where 'auto' picks many buckets and the data has a long tail, lengthwise "
                "pads less than group_by_length; see the per-data-set table.")
        if q["cv_rows"] is not None and q["cv_rows"] > 1.0:
            notes.append(
                f"- **step_cv_ratio with fixed rows.** Stratified reaches {q['cv_rows']:.2f} with "
                f"{s.batch_size} rows per micro-batch, against {fmt(q['cv_tokens'], '.2f')} under "
                f"the token budget and {fmt(q['cv_pack'], '.2f')} packed. A micro-batch moves the "
                f"samples of one bucket in blocks of {s.batch_size}: a step of {w0} micro-batches "
                "gets a block of the rarest, longest bucket or none, where a random step of the "
                "same samples gets them one by one, so the token-weighted mean length of steps "
                "varies more than a shuffle's. Under a token budget long buckets come in blocks "
                "of 2-4 rows and short ones in large blocks"
                + (", and the target is met." if q["cv_tokens"] is not None
                   and q["cv_tokens"] <= 1.0 else "."))
        if q["p99_rows"] is not None and q["p99_rows"] > 1.05:
            notes.append(
                f"- **rank_imbalance with fixed rows.** p99 {q['p99_rows']:.2f} at {w1} ranks "
                f"(group_by_length {fmt(q['p99_hf'], '.2f')}). With {s.batch_size} rows the cost "
                "of a micro-batch is rows x its padded length, so the ranks of one step are "
                "balanced only if they all draw from one bucket, which is the banded, "
                "unrepresentative step the stratified order avoids; the two targets conflict in "
                "this regime. Under the token budget p99 is "
                f"{fmt(q['p99_tokens'])}: rows = floor({s.max_tokens:,} / P), so with samples up "
                f"to {s.max_len:,} tokens a micro-batch of long samples holds 2-3 rows and fills "
                "as little as 2/3 of the budget. Packed rows are priced by their tokens and "
                f"reach {fmt(q['p99_pack'])}.")
    small = [d for d in data if (quality_checks(d, s)["steps64"] or 0) < 20]
    if small:
        notes.append("- **Small data sets.** " + ", ".join(
            f"{d['name']} ({quality_checks(d, s)['steps64']} steps)" for d in small)
            + f" give only a few optimizer steps at {w1} ranks, so their p99 and step figures "
            "rest on a handful of values.")
    over = []
    for d in data:
        r = find(d, "tokens", "lhotse_dynamic_bucketing")
        count = (r[f"w{w0}"].get("over_budget") if r else 0) or 0
        if count:
            over.append(f"{d['name']} {count:,} of {r[f'w{w0}']['micro_batches']:,}")
    if over:
        notes.append(
            f"- **lhotse over budget.** Micro-batches over max_duration={s.max_tokens:,} "
            f"padded tokens: {'; '.join(over)}. The sampler stops adding cuts when one more "
            "cut as long as the longest so far would overflow, so a later, longer cut can "
            "overshoot by a row (an out-of-memory risk a token budget is meant to exclude).")
    lh = find(ref, "tokens", "lhotse_dynamic_bucketing") if ref else None
    if lh is not None:
        notes.append(
            f"- **lhotse time.** One epoch of DynamicBucketingSampler over "
            f"{ref['samples']:,} lengths took {lh['plan_seconds']:.0f} s in one process: for "
            "each batch it shuffles the whole content of the chosen bucket (Python "
            "random.shuffle over the indices held in the 20,000-cut buffer). In training that "
            "cost is spread over the epoch inside the data loader.")
    return notes


def write_results(data, scale, s: Settings, path: Path, plot: Path | None, meta: dict) -> None:
    names = {a.key: a.name for a in comp.all_adapters()}
    left_out = meta.get("left_out", [])
    rendered = (" Its tables were re-rendered from the figures that run saved (`--json`) "
                "with `--render`." if meta.get("rendered") else "")
    lines = [
        "# Benchmarks: lengthwise side by side" + (" (quick run)" if s.quick else ""),
        "",
        f"Generated by `{meta['command']}` on {meta['date']} in {meta['seconds'] / 60:.1f} "
        f"minutes. This file is written by that command; do not edit it by hand.{rendered}",
        "",
        "Every method gets the same lengths and seed in the same run, and every figure comes "
        "from the same function, `lengthwise.planning.metrics.batch_stats`, applied to the "
        "micro-batches each method produces in schedule order (micro-batch k -> rank "
        "k % W). Definitions: [docs/metrics.md](../docs/metrics.md). Rank cost is padded tokens "
        "(cost model a=1, b=c=0; packed layout: real tokens). `step_cv_ratio` and "
        f"`max_same_bucket_run` are at {WORLDS[0]} ranks, one micro-batch per rank per "
        "step (grad_accum=1); `max_same_bucket_run` tags every method's batches with the "
        "edges of lengthwise stratified in the same regime. `recomposition` compares epochs "
        f"0 and 1 at {WORLDS[0]} ranks. `plan s` is one epoch's planning at {WORLDS[0]} ranks "
        "in this process (each rank of a real run does this work itself); `peak MiB` is the "
        "growth of peak resident memory while planning (VmHWM, reset before each call), "
        "unless marked otherwise.",
        "",
        "## Machine and packages",
        "",
        *machine(),
        "- packages: " + ", ".join(versions()),
        "",
        "## What did not install or run",
        "",
        *[f"- {k}: {v}" for k, v in NOT_INSTALLABLE.items()],
        *[f"- {x}" for x in left_out],
        "",
        "## Targets",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *[f"| {t} | {m} | **{v}** |" for t, m, v in speed_targets(scale, s)],
    ]
    ref = next((d for d in data if d["name"] == "reference"), None)
    if ref is not None:
        lines += [f"| [reference shape] {t} | {m} | **{v}** |"
                  for t, m, v in headline_targets(ref, s)]
    lines += ["", "The quality targets on every data set (lengthwise stratified; "
              "group_by_length in brackets; rows: "
              f"{s.batch_size} per micro-batch, tokens: {s.max_tokens:,}-token budget, packed: "
              f"{s.capacity:,}-token rows):", "", *dataset_targets_table(data, s), ""]
    lines += ["Why targets were missed: see the closing notes at the end.", ""]
    if plot is not None:
        lines += [f"![benchmark plot]({plot.name})", ""]
    lines += ["## Planning time and memory at scale", "",
              f"Synthetic lengths of the reference shape, {s.scale_world} ranks, batch size "
              f"{s.batch_size} (rows), {s.max_tokens:,} tokens (tokens), {s.capacity:,} "
              f"(pack); {s.reference_buckets} buckets for lengthwise. "
              + ("Each measurement runs in a fresh process. " if s.isolate_scaling else "")
              + "`setup s` is one-time preparation outside planning (lhotse: building the "
              "CutSet; TRL: building the `datasets.Dataset`).", "",
              *scaling_table(scale, names), ""]
    for ds in sorted(data, key=lambda d: d["name"] != "reference"):
        title = ("reference log-normal (median 1,050, sigma 0.5, clipped to [16, 8192])"
                 if ds["name"] == "reference" else f"`{ds['name']}` (bundled)")
        lines += [f"## {title}", "",
                  f"{ds['samples']:,} samples, {ds['tokens']:,} tokens, median "
                  f"{ds['median']:.0f}, max {ds['max']:,}; lengthwise buckets: "
                  f"{bucket_text(ds)}.", ""]
        for rule, rows in ds["rules"].items():
            lines += [f"**{rule_title(rule, s)}**", "", *quality_table(rows), ""]
    lines += ["## How each method is called", ""]
    measured = {r["key"] for d in data for rows in d["rules"].values() for r in rows}
    measured |= {r["key"] for r in scale}
    for a in comp.all_adapters():
        if a.key in measured:
            lines.append(f"- **{a.name}** ({a.version}): {a.call}")
    lines += ["", "## Closing notes", "", *closing_notes(data, scale, s), ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def recorded_command(argv: list[str]) -> str:
    """The command line as the report shows it (``--json PATH`` only adds an output).

    Example::

        >>> recorded_command(["--quick", "--json", "/tmp/x.json"])
        'python benchmarks/compare.py --quick'
    """
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--json":
            skip = True
            continue
        if not arg.startswith("--json="):
            shown.append(arg)
    return " ".join(["python benchmarks/compare.py", *shown])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a minute-long run on small inputs")
    parser.add_argument("--out", type=Path, help="the Markdown file to write")
    parser.add_argument("--plot", type=Path, help="the PNG file to write")
    parser.add_argument("--json", type=Path, help="also write the raw figures as JSON")
    parser.add_argument("--only", nargs="*", default=[], help="adapter keys to run")
    parser.add_argument("--datasets", nargs="*", help="data sets to run (default: all)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the 1M/10M timings")
    parser.add_argument("--render", type=Path,
                        help="write the report from figures saved with --json, measuring nothing")
    parser.add_argument("--measure-one", help=argparse.SUPPRESS)
    parser.add_argument("--rule", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quiet()
    s = settings(args.quick, args.only)
    if args.datasets is not None:
        s.datasets = args.datasets
    if args.no_scaling:
        s.scale_sizes = []
    if args.measure_one:
        print(json.dumps(measure_once(args.measure_one, args.rule, args.n, s)))
        return 0
    if args.render:
        saved = json.loads(args.render.read_text())
        s = settings(saved["meta"]["quick"], [])
        s.scale_sizes = saved["meta"]["scale_sizes"]
        s.isolate_scaling = saved["meta"].get("isolate_scaling", s.isolate_scaling)
        meta = dict(saved["meta"], rendered=True)
    suffix = ".quick" if s.quick else ""
    out = args.out or HERE / f"RESULTS{suffix}.md"
    plot = args.plot or HERE / f"results{suffix}.png"
    if args.render:
        wrote_plot = write_plot(saved["datasets"], saved["scaling"], plot, s)
        write_results(saved["datasets"], saved["scaling"], s, out,
                      plot if wrote_plot else None, meta)
        print(f"wrote {out}" + (f" and {plot}" if wrote_plot else ""))
        return 0
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {msg}", flush=True)

    left_out: list[str] = []
    adapters = comp.installed(report=left_out.append)
    if s.only:
        adapters = [a for a in adapters if a.key in s.only or a.key == "lengthwise_stratified"]
    for line in left_out:
        log(f"not run: {line}")
    data = []
    for name in s.datasets:
        data.append(run_dataset(name, adapters, s, log))
    scale = run_scaling(adapters, s, log, data) if s.scale_sizes else []
    meta = {"seconds": time.perf_counter() - started, "left_out": left_out,
            "command": recorded_command(argv if argv is not None else sys.argv[1:]),
            "date": _dt.date.today().isoformat(), "quick": s.quick,
            "scale_sizes": s.scale_sizes, "isolate_scaling": s.isolate_scaling}
    wrote_plot = write_plot(data, scale, plot, s)
    write_results(data, scale, s, out, plot if wrote_plot else None, meta)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "datasets": data, "scaling": scale},
                                        indent=1, default=str))
    log(f"wrote {out}" + (f" and {plot}" if wrote_plot else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
