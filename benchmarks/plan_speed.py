"""Planning time against a sort, and the ``lengthwise plan`` command against the planner.

Usage::

    python benchmarks/plan_speed.py            # writes benchmarks/PLAN_SPEED_RESULTS.md,
                                               # PLAN_SPEED.json and docs/planner.md's figures
    python benchmarks/plan_speed.py --quick    # one round instead of five, no file
    python benchmarks/plan_speed.py --render   # docs/planner.md's figures from PLAN_SPEED.json

The reference run's shape (902,087 log-normal lengths, median 1,050, sigma 0.5, clipped to
[16, 8192]) planned for 8 ranks with 4 accumulation steps under ``max_tokens=16384``
(stratified, ``buckets="auto"``). In each round, one after the other on the same lengths:
one stable ``np.argsort`` of the lengths; ``plan_epoch`` with its bucket edges still to
solve (the first plan of a process); ``plan_epoch`` of the next epoch (the edges solved
for these lengths are kept), its figures and each further part of ``lengthwise plan`` alone
(the next epoch's batch sets for ``recomposition``, their comparison, printing); and
``lengthwise plan`` run in this process on the lengths saved as ``.npy`` (read, plan,
figures, the next epoch's batch sets for ``recomposition``, print).
Every figure is the best of the rounds, and every ratio is between timings of this run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from planner_targets import lognormal, machine  # noqa: E402

from lengthwise.cli import build_parser  # noqa: E402
from lengthwise.cli import main as cli_main  # noqa: E402
from lengthwise.cli import plan as plan_cli  # noqa: E402
from lengthwise.planning import edges, padded  # noqa: E402
from lengthwise.planning.config import PlanConfig  # noqa: E402
from lengthwise.planning.metrics import (  # noqa: E402
    random_step_cv,
    recomposition_of,
    reference_repeats,
)
from lengthwise.planning.plan import plan_epoch  # noqa: E402

OPTIONS = PlanConfig(max_tokens=16384, world_size=8, grad_accum=4)
#: targets of the planner's speed, as ratios measured in one run
PLAN_OVER_ARGSORT = 2.0
CLI_OVER_PLAN = 1.3
#: what ``lengthwise plan`` does beyond ``plan_epoch`` and the figures, each timed alone:
#: (ratio name, step timed)
PARTS = (
    ("sorted reference", "sorted reference of the figures"),
    ("next epoch's batch sets", "next epoch's batch sets"),
    ("recomposition comparison", "recomposition comparison"),
    ("printing", "printing"),
)
#: samples per window of the windowed plan whose len() is timed
WINDOW = 100_000
SAVED = HERE / "PLAN_SPEED.json"
#: the marked regions (``<!-- figures:NAME start -->``) this script writes, per file
REGIONS: dict[str, tuple[str, ...]] = {"docs/planner.md": ("plan-speed",)}
ROOT = HERE.parent


def _forget_edges() -> None:
    """Make the next plan solve its edges, as the first plan of a process does."""
    getattr(padded, "_SOLVED", {}).clear()  # (a planner that keeps none has nothing to forget)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _printed(plan, argv: list[str]) -> None:
    """``lengthwise plan``'s text output of ``plan`` (its figures computed), thrown away."""
    args = build_parser("plan").parse_args(argv)
    main = {"plan": plan, "stats": {**plan.stats, "recomposition": 0.0}}
    with contextlib.redirect_stdout(io.StringIO()):
        plan_cli._print_text(args, {args.order: main}, main, [])


def one_round(lengths: np.ndarray, path: str) -> dict[str, float]:
    argv = ["plan", path, "--max-tokens", str(OPTIONS.max_tokens), "--world-size",
            str(OPTIONS.world_size), "--grad-accum", str(OPTIONS.grad_accum)]
    out = {"argsort": _timed(lambda: np.argsort(lengths, kind="stable"))}
    _forget_edges()
    out["plan_epoch"] = _timed(lambda: plan_epoch(lengths, OPTIONS))
    kept = plan_epoch(lengths, OPTIONS, epoch=1)
    out["plan_epoch, edges kept"] = _timed(lambda: plan_epoch(lengths, OPTIONS, epoch=1))
    out["figures (stats)"] = _timed(lambda: kept.stats)
    steps = kept.stats["optimizer_steps"]
    out["random-shuffle reference of the figures"] = _timed(
        lambda: random_step_cv(kept.lengths, np.arange(lengths.size), steps))
    out["sorted reference of the figures"] = _timed(lambda: padded.sorted_reference(
        kept.lengths, np.arange(lengths.size), kept.config))
    sets: list = []
    out["next epoch's batch sets"] = _timed(lambda: sets.extend(padded.padded_batch_sets(
        lengths, kept.config, seed=kept.seed, epoch=kept.epoch + 1)))
    out["recomposition comparison"] = _timed(
        lambda: recomposition_of(kept.offsets, kept.indices, sets[1], sets[0]))
    out["printing"] = _timed(lambda: _printed(kept, argv))
    windowed = plan_epoch(lengths, OPTIONS, window=WINDOW)
    _ = windowed.solved_edges  # solved before timing, as in a sampler's first epoch
    out["len() of a windowed plan"] = _timed(lambda: windowed.num_batches)
    _forget_edges()
    edges_started = time.perf_counter()
    padded.resolve_edges(lengths, np.arange(lengths.size), OPTIONS)
    out["bucket edges alone"] = time.perf_counter() - edges_started
    _forget_edges()
    compiled, edges._compiled = edges._compiled, None  # as installed without a C compiler
    try:
        out["bucket edges alone, NumPy layers"] = _timed(lambda: padded.resolve_edges(
            lengths, np.arange(lengths.size), OPTIONS))
    finally:
        edges._compiled = compiled
    _forget_edges()
    with contextlib.redirect_stdout(io.StringIO()):
        out["lengthwise plan"] = _timed(lambda: cli_main(argv))
    out["lengthwise plan, own process"] = _timed(lambda: subprocess.run(
        [sys.executable, "-m", "lengthwise.cli", *argv], check=True, capture_output=True))
    return out


def _times(repeats: int) -> str:
    return "once" if repeats == 1 else "twice" if repeats == 2 else f"{repeats} times"


def render(name: str, saved: dict) -> str:
    """The text of region ``name`` from the saved figures."""
    if name != "plan-speed":
        raise KeyError(f"no region {name!r}")
    r = saved["ratios"]
    return textwrap.fill(
        f"These ratios are against a sort, on the reference run's {saved['samples']:,} lengths "
        f"for {OPTIONS.world_size} ranks and {OPTIONS.grad_accum} accumulation steps. "
        f"They were measured in one run on {saved['cores']} cores shared with other work, best "
        f"of {saved['rounds']} (`benchmarks/PLAN_SPEED_RESULTS.md`). A plan whose bucket edges "
        "are already solved for these lengths takes "
        f"{r['plan_epoch, edges kept / argsort']:.2f} times one stable `np.argsort` of the "
        "lengths. The edges are already solved for every later epoch and every other order in "
        f"the process. The first plan takes {r['plan_epoch / argsort']:.2f} times, as it also "
        f"runs the exact edge search (section 2). {_edge_search(saved)}. `lengthwise plan` "
        f"takes {r['lengthwise plan / plan_epoch']:.2f} times the "
        f"first plan ({r['lengthwise plan, own process / plan_epoch']:.2f} as a process of "
        "its own, start-up included). It also computes the figures "
        f"({r['figures (stats) / plan_epoch']:.2f} of a plan). Their random-shuffle reference "
        f"for `step_cv_ratio` shuffles the lengths {_times(saved['reference_shuffles'])} at "
        f"this size ({r['random-shuffle reference / plan_epoch']:.2f} of a plan). It also "
        f"computes the next epoch's batches for `recomposition`{_parts(r)}.", width=100,
        break_on_hyphens=False)


def _edge_search(saved: dict) -> str:
    """The edge search's time in sorts: its layers compiled, and NumPy's where measured."""
    r = saved["ratios"]
    alone = f"The edge search alone takes {r['bucket edges alone / argsort']:.2f} times"
    numpy_layers = r.get("bucket edges alone, NumPy layers / argsort")
    if numpy_layers is None:
        return alone
    if not saved.get("compiled_layers", True):
        return alone + " (its layers in NumPy: no C compiler at install)"
    return (alone + f" with its layers compiled and {numpy_layers:.2f} times with the NumPy "
            "layers that run where no C compiler was there at install")


def _parts(ratios: dict) -> str:
    """The parts of ``lengthwise plan`` beyond the plan and its figures, where measured."""
    part = {name: ratios.get(f"{name} / plan_epoch") for name, _ in PARTS}
    if None in part.values():
        return ""
    sets = part["next epoch's batch sets"]
    return (f" ({sets:.2f} of a plan; comparing them "
            f"with this epoch's, {part['recomposition comparison']:.2f}). The globally sorted "
            "batches that `efficiency_vs_sorted` divides by take "
            f"{part['sorted reference']:.2f} of a plan within the figures, and printing them "
            f"{part['printing']:.2f}")


def _docs_figures():
    import docs_figures  # the marked-region functions of benchmarks/docs_figures.py

    return docs_figures


def region_text(text: str, name: str, where: str) -> tuple[int, int]:
    """Start and end offsets of region ``name``'s body in ``text``."""
    return _docs_figures().region_text(text, name, where)


def rewrite(saved: dict, root: Path = ROOT) -> list[str]:
    """Rewrite every region of :data:`REGIONS` under ``root``; the files changed."""
    return _docs_figures().rewrite_regions(REGIONS, lambda name: render(name, saved), root)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--render", action="store_true",
                    help=f"rewrite the docs' figures from {SAVED.name}; measure nothing")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "PLAN_SPEED_RESULTS.md"))
    args = ap.parse_args()
    if args.render:
        print("\n".join(rewrite(json.loads(SAVED.read_text())) or ["docs are current"]))
        return 0
    lengths = lognormal(902_087)
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "lengths.npy")
        np.save(path, lengths)
        runs = [one_round(lengths, path) for _ in range(rounds)]
    # the best of the rounds: other work on a shared machine only ever adds time
    med = {k: min(r[k] for r in runs) for k in runs[0]}
    base = med["argsort"]
    ratios = {
        "plan_epoch / argsort": med["plan_epoch"] / base,
        "plan_epoch, edges kept / argsort": med["plan_epoch, edges kept"] / base,
        "bucket edges alone / argsort": med["bucket edges alone"] / base,
        "bucket edges alone, NumPy layers / argsort":
            med["bucket edges alone, NumPy layers"] / base,
        "figures (stats) / plan_epoch": med["figures (stats)"] / med["plan_epoch"],
        "random-shuffle reference / plan_epoch":
            med["random-shuffle reference of the figures"] / med["plan_epoch"],
        **{f"{name} / plan_epoch": med[step] / med["plan_epoch"] for name, step in PARTS},
        "len() of a windowed plan / plan_epoch":
            med["len() of a windowed plan"] / med["plan_epoch"],
        "lengthwise plan / plan_epoch": med["lengthwise plan"] / med["plan_epoch"],
        "lengthwise plan, own process / plan_epoch":
            med["lengthwise plan, own process"] / med["plan_epoch"],
    }
    checks = [
        (f"plan_epoch <= {PLAN_OVER_ARGSORT}x one stable argsort",
         ratios["plan_epoch / argsort"] <= PLAN_OVER_ARGSORT, ratios["plan_epoch / argsort"]),
        (f"lengthwise plan <= {CLI_OVER_PLAN}x plan_epoch",
         ratios["lengthwise plan / plan_epoch"] <= CLI_OVER_PLAN,
         ratios["lengthwise plan / plan_epoch"]),
    ]
    distinct = int(np.unique(lengths).size)
    cmd = "python benchmarks/plan_speed.py" + (" --quick" if args.quick else "")
    layers = ("compiled" if edges._compiled is not None
              else "in NumPy: the extension was not built at install")
    text = f"""# Planning speed against a sort

Generated by `{cmd}` on {time.strftime('%Y-%m-%d')}; do not edit by hand.
Machine: {machine()}.

{lengths.size:,} log-normal lengths (the reference run's shape, {distinct:,} distinct lengths),
`max_tokens=16384`, `world_size=8`, `grad_accum=4`, stratified, `buckets="auto"`. Best of
{rounds} round(s); each round times, one after the other: one stable `np.argsort` of the
lengths, `plan_epoch` solving its bucket edges (the first plan of a process), `plan_epoch` of
the next epoch (the edges of these lengths kept), its figures (`plan.stats`; the random-shuffle
reference of `step_cv_ratio` in them, the lengths shuffled
{_times(reference_repeats(lengths.size))}, and the sorted reference of `efficiency_vs_sorted`
are also timed alone), the next epoch's batch sets that `recomposition` compares with this
epoch's, that comparison, the command's text output of the figures,
`len()` of the same epoch planned in windows of {WINDOW:,} samples (its edges solved), the
edge search alone (its layers {layers}), the same with the NumPy layers, and `lengthwise plan
LENGTHS.npy --max-tokens 16384 --world-size 8 --grad-accum 4` run in the same process (no
interpreter start-up) with the edges still to solve: it reads the file, plans, computes the
figures once, and forms the next epoch's batches for `recomposition`; then the same command in
a process of its own (`python -m lengthwise.cli`), interpreter start-up and imports included.

## Targets

| target | met | measured |
|---|---|---|
""" + "\n".join(f"| {name} | {'yes' if ok else 'NO'} | {v:.2f} |" for name, ok, v in checks) + """

## Ratios (same run)

| ratio | value |
|---|---|
""" + "\n".join(f"| {k} | {v:.2f} |" for k, v in ratios.items()) + """

## Seconds (best of the rounds)

| step | seconds |
|---|---|
""" + "\n".join(f"| {k} | {v:.4f} |" for k, v in med.items()) + "\n"
    print(text)
    if not args.quick:
        Path(args.out).write_text(text)
        saved = {"samples": int(lengths.size), "distinct": distinct, "rounds": rounds,
                 "cores": os.cpu_count(), "reference_shuffles": reference_repeats(lengths.size),
                 "compiled_layers": edges._compiled is not None,
                 "ratios": ratios, "seconds": med}
        SAVED.write_text(json.dumps(saved, indent=1) + "\n")
        rewrite(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
