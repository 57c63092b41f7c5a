"""Does the batch order change a DFlash draft, or only the look of its loss curve?

The order experiment of ``order_arms.py`` (:mod:`experiments.arms`) asked on a DFlash
draft for a real target, trained from cached target features through the library's
DFlash recipe (:mod:`experiments.dflash_arms`): arm ``data`` gives every order the same
optimizer steps, each on the same real tokens (padding costs an order compute, never
data); arm ``compute`` gives every order the same counted FLOPs of the draft's step
(forward and backward, its LM head over the supervised slots; the target's forward is
cached and costs nothing). Both arms run under the recipe's warm-up + cosine and warm-up
+ constant, with paired seeds. Per run: the held-out loss, teacher-forced accuracy per
block position, expected acceptance at temperature 0 and 1, ``tokens_per_second``,
``padding_efficiency`` and the per-micro-batch loss log; per cell: 95 % intervals,
paired differences from random, the doctor's bands and ladder findings and the stable
region's figures of each order's loss log (:mod:`experiments.dflash_report`)::

    python benchmarks/order_arms_dflash.py --prepared P --target T --features C --workers 2
    python benchmarks/order_arms_dflash.py --prepared P --target T --features C --check
    python benchmarks/order_arms_dflash.py ... --check-only   # run and save only the check
    python benchmarks/order_arms_dflash.py ... --full-only    # run and save only the full run
    python benchmarks/order_arms_dflash.py ... --out DIR      # continue the runs saved in DIR
    python benchmarks/order_arms_dflash.py ... --set lr=6e-4  # a DFlashTrainConfig setting
    python benchmarks/order_arms_dflash.py ... --start RUN    # every draft starts from RUN
    python benchmarks/order_arms_dflash.py ... --runs DIR     # the full design's saved runs
    python benchmarks/order_arms_dflash.py ... --threads 2    # torch threads per run
    python benchmarks/order_arms_dflash.py --render           # results and plot from the JSON

``P`` is a ``dflash prepare`` folder, ``T`` its target, ``C`` their ``dflash features``
cache. The figures go to ``benchmarks/ORDER_ARMS_DFLASH.json``, a generated
``benchmarks/ORDER_ARMS_DFLASH_RESULTS.md`` and ``docs/order_arms_dflash.png``. Each run is
saved as ``OUT/full/runs/ARM-SCHEDULE-bBATCH/ORDER-seedN.json`` as it ends, so an
interrupted benchmark continues where it stopped when given the same ``--out``.

The full design (:data:`FULL`): 2 arms x 2 schedules x 5 orders (sorted, random,
bucket-random, interleave, stratified) x 5 paired seeds = 100 runs of the draft of
:data:`experiments.dflash_arms.SHAPE` (2 layers, block 8, 32 anchors, micro-batches of
2,048 tokens, 2 micro-batches per step, peak learning rate 3e-3, the recipe's warm-up
share 0.04), 2 epochs, the held-out figures at 2 points. On SmolLM2-135M-Instruct with
its 93 regenerated chats (77 training samples, 19,262 tokens; 16 held out) an epoch of
random is about 19 micro-batches, 9 steps in arm ``data``::

    python benchmarks/order_arms_dflash.py --prepared /work/cache/smol/prepared120 \
        --target /work/cache/smol/target --features /work/cache/smol/fc/features \
        --workers 2 --full-only --out /tmp/order-arms-dflash

Runtime, a measured extrapolation: about 95 minutes on two free cores with ``--workers
2``. One run at the full size (arm ``data``, cosine, random, seed 0; 18 steps, 50
micro-batches, 7.20 TFLOP of draft compute, 3 held-out passes), one thread, measured on
this machine: 99.2 s of CPU in its training loop and evaluations (13.8 CPU seconds per
TFLOP), 112.3 s of CPU in all (target and cache loaded, budget counted). Every run of
the design counts about 7.2 TFLOP (arm ``compute``: the budget, 7.24 TFLOP; arm
``data``: each order's steps, within 2 % of random's), so the 100 runs take about
100 x 112 = 11,200 CPU seconds: 94 min on two workers. The cores were shared with other
jobs during the measurement (595 s of wall time for 112 s of CPU); shared like that the
full run takes about five times as long.

:data:`CHECK` is a reduced design (3 orders, 1 seed, the cosine schedule, both arms, 1
epoch of the first 24 training samples, 8 held out: 6 runs) whose figures on the cache
above are committed under ``check`` (``--check-only``: 2 min of CPU, 10 min of wall time
on the shared machine); ``--check`` reruns it and compares.
``tests/benchmarks/test_order_arms_dflash.py`` runs the same design (2 epochs) on a tiny
random target and checks its invariants. Wall seconds depend on the machine and its load:
shown, never compared.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # experiments/ lies beside this script
    sys.path.insert(0, str(HERE))
ROOT = HERE.parent
SAVED = ROOT / "benchmarks" / "ORDER_ARMS_DFLASH.json"
RESULTS = ROOT / "benchmarks" / "ORDER_ARMS_DFLASH_RESULTS.md"
PLOT = ROOT / "docs" / "order_arms_dflash.png"
RUNS = ROOT / "benchmarks" / "order_arms_dflash_runs"

from experiments import saved as store  # noqa: E402  (experiments/ is on the path from here)

#: the committed experiment (change these, rerun, commit the JSON and the results)
FULL: dict[str, Any] = {"arms": ("data",), "schedules": ("cosine",), "epochs": 1,
                        "eval_points": 2, "train_samples": 400, "train": {"lr": 1.6e-3}}
#: the reduced run whose figures are committed under ``check``
CHECK: dict[str, Any] = {"orders": ("sorted", "random", "stratified"),
                         "reduced": ("sorted", "random", "stratified"), "seeds": (0,),
                         "schedules": ("cosine",), "epochs": 1, "eval_points": 1,
                         "train_samples": 48, "train": {"lr": 1.6e-3}}
#: the run figures a rerun of the check repeats to the last digit
EXACT = ("steps", "micro_batches", "real_tokens", "padded_tokens", "flops")
#: the run figures a rerun of the check repeats within :data:`~experiments.saved.REL_TOL`
CLOSE = ("eval_loss", "eval_accuracy", "expected_acceptance", "expected_acceptance_t1")
NAME = "order_arms_dflash"


def _say(text: str) -> None:
    print(f"{NAME}: {text}", file=sys.stderr, flush=True)


def design(settings: dict[str, Any], args: argparse.Namespace) -> Any:
    """The :class:`~experiments.dflash_arms.DFlashArms` of ``settings`` on the script's data."""
    from experiments.dflash_arms import SHAPE, DFlashArms

    train = {**SHAPE, **settings.get("train", {}), **dict(args.set)}
    return DFlashArms(prepared=args.prepared, target=args.target, features=args.features,
                      start=args.start, threads=args.threads, **{**settings, "train": train})


def run(cfg: Any, out: Path, workers: int, runs: Path | None = None) -> dict[str, Any]:
    """Train every run of ``cfg`` not yet saved under ``runs`` (default ``out/runs``), its
    logs under ``out/logs``; the figures."""
    from experiments.arms_report import map_jobs
    from experiments.dflash_arms import context, run_job
    from experiments.dflash_report import summarise_dflash

    started = time.perf_counter()
    saved = store.CellRuns(runs or out / "runs", cfg, _say)
    done = saved.done()
    jobs = [(job, cfg, str(out / "logs")) for job in cfg.jobs() if job not in done]
    map_jobs(run_job, jobs, workers=workers, on_result=saved.save)
    split = context(cfg).split
    lengths = split.lengths
    info = {"prepared": cfg.prepared, "target": cfg.target, "features": cfg.features,
            "train_samples": int(lengths.size), "train_tokens": int(lengths.sum()),
            "eval_samples": int(split.held_idx.size), "length_min": int(lengths.min()),
            "length_max": int(lengths.max())}
    if cfg.start:
        info["start"] = start_figures(cfg, out / "logs")
    summary = summarise_dflash(cfg, saved.load(), info)
    return store.stamp(summary, started, workers)


def start_figures(cfg: Any, out: Path) -> dict[str, Any]:
    """The held-out figures of the draft every run of ``cfg`` starts from (its ``start``),
    as a run's are measured: the run's baseline."""
    from lengthwise.dflash.train import DFlashTask
    from lengthwise.train.device import configure_torch, pick_device

    from experiments.dflash_arms import cached_rows, context, held_out, run_draft

    device = pick_device("cpu")
    configure_torch(device, threads=cfg.threads, deterministic=True)
    train = cfg.train_config(seed=cfg.data_seed, batch=cfg.batches[0], steps=1)
    draft = run_draft(cfg, train, out / "start", device)
    m = context(cfg).models
    task = DFlashTask(draft.eval(), m.target, train, order="random",
                      features=cached_rows(cfg))
    held = context(cfg).split.held
    cold = held_out(task, held, seed=cfg.data_seed, temperature=0.0)
    hot = held_out(task, held, seed=cfg.data_seed, temperature=1.0)
    return {"path": str(cfg.start), **{k: cold[k] for k in (
        "eval_loss", "eval_accuracy", "slot_accuracy", "expected_acceptance")},
            "expected_acceptance_t1": hot["expected_acceptance"]}


def arguments() -> argparse.ArgumentParser:
    """The script's options (:func:`~experiments.saved.experiment_parser`'s and its data's)."""
    from lengthwise.cli.demo import _positive

    ap = store.experiment_parser(Path(__file__).name, __doc__.split("\n\n")[0])
    ap.add_argument("--prepared", help="a `lengthwise dflash prepare` folder")
    ap.add_argument("--target", help="its target (a Hugging Face folder)")
    ap.add_argument("--features", help="their `lengthwise dflash features` cache")
    ap.add_argument("--start", default=None,
                    help="a `dflash train` run or checkpoint every run's draft starts from "
                         "(default: the recipe's start)")
    ap.add_argument("--runs", default=None,
                    help=f"folder of the full design's saved runs (default: "
                         f"{RUNS.relative_to(ROOT)}, committed)")
    ap.add_argument("--threads", type=_positive, default=1, help="torch threads per run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=_setting,
                    help="a DFlashTrainConfig setting of every run (a JSON value or a string), "
                         "over the design's; repeatable")
    return ap


def _setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as ``(key, value)``: the value read as JSON, else kept as text."""
    import json

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(value)
    except ValueError:
        return key.replace("-", "_"), value


def main(argv: list[str] | None = None) -> int:
    ap = arguments()
    args = store.parse(ap, argv, folders=("out", "runs"))
    saved = store.committed(SAVED, ap)
    if args.render:
        if not saved:
            ap.error(f"--render: {SAVED} holds no figures yet")
        render_all(saved)
        return 0
    missing = [f"--{k}" for k in ("prepared", "target", "features") if not getattr(args, k)]
    if missing:
        ap.error(f"give {', '.join(missing)}: the data, its target and their feature cache")
    out = Path(args.out or tempfile.mkdtemp(prefix="order-arms-dflash-"))
    if args.check:
        fresh = run(design(CHECK, args), out / "check", 1)
        return store.say_check(saved, fresh, invariants(fresh), compare, NAME)
    store.run_parts(saved, args, SAVED, lambda: run(design(CHECK, args), out / "check", 1),
              lambda: run(design(FULL, args), out / "full", args.workers,
                          runs=Path(args.runs) if args.runs else RUNS))
    _say(f"wrote {SAVED}")
    render_all(store.committed(SAVED, ap))
    return 0


def compare(saved: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """The figures of the check run that moved (empty: none)."""
    def key(r: dict[str, Any]) -> tuple[str, int]:
        return f"{r['arm']}/{r['schedule']}/{r['batch']}/{r['order']}", r["seed"]

    old = {key(r): r for r in saved["runs"]}
    new = {key(r): r for r in fresh["runs"]}
    if set(old) != set(new):
        return [f"runs: {sorted(old)} committed, {sorted(new)} now"]
    out = []
    for k, a in old.items():
        b = new[k]
        out += [f"{k} {name}: {a[name]} committed, {b[name]} now"
                for name in EXACT if a[name] != b[name]]
        out += [f"{k} {name}: {a[name]} committed, {b[name]} now"
                for name in CLOSE if not store.close(a[name], b[name])]
    return out


def invariants(summary: dict[str, Any]) -> list[str]:
    """What the design promises of its runs and does not hold (empty: all hold).

    Arm ``data``: every run of a cell the cell's steps, ``epochs`` x the training tokens
    (every sample trained once per epoch), every step within one sample (the longest) of
    the per-step budget. Arm ``compute``: every run's FLOPs at least the budget and less
    than its most costly micro-batch over it. Every held-out loss finite.
    """
    c, data = summary["config"], summary["data"]
    out = []
    for name, cell in summary["cells"].items():
        runs = [r for r in summary["runs"]
                if (r["arm"], r["schedule"], r["batch"]) == (cell["arm"], cell["schedule"],
                                                              cell["batch"])]
        budget = cell["budget"]
        for r in runs:
            where = f"{name}/{r['order']}/seed{r['seed']}"
            if r["eval_loss"] is None:
                out.append(f"{where}: the held-out loss is not finite")
            if cell["arm"] == "data":
                if r["steps"] != budget["steps"]:
                    out.append(f"{where}: {r['steps']} steps, the cell's are {budget['steps']}")
                if r["real_tokens"] != c["epochs"] * data["train_tokens"]:
                    out.append(f"{where}: {r['real_tokens']} real tokens, not {c['epochs']} x "
                               f"{data['train_tokens']} (every sample once per epoch)")
                per = budget["real_tokens_per_step"]
                if max(abs(r["step_tokens_min"] - per), abs(r["step_tokens_max"] - per)) > \
                        data["length_max"]:
                    out.append(f"{where}: steps of {r['step_tokens_min']}-"
                               f"{r['step_tokens_max']} real tokens, budget {per}")
            elif not budget["flops"] <= r["flops"] < budget["flops"] + r["max_micro_flops"]:
                out.append(f"{where}: {r['flops']:,} FLOPs against the budget "
                           f"{budget['flops']:,}")
    return out


def _caption(s: dict[str, Any]) -> str:
    c, d = s["config"], s["data"]
    t = c["train"]
    return (f"A {t['draft_layers']}-layer DFlash draft (block {t['block_size']}, "
            f"{t['num_anchors']} anchors, peak learning rate {t['lr']}) trains from the cached "
            f"features of the target `{d['target']}`. Micro-batches hold at most "
            f"{t['max_tokens']:,} tokens, {c['batches'][0]} per optimizer step. The data: "
            f"{d['train_samples']} training samples ({d['train_tokens']:,} tokens, "
            f"{d['length_min']}-{d['length_max']} long), {c['epochs']} epoch(s), "
            f"{len(c['seeds'])} paired seed(s); held-out figures on {d['eval_samples']} "
            "samples. Mean ± 95 % t-interval over seeds; 'vs random' is the paired "
            f"difference. The {len(s['runs'])} runs took {s['runs_wall_seconds'] / 60:.0f} "
            f"min of wall time and {s['runs_cpu_seconds'] / 60:.0f} min of CPU time "
            f"({s['machine']}, {s['workers']} at a time).")


def results_md(saved: dict[str, Any]) -> str:
    """The generated results page: per part (full, check) the caption, each setting's table
    and decision, the bucket edges."""
    from experiments.dflash_report import decisions, edges_text, table

    parts = ["# Batch order on a DFlash draft from cached target features", "",
             f"Generated by `python benchmarks/{NAME}.py --render` from "
             f"{SAVED.name}; the commands are in the script's docstring.", ""]
    for part in ("full", "check"):
        if part not in saved:
            continue
        s = saved[part]
        parts += [f"## The {'full design' if part == 'full' else 'reduced check'}", "",
                  _caption(s), ""]
        for (name, cell), sentence in zip(s["cells"].items(), decisions(s), strict=True):
            parts += [f"### {name}", "", table(cell), "", sentence, ""]
        parts += ["Bucket edges of each order's plan (first setting):", "", edges_text(s), ""]
    if "full" not in saved:
        parts += ["The full design has not been run yet.", ""]
    return "\n".join(parts)


def plot(summary: dict[str, Any], path: Path = PLOT) -> None:
    """The loss per micro-batch of each order (first seed), one panel per order, one line
    per setting."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from lengthwise.demo.report import order_color

    from experiments.dflash_report import micro_losses

    cells = list(summary["cells"])
    orders = list(summary["cells"][cells[0]]["orders"])
    fig, axes = plt.subplots(1, len(orders), figsize=(3.6 * len(orders), 3.4), squeeze=False,
                             sharey=True)
    for i, cell in enumerate(cells):
        for ax, (name, loss) in zip(axes[0], micro_losses(summary, cell).items(), strict=True):
            ax.plot(range(1, len(loss) + 1), loss, lw=0.9, color=order_color(name, 0),
                    ls=("-", "--", ":", "-.")[i % 4], label=cell)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("micro-batch", fontsize=8)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss of the micro-batch")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_all(saved: dict[str, Any]) -> None:
    """Write the results page and the plot (of the full run, else the check)."""
    RESULTS.write_text(results_md(saved), encoding="utf-8")
    try:
        plot(saved.get("full") or saved["check"])
    except ImportError:
        _say("matplotlib is not installed: no plot")
    _say(f"wrote {RESULTS.name} and {PLOT.name}")


if __name__ == "__main__":
    sys.exit(main())
