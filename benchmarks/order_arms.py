"""What the batch order buys, free of its confounds: equal steps and data, or equal compute.

Trains the demo's causal LM from scratch once per cell, order and seed
(:mod:`experiments.arms`): arm ``data`` gives every order the same optimizer steps,
each on the same real tokens (padding costs an order compute, never data); arm
``compute`` gives every order the same FLOPs (:mod:`lengthwise.demo.flops`), so the order
that pads more sees less data. Each arm runs under warm-up + cosine and warm-up +
constant learning rates, at global batches of 8 and 64 micro-batches per step, with
paired seeds; the figures (:mod:`experiments.arms_report`) hold the held-out loss
overall and per length stratum with 95 % intervals, paired differences from random, the
curves against steps, real tokens and FLOPs, and the unigram level of the held-out set::

    python benchmarks/order_arms.py --workers 2      # the full run -> ORDER_ARMS.json
    python benchmarks/order_arms.py --check          # rerun the reduced check, compare
    python benchmarks/order_arms.py --check-only     # run and save only the check
    python benchmarks/order_arms.py --full-only      # run and save only the full run
    python benchmarks/order_arms.py --out DIR        # continue the runs saved in DIR
    python benchmarks/order_arms.py --render         # docs regions and plots from the JSON

Each run is saved as ``OUT/full/runs/ARM-SCHEDULE-bBATCH/ORDER-seedN.json`` as it ends,
so an interrupted benchmark continues where it stopped when given the same ``--out``.

The full design (:data:`FULL`): 2 arms x 2 schedules x 2 batch sizes = 8 cells, 5 paired
seeds in every cell; the cells of batch 8 train every order of the planner's vocabulary
(sorted, random, bucket-random, interleave, stratified), those of batch 64 the reduced set
(sorted, random, bucket-random, stratified): 180 runs, each 5 epochs over 1,938 training
samples (106,837 tokens, 8-256 tokens long; 315 steps at batch 8, 40 at batch 64), the
held-out loss on 303 samples at 8 points.

Runtime, a measured extrapolation: about 1 h 45 min on two free cores with ``--workers 2``.
Measured on this machine (2 cores, 2 runs at once, one thread each, 4-epoch runs of the
same data): arm ``data`` / cosine / batch 8 / random took 67.1 s of CPU for 1.246 TFLOP and
arm ``compute`` / constant / batch 64 / stratified 64.8 s for 1.274 TFLOP, evaluations
included: 52.3 CPU seconds per counted TFLOP. The 180 runs of the full design count 241.1
TFLOP (arm ``compute``: the budget, 1.592 TFLOP a run; arm ``data``: each order's steps,
from its plans), so 12,600 CPU seconds, 1.75 h on two workers. During the measurement the
cores were shared with other jobs (each run got about half a core: 125 s of wall time
each); shared like that the full run takes about twice as long.

:data:`CHECK` is a reduced design (both arms and schedules, batch 8, three orders, one
seed, 195 training samples, 12 runs: about 40 s on one core) that
``tests/benchmarks/test_order_arms.py`` reruns: against the committed check once ORDER_ARMS.json
exists, and for the design's invariants (equal steps and real tokens per step, equal
FLOPs) always. Until the full run has been made no ORDER_ARMS.json is committed, and
``--check`` checks the invariants only. Wall seconds depend on the machine and its load:
shown, never compared.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # experiments/ and docs_figures.py lie beside this script
    sys.path.insert(0, str(HERE))
ROOT = HERE.parent
SAVED = ROOT / "benchmarks" / "ORDER_ARMS.json"
PLOTS = {"compute": ROOT / "docs" / "order_arms_compute.png",
         "data": ROOT / "docs" / "order_arms_data.png"}

#: the committed experiment (change these, rerun, commit the JSON and the docs)
FULL: dict[str, Any] = {"max_samples": 2000, "epochs": 5, "eval_samples": 320,
                        "eval_points": 8}
#: the reduced run that CI repeats and compares with the committed one
CHECK: dict[str, Any] = {"orders": ("sorted", "random", "stratified"),
                         "reduced": ("sorted", "random", "stratified"), "seeds": (0,),
                         "batches": (8,), "full_batches": (8,), "epochs": 2,
                         "max_samples": 200, "eval_samples": 40, "eval_points": 2}
#: the files and the regions of each that this script writes from the committed figures
#: (the markers are to be put into the docs with the first committed full run)
REGIONS: dict[str, tuple[str, ...]] = {
    "README.md": ("order-arms-summary",),
    "docs/demo.md": ("order-arms-detail", "order-arms-demo-note"),
}
#: the run figures a rerun of the check repeats to the last digit
EXACT = ("steps", "micro_batches", "real_tokens", "padded_tokens", "flops")

from experiments.saved import (  # noqa: E402  (experiments/ is on the path from here on)
    REL_TOL,  # noqa: F401  (the check's tolerance, read by the tests)
    CellRuns,
    close,
    committed,
    experiment_parser,
    parse,
    run_parts,
    say_check,
    stamp,
)


def _say(text: str) -> None:
    print(f"order_arms: {text}", file=sys.stderr, flush=True)


def _config(settings: dict[str, Any]) -> Any:
    from experiments.arms import ArmsConfig

    return ArmsConfig(**settings)


def run(settings: dict[str, Any], out: Path, workers: int, cache_dir: str | None,
        ) -> dict[str, Any]:
    """Train every run of ``settings`` not yet saved under ``out/runs``; the figures."""
    from experiments.arms_report import run_arms, summarise_arms
    from experiments.data import build_data

    cfg = _config(settings)
    started = time.perf_counter()
    data = build_data(cfg, cache_dir=cache_dir)
    saved = CellRuns(out / "runs", cfg, _say)
    if len(saved.done()) != len(cfg.jobs()):
        run_arms(cfg, data, out=out / "logs", workers=workers, skip=saved.done(),
                 on_run=saved.save)
    summary = summarise_arms(cfg, data, saved.load())
    return stamp(summary, started, workers)


def arguments() -> argparse.ArgumentParser:
    """The script's options (:func:`~experiments.saved.experiment_parser`'s and its data's)."""
    ap = experiment_parser(Path(__file__).name, __doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", default=None, help="the demo's corpus/tokenizer cache")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = arguments()
    args = parse(ap, argv, ("out", "cache_dir"))
    out = Path(args.out or tempfile.mkdtemp(prefix="order-arms-"))
    saved = committed(SAVED, ap)
    if args.render:
        if "full" not in saved:
            ap.error(f"--render: {SAVED} holds no full run yet")
        plot(saved["full"])
        print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
        return 0
    if args.check:
        fresh = run(CHECK, out / "check", 1, args.cache_dir)
        return say_check(saved, fresh, invariants(fresh), compare, "order_arms")
    run_parts(saved, args, SAVED, lambda: run(CHECK, out / "check", 1, args.cache_dir),
              lambda: run(FULL, out / "full", args.workers, args.cache_dir))
    _say(f"wrote {SAVED}")
    if "full" in saved:
        full = committed(SAVED, ap)["full"]
        plot(full)
        print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
    return 0


def compare(saved: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """The figures of the check run that moved (empty: none)."""
    def pairs(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        out = [("eval_loss", a["eval_loss"], b["eval_loss"])]
        out += [(f"strata[{i}]", x, y)
                for i, (x, y) in enumerate(zip(a["strata"], b["strata"], strict=True))]
        return out + [(f"curve[{i}]", p["eval_loss"], q["eval_loss"])
                      for i, (p, q) in enumerate(zip(a["curve"], b["curve"], strict=True))]

    out = []
    old = {_run_key(r): r for r in saved["runs"]}
    new = {_run_key(r): r for r in fresh["runs"]}
    if set(old) != set(new):
        return [f"runs: {sorted(old)} committed, {sorted(new)} now"]
    for key, a in old.items():
        b = new[key]
        out += [f"{key} {name}: {a[name]} committed, {b[name]} now"
                for name in EXACT if a[name] != b[name]]
        out += [f"{key} {name}: {x} committed, {y} now"
                for name, x, y in pairs(a, b) if not close(x, y)]
    if not close(saved["unigram_loss"], fresh["unigram_loss"]):
        out.append(f"unigram_loss: {saved['unigram_loss']} committed, "
                   f"{fresh['unigram_loss']} now")
    return out


def _run_key(r: dict[str, Any]) -> tuple[str, int]:
    """A run's name in the compared figures: its cell and order, and its seed."""
    return f"{r['arm']}/{r['schedule']}/{r['batch']}/{r['order']}", r["seed"]


def invariants(summary: dict[str, Any]) -> list[str]:
    """What the design promises of its runs and does not hold (empty: all hold).

    Arm ``data``: every run of a cell the cell's steps, ``epochs`` x the training tokens,
    and every step within one sample (``max_len`` tokens) of the per-step budget. Arm
    ``compute``: every run's FLOPs at least the budget and less than one micro-batch over
    it. Every held-out loss finite, every curve ``eval_points`` long.
    """
    from experiments.arms import micro_flops_bound

    cfg = summary["config"]
    out = []
    tokens = summary["data"]["train_tokens"] * cfg["epochs"]
    bound = micro_flops_bound(_config(_settings(cfg)), summary["vocab_size"])
    for r in summary["runs"]:
        name = f"{r['arm']}/{r['schedule']}/{r['batch']}/{r['order']}/seed{r['seed']}"
        b = r["budget"] if "budget" in r else summary["cells"][
            f"{r['arm']}/{r['schedule']}/{r['batch']}"]["budget"]
        if r["arm"] == "data":
            per = b["real_tokens_per_step"]
            if r["steps"] != b["steps"]:
                out.append(f"{name}: {r['steps']} steps, the cell's are {b['steps']}")
            if r["real_tokens"] != tokens:
                out.append(f"{name}: {r['real_tokens']:,} real tokens, not {tokens:,}")
            if not (per - cfg["max_len"] <= r["step_tokens_min"]
                    and r["step_tokens_max"] <= per + cfg["max_len"]):
                out.append(f"{name}: steps of {r['step_tokens_min']}-{r['step_tokens_max']} real "
                           f"tokens, more than one sample from {per}")
        elif not b["flops"] <= r["flops"] < b["flops"] + bound:
            out.append(f"{name}: {r['flops']:,} FLOPs, budget {b['flops']:,} (+ one "
                       f"micro-batch, at most {bound:,})")
        losses = [r["eval_loss"], *(p["eval_loss"] for p in r["curve"])]
        if not all(isinstance(x, float) and math.isfinite(x) for x in losses):
            out.append(f"{name}: a held-out loss is not finite")
        if len(r["curve"]) != cfg["eval_points"]:
            out.append(f"{name}: {len(r['curve'])} measurements, not {cfg['eval_points']}")
    if not math.isfinite(summary["unigram_loss"]):
        out.append("unigram_loss is not finite")
    return out


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of an :class:`~experiments.arms.ArmsConfig` from its ``to_dict()``."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


# -- the reading, generated from the figures -------------------------------------------------
def _pm(iv: dict[str, Any] | None, spec: str = ".3f") -> str:
    """``mean +- half`` of an interval (``-`` when missing)."""
    if not iv or iv.get("mean") is None:
        return "-"
    half = iv.get("half")
    if half is None:
        return format(iv["mean"], spec)
    return f"{format(iv['mean'], spec)} ± {format(half, spec.lstrip('+'))}"


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False)


def _where(cell: dict[str, Any]) -> str:
    return f"{cell['schedule']}, batch {cell['batch']}"


def _detected(diff: dict[str, Any] | None) -> bool:
    return bool(diff and diff.get("detected"))


def _differing(row: dict[str, Any]) -> str:
    """The strata whose paired difference from random is detected, with it (``-``: none)."""
    strata = (row.get("vs_random") or {}).get("strata") or {}
    found = [f"{s} {_pm(d, '+.3f')}" for s, d in strata.items() if _detected(d)]
    return ", ".join(found) or "-"


def table(full: dict[str, Any]) -> str:
    """Arm x schedule x batch x order: held-out loss and its paired difference from random
    (mean ± 95 % interval over seeds), the strata that differ, real tokens, compute, steps,
    whether it settled, and the (machine-dependent) training seconds."""
    head = ["arm", "schedule", "batch", "order", "held-out loss", "vs random",
            "lengths that differ", "real tokens", "GFLOP", "steps", "settled", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---|" + "---:|" * 2 + "---|"
             + "---:|" * 3 + "---|---:|"]
    for cell in full["cells"].values():
        for name, row in cell["orders"].items():
            diff = (row.get("vs_random") or {}).get("eval_loss")
            lines.append("| " + " | ".join([
                "same steps, same data" if cell["arm"] == "data" else "same compute",
                cell["schedule"], str(cell["batch"]), name, _pm(row["eval_loss"]),
                _pm(diff, "+.3f") if diff else "-", _differing(row),
                f"{row['real_tokens']['mean']:,.0f}", f"{row['flops']['mean'] / 1e9:,.0f}",
                f"{row['steps']['mean']:.0f}", "yes" if row["settled"] else "no",
                f"{row['train_seconds']['mean']:.0f}"]) + " |")
    return "\n".join(lines)


def _compute_parts(cells: list[dict[str, Any]]) -> list[str]:
    """Which order to pick at equal compute, one clause per global batch: the orders whose
    held-out loss is below random's under every schedule of that batch size (paired
    differences), and those above it; an order is judged only where it ran."""
    def join(names: list[str]) -> str:
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]

    def span(ds: list[float]) -> str:
        lo, hi = min(ds), max(ds)
        return f"{lo:.3f}" if abs(hi - lo) < 5e-4 else f"{lo:.3f}-{hi:.3f}"

    parts = []
    for batch in sorted({c["batch"] for c in cells}):
        group = [c for c in cells if c["batch"] == batch]
        where = (f"{batch} micro-batches per step ("
                 + join([c["schedule"] for c in group]) + ")")
        diffs: dict[str, list[dict[str, Any] | None]] = {}
        above: dict[str, list[tuple[float, str]]] = {}
        for c in group:
            for name, row in c["orders"].items():
                if name != "random":
                    d = (row.get("vs_random") or {}).get("eval_loss")
                    diffs.setdefault(name, []).append(d)
                    if _detected(d) and d["mean"] > 0:
                        above.setdefault(name, []).append((d["mean"], c["schedule"]))
        below = [n for n, ds in diffs.items() if len(ds) == len(group)
                 and all(_detected(d) and d["mean"] < 0 for d in ds)]
        if below:
            gains = [-d["mean"] for n in below for d in diffs[n]]
            text = (f"at {where} pick {'any of ' * (len(below) > 1)}{join(below)}: the "
                    f"held-out loss is below random's "
                    f"under every schedule, by {span(gains)} nats")
        elif above:
            text = f"at {where} no order's held-out loss is below random's under every schedule"
        else:
            text = f"at {where} no order's held-out loss differs from random's (no difference " \
                   "detected at this size)"
        if above:
            text += ("; above it: " + join([
                f"{n} by up to {max(v)[0]:.3f} ({join(sorted({w for _, w in v}))})"
                for n, v in above.items()]))
        parts.append(text)
    return parts


def _data_parts(cells: list[dict[str, Any]]) -> list[str]:
    """What each order costs (compute) or buys (held-out loss) against random at equal data,
    one clause per order."""
    names = [n for n in cells[0]["orders"] if n != "random"] if cells else []
    parts = []
    for name in names:
        rows = [(c, c["orders"][name]) for c in cells if name in c["orders"]]
        ratio = [row["flops"]["mean"] / c["orders"]["random"]["flops"]["mean"] for c, row in rows]
        found = [(c, row["vs_random"]["eval_loss"]) for c, row in rows
                 if _detected(row["vs_random"]["eval_loss"])]
        cost = (f"{min(ratio):.2f}x" if max(ratio) - min(ratio) < 0.005
                else f"{min(ratio):.2f}-{max(ratio):.2f}x")
        if found:
            c, d = max(found, key=lambda cd: abs(cd[1]["mean"]))
            word = "higher" if d["mean"] > 0 else "lower"
            size = _pm({"mean": abs(d["mean"]), "half": d["half"]})
            effect = (f"its held-out loss is {word} in {len(found)} of {len(rows)} settings "
                      f"(by up to {size}, {_where(c)})")
        else:
            strata = [(c, s, d) for c, row in rows
                      for s, d in (row["vs_random"].get("strata") or {}).items() if _detected(d)]
            effect = "no difference detected at this size"
            if strata:
                c, s, d = max(strata, key=lambda x: abs(x[2]["mean"]))
                effect += (f" overall, though lengths {s} differ by {_pm(d, '+.3f')} "
                           f"({_where(c)})")
        parts.append(f"{name} costs {cost} random's compute and {effect}")
    return parts


def _bullets(parts: list[str]) -> str:
    """``parts`` as a Markdown list, each a sentence of its own."""
    return "\n".join(textwrap.fill(f"- {p[0].upper()}{p[1:]}.", width=100,
                                   subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False) for p in parts)


def summary(full: dict[str, Any]) -> str:
    """The README's reading of the experiment: one bullet per order at equal data, one per
    global batch at equal compute."""
    cells = list(full["cells"].values())
    c = full["config"]
    head = _wrap(
        f"`python benchmarks/order_arms.py` trains the demo's model from scratch "
        f"{len(full['runs'])} times: {len(c['seeds'])} paired seeds, {c['epochs']} epochs, "
        "two schedules, two global batches. At equal data (the same samples and optimizer "
        "steps), against random:")
    data = _bullets(_data_parts([x for x in cells if x["arm"] == "data"]))
    compute = _bullets(_compute_parts([x for x in cells if x["arm"] == "compute"]))
    return (head + "\n\n" + data + "\n\n"
            + _wrap("At equal compute (the FLOPs random spends on the same epochs):") + "\n\n"
            + compute + "\n\n" + _wrap("The table, plots and intervals per length are in "
                                        "[docs/demo.md](docs/demo.md)."))


def decision(full: dict[str, Any]) -> str:
    """The decision: which order to pick at equal compute, one bullet per global batch, and
    what each order costs or buys at equal data, one bullet per order (paired differences
    from random; a difference only where its 95 % interval excludes zero)."""
    cells = list(full["cells"].values())
    compute = _compute_parts([c for c in cells if c["arm"] == "compute"])
    data = _data_parts([c for c in cells if c["arm"] == "data"])
    return "\n\n".join([
        "At equal compute:\n\n" + _bullets(compute) if compute
        else "At equal compute, no order was compared.",
        "At equal data, against random:\n\n" + _bullets(data) if data
        else "At equal data, no order was compared."])


def learned(full: dict[str, Any]) -> str:
    """Whether the model learned: the held-out loss at the end against the unigram level."""
    ends = [row["eval_loss"]["mean"] for c in full["cells"].values()
            for row in c["orders"].values()]
    per_batch = []
    for batch in sorted({c["batch"] for c in full["cells"].values()}):
        got = [row["eval_loss"]["mean"] for c in full["cells"].values() if c["batch"] == batch
               for row in c["orders"].values()]
        per_batch.append(f"{min(got):.3f}-{max(got):.3f} at {batch} micro-batches per step")
    uni = full["unigram_loss"]
    unsettled = sum(not row["settled"] for c in full["cells"].values()
                    for row in c["orders"].values())
    return _wrap(
        f"The held-out loss ends at {min(ends):.3f}-{max(ends):.3f} nats per token across the "
        f"cells ({', '.join(per_batch)}). A model of the training set's token frequencies "
        f"alone (unigram, {full['unigram_smoothing']}) scores {uni:.3f} on the held-out set. "
        + (f"{unsettled} of the rows still move over the last {full['settle_share']:.0%} of "
           f"their run by more than their interval." if unsettled else
           "Every row has settled: its loss moves less over the last "
           f"{full['settle_share']:.0%} of the run than its interval."))


def _caption(full: dict[str, Any]) -> str:
    c, d = full["config"], full["data"]
    cells = list(full["cells"].values())
    runs = len(full["runs"])
    wall, cpu = full.get("runs_wall_seconds"), full.get("runs_cpu_seconds")
    return _wrap(
        f"`python benchmarks/order_arms.py`: the {c['model_size']} causal LM of the demo "
        f"trained from scratch {runs} times ({len(cells)} settings x orders x "
        f"{len(c['seeds'])} paired seeds). Each run is {c['epochs']} epochs of "
        f"{d['train_samples']:,} samples ({d['train_tokens']:,} tokens, "
        f"{d['length_min']}-{d['length_max']} tokens long, median {d['length_p50']}). "
        f"Micro-batches hold at most {c['max_tokens']} padded tokens, from a simulated world of "
        f"{c['world']} ranks, {', '.join(map(str, c['batches']))} micro-batches per step. "
        "Same steps, same data: every order the same optimizer steps, "
        f"each on the same real tokens (within one sample), so padding costs compute, not data. "
        f"Same compute: every order the FLOPs random spends on the epochs (forward and backward "
        f"of every padded token, attention included), so the order that pads more sees less "
        f"data. Learning rate: warm-up over {c['warmup_share']:.0%}, then cosine to zero or "
        f"constant. Held-out loss on {d['eval_samples']} samples; mean ± 95 % t-interval over "
        f"seeds; 'vs random': the paired difference (same seed); 'lengths that differ': the "
        f"length strata whose paired difference excludes zero. Training seconds depend on the "
        f"machine's load ({full['machine']}; the runs took {(wall or 0) / 3600:.1f} h of wall "
        f"time and {(cpu or 0) / 3600:.1f} h of CPU time in all, {full['workers']} at a time).")


def demo_note(full: dict[str, Any]) -> str:
    """What the demo's own table compares, beside this experiment's two arms."""
    arm = "same steps, same data"
    return _wrap(
        "The demo's table compares the orders at equal data, at one seed: every order trains "
        "the same samples once per epoch, each in its own plan's steps. The order that pads "
        "more takes more steps and more compute for the same data. The order experiment's "
        f"arm \"{arm}\" also gives every order the same steps and the same real tokens per "
        f"step, over {len(full['config']['seeds'])} paired seeds.")


def render(name: str, saved: dict[str, Any]) -> str:
    """The text of region ``name`` from the committed figures."""
    full = saved["full"]
    body = (_caption(full) + "\n\n" + table(full) + "\n\n" + decision(full) + "\n\n"
            + learned(full))
    if name == "order-arms-summary":
        return summary(full)
    if name == "order-arms-detail":
        return (body + "\n\n![held-out loss vs FLOPs](order_arms_compute.png)\n"
                + "![held-out loss vs steps](order_arms_data.png)")
    if name == "order-arms-demo-note":
        return demo_note(full)
    raise KeyError(f"no region {name!r}")


def region_text(text: str, name: str, where: str) -> tuple[int, int]:
    """Start and end offsets of region ``name``'s body in ``text``."""
    import docs_figures

    return docs_figures.region_text(text, name, where)


def rewrite(saved: dict[str, Any], root: Path = ROOT) -> list[str]:
    """Rewrite every region of :data:`REGIONS` under ``root``; the files changed."""
    import docs_figures

    return docs_figures.rewrite_regions(REGIONS, lambda name: render(name, saved), root)


def plot(full: dict[str, Any], paths: dict[str, Path] | None = None) -> None:
    """Held-out loss against FLOPs (arm ``compute``) and against steps (arm ``data``): one
    panel per schedule and batch, one line per order with its 95 % band over seeds, the
    unigram level dashed."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from lengthwise.demo.report import order_color

    axis = {"compute": ("flops", "training FLOPs (forward + backward, counted)"),
            "data": ("step", "optimizer steps (equal real tokens per step)")}
    for arm, path in (paths or PLOTS).items():
        cells = [c for c in full["cells"].values() if c["arm"] == arm]
        if not cells:
            continue
        key, label = axis[arm]
        fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 4.2), squeeze=False)
        for ax, cell in zip(axes[0], cells, strict=True):
            for i, (name, row) in enumerate(cell["orders"].items()):
                pts = row["curve"]
                x = [p[key] for p in pts]
                y = [p["eval_loss"]["mean"] for p in pts]
                half = [p["eval_loss"]["half"] or 0.0 for p in pts]
                col = order_color(name, i)
                ax.plot(x, y, color=col, lw=1.4, label=name, marker="o", ms=2.5)
                ax.fill_between(x, [a - h for a, h in zip(y, half, strict=True)],
                                [a + h for a, h in zip(y, half, strict=True)], color=col,
                                alpha=0.15)
            ax.axhline(full["unigram_loss"], color="grey", lw=0.8, ls="--", label="unigram")
            ax.set_title(f"{cell['schedule']}, batch {cell['batch']}", fontsize=9)
            ax.set_xlabel(label, fontsize=8)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("held-out loss per token")
        axes[0][0].legend(fontsize=7)
        n = len(full["config"]["seeds"])
        fig.suptitle(("same compute" if arm == "compute" else "same steps, same data")
                     + f": mean and 95 % interval over {n} seeds", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
