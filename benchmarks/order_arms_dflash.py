"""Does the batch order change a DFlash draft, or only the look of its loss curve?

The order experiment of ``order_arms.py`` (:mod:`experiments.arms`) asked on a DFlash
draft for a real target, trained from cached target features through the library's
DFlash recipe (:mod:`experiments.dflash_arms`): arm ``data`` gives every order the same
optimizer steps, each on the same real tokens (padding costs an order compute, never
data); arm ``compute`` gives every order the same counted FLOPs of the draft's step
(forward and backward, its LM head over the supervised slots; the target's forward is
cached and costs nothing). Either arm runs under the recipe's warm-up + cosine or warm-up
+ constant, with paired seeds. Per run: the held-out loss, teacher-forced accuracy per
block position, expected acceptance at temperature 0 and 1, the real acceptance length
of greedy speculative decoding on held-out prompts (``--prompts``), ``tokens_per_second``,
``padding_efficiency`` and the per-micro-batch loss log; per cell: 95 % intervals,
paired differences from random, the doctor's bands and ladder findings and the stable
region's figures of each order's loss log (:mod:`experiments.dflash_report`)::

    python benchmarks/order_arms_dflash.py --prepared P --target T --features C --workers 2
    python benchmarks/order_arms_dflash.py --prepared P --target T --features C --check
    python benchmarks/order_arms_dflash.py ... --check-only   # run and save only the check
    python benchmarks/order_arms_dflash.py ... --full-only    # run and save only the full run
    python benchmarks/order_arms_dflash.py ... --out DIR      # the logs (and the check's runs)
    python benchmarks/order_arms_dflash.py ... --set lr=6e-4  # a DFlashTrainConfig setting
    python benchmarks/order_arms_dflash.py ... --start DRAFT  # every draft starts from DRAFT
    python benchmarks/order_arms_dflash.py ... --prompts FILE # real acceptance on its prompts
    python benchmarks/order_arms_dflash.py ... --runs DIR     # the full design's saved runs
    python benchmarks/order_arms_dflash.py ... --threads 2    # torch threads per run
    python benchmarks/order_arms_dflash.py --render           # results and plot from the JSON

``P`` is a ``dflash prepare`` folder, ``T`` its target, ``C`` their ``dflash features``
cache, ``DRAFT`` an exported draft (``dflash export``) or a ``dflash train`` run or
checkpoint of that target, ``FILE`` a prompt file (``dflash eval --prompts``). The figures
go to ``benchmarks/ORDER_ARMS_DFLASH.json``, a generated
``benchmarks/ORDER_ARMS_DFLASH_RESULTS.md``, the README's region ``order-arms-dflash`` and
``docs/order_arms_dflash.png``. Each run of the full design is saved as it ends, as
``RUNS/ARM-SCHEDULE-bBATCH/ORDER-seedN.json`` (default :data:`RUNS`, committed, with
``design.json``): an interrupted benchmark continues where it stopped, in this session or
a later one. Runs saved for another design (other data, start, prompts or settings) are
refused, never mixed in: ``design.json`` records the paths and digests of what the runs
read (:func:`experiments.dflash_arms.inputs`).

What the runs read, and how a new machine gets it: the prepared chats are committed
(``real_target_large_prepared/``); so is the start (``order_arms_dflash_start/``, 31 MB:
the large real-target run's draft at its step 400, exported in float32), because 400
training steps made again on another machine do not come out bit for bit the same; the
feature cache (2.3 GB) is made again from the prepared chats in about 22 minutes, and the
prompts are written with it::

    python benchmarks/real_target_dflash.py --scale large --work /work/cache/smol \
        --evals DIR      # stop it once it prints "lengthwise dflash train"

The full design (:data:`FULL`) asks the question of a draft that has learned: every run
continues that shared draft (400 steps of 2,048 tokens from the target's top layers, the
stratified order; its held-out figures are in the results). It trains one more epoch of a
draw of 400 of the 2,453 training chats (119 k tokens, 61-1,024 long), in steps of 2
micro-batches of 2,048 tokens, at a peak learning rate of 1.6e-3 (the shared run's rate at
its step 400) under the recipe's warm-up + cosine, or the same warm-up and a constant rate;
held-out figures on the 16 chats that run held out, at 2 points; real acceptance on the
first 16 of the held-out data sets' chats (``heldout_chats.jsonl``), 48 new tokens each. 5
orders x 5 paired seeds a cell; run it from the repository's root::

    L=/work/cache/smol/large
    python benchmarks/order_arms_dflash.py --prepared $L/prepared \
        --target /work/cache/smol/target --features $L/features \
        --start benchmarks/order_arms_dflash_start --prompts $L/heldout_chats.jsonl \
        --workers 2 --out /tmp/order-arms-dflash

Arm ``compute`` trains the same 25 pairs to the FLOPs of arm data's random run. Arm data
under the constant schedule is a third cell (25 runs); :data:`FULL` leaves out arm compute
under it (``skip``). Runtime, measured: arm data's 25 runs took 88 minutes with
``--workers 2`` on two otherwise idle cores (134 minutes of CPU; about 5.5 minutes of one
core a run, of which about 80 seconds decode the prompts), arm compute's 122 minutes of
CPU; then 3 minutes for the start's figures. A run is committed as it ends, so the same
command continues a stopped design and writes the figures once every run is saved; until
then the committed figures are those of the last complete design.

:data:`CHECK` is a reduced design on the same data and start (3 orders, 1 seed, the
cosine schedule, both arms, 1 epoch of 48 training samples: 6 runs, 3 min); ``--check``
reruns it and compares. ``tests/benchmarks/test_order_arms_dflash.py`` runs the same
design (2 epochs) on a tiny random target and checks its invariants. Wall seconds depend
on the machine and its load: shown, never compared.
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
#: the files and the regions of each that ``--render`` writes from the committed full design
REGIONS: dict[str, tuple[str, ...]] = {"README.md": ("order-arms-dflash",)}

from experiments import saved as store  # noqa: E402  (experiments/ is on the path from here)

#: the committed experiment (change these, rerun, commit the JSON and the results)
FULL: dict[str, Any] = {"arms": ("data", "compute"), "schedules": ("cosine", "constant"),
                        "skip": (("compute", "constant"),), "epochs": 1,
                        "eval_points": 2, "train_samples": 400, "train": {"lr": 1.6e-3}}
#: the reduced run whose figures are committed under ``check``
CHECK: dict[str, Any] = {"orders": ("sorted", "random", "stratified"),
                         "reduced": ("sorted", "random", "stratified"), "seeds": (0,),
                         "schedules": ("cosine",), "epochs": 1, "eval_points": 1,
                         "prompt_limit": 4, "prompt_tokens": 16,
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
                      start=args.start, prompts=args.prompts, threads=args.threads,
                      **{**settings, "train": train})


def run(cfg: Any, out: Path, workers: int, runs: Path | None = None) -> dict[str, Any]:
    """Train every run of ``cfg`` not yet saved under ``runs`` (default ``out/runs``), its
    logs under ``out/logs``; the figures."""
    from experiments.arms_report import map_jobs
    from experiments.dflash_arms import context, inputs, run_job
    from experiments.dflash_report import summarise_dflash

    started = time.perf_counter()
    saved = store.CellRuns(runs or out / "runs", cfg, _say, inputs(cfg))
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

    from experiments.dflash_arms import cached_rows, context, held_out, real_acceptance, run_draft

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
            "expected_acceptance_t1": hot["expected_acceptance"],
            **real_acceptance(cfg, draft, lookup=True)}


def arguments() -> argparse.ArgumentParser:
    """The script's options (:func:`~experiments.saved.experiment_parser`'s and its data's)."""
    from lengthwise.cli.demo import _positive

    ap = store.experiment_parser(Path(__file__).name, __doc__.split("\n\n")[0])
    ap.add_argument("--prepared", help="a `lengthwise dflash prepare` folder")
    ap.add_argument("--target", help="its target (a Hugging Face folder)")
    ap.add_argument("--features", help="their `lengthwise dflash features` cache")
    ap.add_argument("--start", default=None,
                    help="a draft every run starts from: exported (`dflash export`), or a "
                         "`dflash train` run or checkpoint (default: the recipe's start)")
    ap.add_argument("--prompts", default=None,
                    help="a prompt file: each run's real acceptance on its first prompts "
                         "(default: none measured)")
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
            f"difference. A setting's decision compares {len(c['orders']) - 1} orders with "
            "random on 3 figures: at 95 % about one interval in 20 misses 0 by chance alone, so "
            f"one that barely clears 0 is weak evidence. The {len(s['runs'])} runs took "
            f"{s['runs_wall_seconds'] / 60:.0f} min of wall time and "
            f"{s['runs_cpu_seconds'] / 60:.0f} min of CPU time "
            f"({s['machine']}, {s['workers']} at a time)." + _start_text(d.get("start")))


def _start_text(start: dict[str, Any] | None) -> str:
    """The sentence on the draft every run starts from (none: the recipe's start)."""
    if not start:
        return " Every run starts from the recipe's initial draft at its seed."
    text = (f" Every run starts from one shared draft, `{start['path']}`: held-out loss "
            f"{start['eval_loss']:.3f}, accuracy {start['eval_accuracy']:.3f}, expected "
            f"acceptance {start['expected_acceptance']:.3f} at T = 0 and "
            f"{start['expected_acceptance_t1']:.3f} at T = 1.")
    if "acceptance_length" in start:
        lo, hi = start["acceptance_interval"]
        blo, bhi = start["baseline_acceptance_interval"]
        text += (f" Decoding the held-out prompts greedily (the 'accept length' column, "
                 f"{start['verify_forwards']} verifying forwards), it keeps "
                 f"{start['acceptance_length']:.3f} [{lo:.3f}, {hi:.3f}] tokens a forward; "
                 f"{start['baseline']} keeps {start['baseline_acceptance_length']:.3f} "
                 f"[{blo:.3f}, {bhi:.3f}].")
    return text


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
            parts += [f"### {name}", "", table(cell), "", sentence, "",
                      "The doctor on each order's micro-batch loss log (seeds with the "
                      "finding):", "", findings_text(cell), ""]
            steps = findings_text(cell, "step_findings")
            if steps:
                parts += ["The doctor on each order's optimizer-step loss log (the mean of "
                          "the step's micro-batches):", "", steps, ""]
        parts += ["Bucket edges of each order's plan (first setting):", "", edges_text(s), ""]
    if "full" not in saved:
        parts += ["The full design has not been run yet.", ""]
    return "\n".join(parts)


def findings_text(cell: dict[str, Any], log: str = "findings") -> str:
    """Per order of ``cell``, the doctor's findings on its loss logs (bands, the per-bucket
    ladder; ``log``: ``findings`` of the micro-batch log, ``step_findings`` of the step
    log) and in how many seeds each was found; what it could not test, said once."""
    lines = []
    for name, row in cell["orders"].items():
        per_seed = row["loss_log"].get(log) or {}
        if not per_seed:
            continue
        counts: dict[str, int] = {}
        for names in per_seed.values():
            for f in set(names):
                counts[f] = counts.get(f, 0) + 1
        found = [f"{f} ({n} of {len(per_seed)})" for f, n in sorted(counts.items())
                 if not f.endswith("_untested")]
        untested = [f"{f.removesuffix('_untested')} ({n} of {len(per_seed)})"
                    for f, n in sorted(counts.items()) if f.endswith("_untested")]
        text = ", ".join(found) or "none"
        if untested:
            text += f"; too few lines to test: {', '.join(untested)}"
        lines.append(f"- {name}: {text}")
    return "\n".join(lines)


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


def readme_table(cell: dict[str, Any]) -> str:
    """The README's table of ``cell``: one row per order (at most 8), the held-out figures
    and their paired difference from random, padding and the loss log's bands."""
    from experiments.dflash_report import _pm

    head = ["order", "held-out loss", "vs random", "E[accept] T=0", "vs random",
            "E[accept] T=1", "accept length T=0", "padding eff.", "bands (0.1)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, row in list(cell["orders"].items())[:8]:
        vs = row.get("vs_random") or {}
        lines.append("| " + " | ".join([
            f"`{name}`", _pm(row["eval_loss"]), _pm(vs.get("eval_loss"), "+.3f"),
            _pm(row["expected_acceptance"]), _pm(vs.get("expected_acceptance"), "+.3f"),
            _pm(row["expected_acceptance_t1"]), _pm(row.get("acceptance_length")),
            _pm(row["padding_efficiency"], ".2f"),
            _pm(row["loss_log"]["bands_at_0_1"], ".1f")]) + " |")
    return "\n".join(lines)


def render(name: str, saved: dict[str, Any]) -> str:
    """The text of README region ``name`` from the committed full design."""
    from experiments.dflash_report import decisions

    if name != "order-arms-dflash":
        raise KeyError(f"no region {name!r}")
    s = saved["full"]
    c, d = s["config"], s["data"]
    start = d.get("start")
    lead = f"`python benchmarks/{NAME}.py` asks it of a DFlash draft for SmolLM2-135M-Instruct"
    if start:
        lead += (f", each run continuing one shared draft (E[accept] "
                 f"{start['expected_acceptance']:.2f} at T = 0) for {c['epochs']} "
                 f"epoch{'s' * (c['epochs'] != 1)} of {d['train_samples']} chats")
    arms = {"data": "the same steps on the same tokens", "compute": "the same draft FLOPs"}
    cells, sentences = list(s["cells"].values()), decisions(s)
    parts = [_wrap(f"{lead}: {len(c['orders'])} orders, {len(c['seeds'])} paired seeds, "
                   f"{arms[cells[0]['arm']]}, {cells[0]['schedule']} schedule:"),
             "", readme_table(cells[0]), "", _wrap(sentences[0])]
    others = [f"{'same data' if x['arm'] == 'data' else 'same compute'} ({x['schedule']})"
              for x in cells[1:]]
    their = "their" if len(others) > 1 else "its"
    if others:  # the other settings' decisions are on the results page
        parts += ["", _wrap(f"{' and '.join(others).capitalize()}: {their} decision"
                            f"{'s' * (len(others) > 1)}, every interval and the doctor's "
                            f"findings are in [the results](benchmarks/{RESULTS.name}).")]
    return "\n".join([*parts, "", f"![loss per micro-batch of each order](docs/{PLOT.name})"])


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False)


def render_all(saved: dict[str, Any]) -> None:
    """Write the results page, the plot (of the full run, else the check) and, once the
    full design is committed, the README's region."""
    from docs_figures import rewrite_regions

    RESULTS.write_text(results_md(saved), encoding="utf-8")
    if "full" in saved:
        rewrite_regions(REGIONS, lambda name: render(name, saved), ROOT)
    try:
        plot(saved.get("full") or saved["check"])
    except ImportError:
        _say("matplotlib is not installed: no plot")
    _say(f"wrote {RESULTS.name} and {PLOT.name}")


if __name__ == "__main__":
    sys.exit(main())
