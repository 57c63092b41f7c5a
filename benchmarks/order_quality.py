"""What the batch order does to the model, with error bars, at equal real tokens.

Trains the demo's causal LM once per order and seed (every order x ``--seeds``) until
each run has trained the same number of real tokens, measures the held-out loss
overall and per length stratum along the way, and writes the figures with 95 %
intervals over seeds, paired differences against random and sorted, tokens and
seconds to a fixed held-out loss, and what the doctor says of each run's step log
and of rank 0's per-micro-batch log (:mod:`lengthwise.demo.evidence_report`)::

    python benchmarks/order_quality.py                  # the committed run -> ORDER_QUALITY.json
    python benchmarks/order_quality.py --workers 2      # two runs at a time (one thread each)
    python benchmarks/order_quality.py --check          # rerun the reduced check, compare
    python benchmarks/order_quality.py --from-runs DIR  # figures from the runs saved in DIR

Each run is saved as ``OUT/runs/ORDER-seedN.json`` as it ends, so an interrupted
benchmark continues where it stopped when given the same ``--out``. The committed
JSON also holds a reduced run (:data:`CHECK`: two orders, one seed, a small budget)
that ``tests/test_order_quality.py`` reruns and compares figure by figure.
Throughput and wall time depend on the machine and its load: shown, never compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "benchmarks" / "ORDER_QUALITY.json"
PLOTS = {"tokens": ROOT / "docs" / "order_quality_tokens.png",
         "seconds": ROOT / "docs" / "order_quality_seconds.png"}

#: the committed experiment (change these, rerun, commit the JSON and the docs)
FULL: dict[str, Any] = {"max_samples": 5500, "epochs": 1.0, "eval_samples": 384,
                        "eval_points": 10}
#: the reduced run that CI repeats and compares with the committed one
CHECK: dict[str, Any] = {"orders": ("random", "bucket-random"), "seeds": (0,),
                         "token_budget": 24_000, "eval_samples": 96, "eval_points": 3,
                         "max_samples": 1500}
#: relative tolerance of a compared loss: a run repeated on this machine gives the same
#: figures to the last digit; other CPUs may round the kernels' sums differently
REL_TOL = 2e-3


def _config(settings: dict[str, Any]) -> Any:
    from lengthwise.demo.evidence import EvidenceConfig

    return EvidenceConfig(**settings)


def run(settings: dict[str, Any], out: Path, workers: int, cache_dir: str | None,
        ) -> dict[str, Any]:
    """Train every run of ``settings`` not yet saved under ``out/runs``; the figures."""
    from lengthwise.demo.evidence import build_data
    from lengthwise.demo.evidence_report import run_experiment, summarise

    cfg = _config(settings)
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = {(o, s) for s in cfg.seeds for o in cfg.orders
            if (runs_dir / f"{o}-seed{s}.json").is_file()}

    def save(r: dict[str, Any]) -> None:
        (runs_dir / f"{r['order']}-seed{r['seed']}.json").write_text(json.dumps(r),
                                                                      encoding="utf-8")
        _say(f"{r['order']} seed {r['seed']}: held-out loss {r['eval_loss']:.4f} after "
             f"{r['real_tokens']:,} real tokens, {r['train_seconds']:.0f} s")

    if len(done) < len(cfg.orders) * len(cfg.seeds):
        run_experiment(cfg, out=out / "logs", workers=workers, cache_dir=cache_dir,
                       skip=done, on_run=save)
    data = build_data(cfg, cache_dir=cache_dir)
    runs = [json.loads((runs_dir / f"{o}-seed{s}.json").read_text(encoding="utf-8"))
            for s in cfg.seeds for o in cfg.orders]
    summary = summarise(cfg, data, runs)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["machine"] = f"{platform.machine()}, {os.cpu_count()} CPU cores"
    summary["workers"] = workers
    return summary


def _say(text: str) -> None:
    print(f"order_quality: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="rerun the reduced check and compare with the committed figures")
    ap.add_argument("--out", default=None, help="folder for logs and saved runs (default: temp)")
    ap.add_argument("--workers", type=int, default=1, help="runs trained at a time")
    ap.add_argument("--cache-dir", default=None, help="the demo's corpus/tokenizer cache")
    ap.add_argument("--full-only", action="store_true", help="skip the reduced check run")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="order-quality-"))
    saved = json.loads(SAVED.read_text(encoding="utf-8")) if SAVED.is_file() else {}
    if args.check:
        fresh = run(CHECK, out / "check", 1, args.cache_dir)
        drift = compare(saved["check"], fresh)
        for line in drift:
            print(line)
        print(f"order_quality: {len(drift)} figure(s) differ from the committed check run")
        return 1 if drift else 0
    saved["full"] = run(FULL, out / "full", args.workers, args.cache_dir)
    if not args.full_only:
        saved["check"] = run(CHECK, out / "check", 1, args.cache_dir)
    write(saved)
    _say(f"wrote {SAVED}")
    return 0


def write(saved: dict[str, Any], path: Path = SAVED) -> None:
    """Write the figures as JSON (NaN, e.g. the interval of one seed, as null)."""
    import math

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    path.write_text(json.dumps(clean(saved), indent=1) + "\n", encoding="utf-8")


def compare(saved: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """The figures of the check run that moved (empty: none)."""
    out = []
    old = {(r["order"], r["seed"]): r for r in saved["runs"]}
    new = {(r["order"], r["seed"]): r for r in fresh["runs"]}
    if set(old) != set(new):
        return [f"runs: {sorted(old)} committed, {sorted(new)} now"]
    for key, a in old.items():
        b = new[key]
        for name in ("steps", "real_tokens", "padded_tokens"):
            if a[name] != b[name]:
                out.append(f"{key} {name}: {a[name]} committed, {b[name]} now")
        pairs = [("eval_loss", a["eval_loss"], b["eval_loss"])]
        pairs += [(f"strata[{i}]", x, y) for i, (x, y) in enumerate(zip(a["strata"],
                                                                          b["strata"],
                                                                          strict=True))]
        pairs += [(f"curve[{i}]", p["eval_loss"], q["eval_loss"])
                  for i, (p, q) in enumerate(zip(a["curve"], b["curve"], strict=True))]
        for name, x, y in pairs:
            if not _close(x, y):
                out.append(f"{key} {name}: {x} committed, {y} now")
    return out


def _close(a: Any, b: Any) -> bool:
    import math

    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL_TOL)


if __name__ == "__main__":
    sys.exit(main())
