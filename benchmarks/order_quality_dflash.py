"""What the batch order does to a DFlash draft, with error bars, at equal real tokens.

Trains a target once on the order-quality corpus (samples of 8-256 tokens), then a
DFlash draft once per order and seed (every order x the config's ``seeds``) until each has
trained the same number of real tokens, and measures on held-out data the acceptance
length at temperature 0 from real speculative decoding (checked lossless against the
target's greedy output) and the teacher-forced accuracy, overall and per length
stratum (:mod:`lengthwise.demo.evidence_dflash`); the figures get 95 % intervals over
seeds and paired differences against random and sorted
(:mod:`lengthwise.demo.evidence_dflash_report`)::

    python benchmarks/order_quality_dflash.py              # the committed run (JSON, docs, plot)
    python benchmarks/order_quality_dflash.py --workers 2  # two runs at a time (one thread each)
    python benchmarks/order_quality_dflash.py --check      # rerun the reduced check, compare
    python benchmarks/order_quality_dflash.py --render     # docs and plot from the committed JSON

Each run is saved as ``OUT/runs/ORDER-seedN.json`` as it ends, so an interrupted
benchmark continues where it stopped when given the same ``--out``. The committed JSON
also holds a reduced run (:data:`CHECK`) that ``tests/test_order_quality_dflash.py``
reruns and compares figure by figure. Throughput and wall time depend on the machine
and its load: shown, never compared.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "benchmarks" / "ORDER_QUALITY_DFLASH.json"
PLOT = ROOT / "docs" / "order_quality_dflash.png"

#: the committed experiment (change these, rerun, commit the JSON and the docs)
FULL: dict[str, Any] = {"max_samples": 3200, "epochs": 1.0, "eval_samples": 320,
                        "target_size": "small", "target_epochs": 3.0, "eval_prompts": 48}
#: the reduced run that CI repeats and compares with the committed one
CHECK: dict[str, Any] = {"orders": ("random", "bucket-random"), "seeds": (0,),
                         "max_samples": 600, "epochs": 1.0, "eval_samples": 96,
                         "target_size": "tiny", "target_epochs": 1.0, "eval_prompts": 12,
                         "response_len": 16}
#: the files and the regions of each that this script writes from the committed figures
REGIONS: dict[str, tuple[str, ...]] = {
    "docs/dflash.md": ("order-quality-dflash",),
}
#: figures of a run compared exactly: counts
EXACT = ("steps", "real_tokens", "padded_tokens", "mismatches", "verify_forwards")
#: figures of a run compared within the relative tolerance of the causal-LM experiment
CLOSE = ("acceptance_length", "accuracy", "eval_loss")
CLOSE_LISTS = ("strata_acceptance", "strata_accuracy")


def _sibling(name: str) -> Any:
    """``benchmarks/<name>.py``, whose helpers this script shares."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_LM = _sibling("order_quality")
REL_TOL = _LM.REL_TOL
write_json = _LM.write
_pm, _wrap, _detected = _LM._pm, _LM._wrap, _LM._detected


def run(settings: dict[str, Any], out: Path, workers: int, cache_dir: str | None,
        target_cache: str | None = None) -> dict[str, Any]:
    """Train every run of ``settings`` not yet saved under ``out/runs``; the figures.

    The corpus and tokenizer are cached in ``cache_dir``, the target and its responses in
    ``target_cache`` (default: ``cache_dir``).
    """
    from lengthwise.demo.evidence_dflash import DFlashEvidenceConfig, build_dflash_data
    from lengthwise.demo.evidence_dflash_report import run_dflash_experiment, summarise_dflash

    cfg = DFlashEvidenceConfig(**settings)
    saved = _LM.SavedRuns(out / "runs", cfg, lambda r: (
        f"acceptance {r['acceptance_length']:.3f}, accuracy {r['accuracy']:.4f} after "
        f"{r['real_tokens']:,} real tokens, {r['wall_seconds']:.0f} s"))
    started = time.perf_counter()
    if saved.done() != saved.keys:
        run_dflash_experiment(cfg, out=out / "logs", workers=workers, cache_dir=cache_dir,
                              target_cache=target_cache, skip=saved.done(), on_run=saved.save)
    ev = build_dflash_data(cfg, cache_dir=cache_dir, target_cache=target_cache)
    runs = saved.load()
    return _LM.stamp(summarise_dflash(cfg, ev, runs), started, workers)


def _say(text: str) -> None:
    print(f"order_quality_dflash: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = _LM.arguments(__doc__, __file__)
    args = _LM.parse(ap, argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="order-quality-dflash-"))
    saved = _LM.committed(SAVED, ap)
    if args.render:
        if "full" in saved:
            plot(saved["full"])
        print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
        return 0
    if args.check:
        if "check" not in saved:
            ap.error(f"--check: {SAVED} holds no check run yet to compare with")
        # the target trained afresh, as on a fresh machine (the corpus may come from the cache)
        fresh = run(CHECK, out / "check", 1, args.cache_dir, str(out / "check" / "target"))
        return _LM.say_drift("order_quality_dflash", compare(saved["check"], fresh))
    if not args.full_only:
        saved["check"] = run(CHECK, out / "check", 1, args.cache_dir,
                             str(out / "check" / "target"))
        write_json(saved, SAVED)
    if not args.check_only:
        saved["full"] = run(FULL, out / "full", args.workers, args.cache_dir)
        write_json(saved, SAVED)
    _say(f"wrote {SAVED}")
    saved = _LM.committed(SAVED, ap)
    if "full" in saved:
        plot(saved["full"])
    print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
    return 0


def compare(saved: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """The figures of the check run that moved (empty: none)."""
    def pairs(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        return [(name, a[name], b[name]) for name in CLOSE] + [
            (f"{name}[{i}]", x, y) for name in CLOSE_LISTS
            for i, (x, y) in enumerate(zip(a[name], b[name], strict=True))]

    return _LM.compare_runs(saved, fresh, EXACT, pairs)


# -- the reading, generated from the figures -------------------------------------------------
def table(full: dict[str, Any]) -> str:
    """Order x acceptance length and teacher-forced accuracy (overall, shortest and longest
    stratum), paired differences from random: mean ± 95 % interval over seeds."""
    strata = full["strata"]
    lo, hi = strata[0], strata[-1]
    head = ["order", "acceptance length", f"lengths {lo}", f"lengths {hi}", "vs random",
            "accuracy", f"lengths {lo}", f"lengths {hi}", "vs random", "steps", "lossless"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, row in full["orders"].items():
        vs = row.get("vs_random", {})
        lines.append("| " + " | ".join([
            name, _pm(row["acceptance_length"], ".2f"),
            _pm(row["strata_acceptance"][lo], ".2f"), _pm(row["strata_acceptance"][hi], ".2f"),
            _pm(vs["acceptance_length"], "+.2f") if vs else "-",
            _pm(row["accuracy"]), _pm(row["strata_accuracy"][lo]),
            _pm(row["strata_accuracy"][hi]), _pm(vs["accuracy"], "+.3f") if vs else "-",
            f"{row['steps']['mean']:.0f}", "yes" if row["lossless"] else
            f"no ({row['mismatches']} outputs differ)"]) + " |")
    return "\n".join(lines)


def _runtime(full: dict[str, Any]) -> str:
    wall, cpu = full.get("runs_wall_seconds"), full.get("runs_cpu_seconds")
    d = full["data"]
    target = d.get("target_train_seconds", 0.0) + d.get("regenerate_seconds", 0.0)
    return (f"The {len(full['runs'])} runs took {wall / 60:.0f} min of wall time in all "
            f"({cpu / 60:.0f} min of CPU time, about {cpu / 120:.0f} min on two free cores). "
            f"They ran one thread each, {full['workers']} at a time: "
            f"{full['wall_seconds'] / 60:.0f} min from start to end, on {full['machine']} "
            f"shared with other jobs. Before them, {target / 60:.0f} min went to train the "
            "target and let it write the responses (cached)")


def _epochs(n: float) -> str:
    """``1 epoch``, ``3 epochs``, ``1.5 epochs``."""
    return f"{n:g} epoch" + ("" if n == 1 else "s")


def _caption(full: dict[str, Any]) -> str:
    c, d, eq = full["config"], full["data"], full["equal_tokens"]
    per = full["prompt_strata"]
    span = (f"{_epochs(c['epochs'])} of the training samples" if c["token_budget"] is None
            else "a fixed budget")
    return _wrap(
        f"`python benchmarks/order_quality_dflash.py --workers 2`: a target ({d['target']}, "
        f"{d['target_parameters']:,} parameters, {_epochs(c['target_epochs'])}, held-out "
        f"loss {d['target_eval_loss']:.2f}) is trained once. Each of "
        f"{d['train_samples']:,} training samples of {d['length_min']}-{d['length_max']} tokens "
        f"(a {d['length_span']:.0f}x span, median {d['length_p50']}) keeps its first tokens as "
        "the prompt. It gets the target's greedy continuation as its last "
        f"min({c['response_len']}, length / 2) tokens (the supervised response). A DFlash "
        f"draft ({c['draft_layers']} layer, "
        f"block {c['block_size']}, {c['num_anchors']} anchors per sample, target layers "
        f"{d['target_layers']} as features) is trained from scratch once per order and seed "
        f"({len(c['seeds'])} seeds). Every run goes to {eq['budget']:,} real tokens ({span}; "
        f"runs end within {eq['spread']:.1%} of one another). Learning rate: warm-up then "
        f"cosine to zero over those tokens. Steps are {c['grad_accum']} micro-batches of at "
        f"most {c['max_tokens']} tokens from a simulated world of {c['world']} ranks. Acceptance "
        f"length: tokens kept per verifying target forward in real speculative decoding at "
        f"temperature 0 of {sum(per)} held-out prompts ({per[0]} per length stratum, "
        f"{d['prompt_lengths'][0]}-{d['prompt_lengths'][1]} tokens, up to "
        f"{c['response_len']} new tokens each), every output checked against the target's "
        f"greedy output ('lossless'). Accuracy: teacher-forced top-1 accuracy of the draft's "
        f"block slots on the responses of {d['eval_samples']} held-out samples, every response "
        f"position an anchor. Strata are the plan's {len(full['strata'])} length buckets (of "
        f"the whole sample). Mean ± 95 % t-interval over seeds; 'vs random' is the paired "
        f"difference (same seed) from random. {_runtime(full)}.")


_WORDS = {"acceptance_length": ("acceptance length", ".2f"), "accuracy": ("accuracy", ".3f")}


def reading(full: dict[str, Any]) -> str:
    """What the figures say, in words: a difference where a paired interval excludes zero,
    "no difference detected at this size" where it does not (higher is better for both)."""
    orders = full["orders"]
    lists, sentences = [], []
    for metric, per in (("acceptance_length", "strata_acceptance"),
                        ("accuracy", "strata_accuracy")):
        word, spec = _WORDS[metric]
        for ref in ("random", "sorted"):
            lists += _LM.against(orders, ref, f"{word.capitalize()} against {ref} (paired "
                                     "by seed): ", metric=metric, per=per, spec=spec,
                                     overall="{name}'s is {word} by",
                                     only="{name} differs on lengths",
                                     alone=" (on no single length stratum alone)")
    any_found = any(_detected(r.get(f"vs_{ref}", {}).get(m))
                    or any(_detected(d) for d in (r.get(f"vs_{ref}", {}).get(p) or {}).values())
                    for r in orders.values() for ref in ("random", "sorted")
                    for m, p in (("acceptance_length", "strata_acceptance"),
                                 ("accuracy", "strata_accuracy")))
    if not any_found:
        sentences.append("At this size the order does not change the draft beyond seed noise.")
    bad = [n for n, r in orders.items() if not r["lossless"]]
    sentences.append("Every speculative decoding was lossless (its output equals the target's "
                     "greedy output)." if not bad else
                     f"Decoding was not lossless for {', '.join(bad)}: a bug to report.")
    steps = {n: r["steps"]["mean"] for n, r in orders.items()}
    most, fewest = max(steps, key=steps.get), min(steps, key=steps.get)
    sentences.append(f"Equal tokens are not equal updates: the order that pads most takes the "
                     f"most optimizer steps ({most}, {steps[most]:.0f}, against "
                     f"{steps[fewest]:.0f} for {fewest}).")
    return "\n\n".join([*lists, _wrap(" ".join(sentences))])


def check_text(check: dict[str, Any]) -> str:
    """What the reduced run that CI repeats is, and what it measured."""
    c, d = check["config"], check["data"]
    runs = [f"{r['order']}: acceptance {r['acceptance_length']:.2f}, accuracy "
            f"{r['accuracy']:.3f}, teacher-forced loss {r['eval_loss']:.4f}"
            for r in check["runs"]]
    text = _LM._bullets(_wrap(
        f"CI reruns a reduced version (`CHECK`): {', '.join(c['orders'])}, seed "
        f"{', '.join(map(str, c['seeds']))}, a {c['target_size']} target trained for "
        f"{_epochs(c['target_epochs'])} to a held-out loss of {d['target_eval_loss']:.2f}. It "
        f"trains on {d['train_samples']:,} samples of {d['length_min']}-{d['length_max']} "
        f"tokens, {check['equal_tokens']['budget']:,} real tokens per run "
        f"({check['wall_seconds']:.0f} s here). It compares every figure of its runs with the "
        "committed ones:"), runs)
    if all(r["accuracy"] is not None and r["accuracy"] > 0.999 for r in check["runs"]):
        text += "\n\n" + _wrap(
            "A target that small writes one token again and again, so the draft predicts "
            "every response token and acceptance and accuracy sit at their maximum. The "
            "teacher-forced loss and the step counts are what move when the training changes.")
    return text


def render(name: str, saved: dict[str, Any]) -> str:
    """The text of region ``name`` from the committed figures."""
    full = saved.get("full")
    if not full:
        return _wrap("The DFlash order-quality experiment (`benchmarks/order_quality_dflash.py`) "
                     "has no committed full run yet.")
    if name == "order-quality-dflash":
        return (_caption(full) + "\n\n" + table(full) + "\n\n" + reading(full) + "\n\n"
                + "![acceptance length and accuracy per order](order_quality_dflash.png)"
                + ("\n\n" + check_text(saved["check"]) if "check" in saved else ""))
    raise KeyError(f"no region {name!r}")


def region_text(text: str, name: str, where: str) -> tuple[int, int]:
    """Start and end offsets of region ``name``'s body in ``text``."""
    return _LM.region_text(text, name, where)


def rewrite(saved: dict[str, Any], root: Path = ROOT) -> list[str]:
    """Rewrite every region of :data:`REGIONS` under ``root``; the files changed."""
    return _LM._docs_figures().rewrite_regions(REGIONS, lambda name: render(name, saved), root)


def plot(full: dict[str, Any]) -> None:
    """Acceptance length and teacher-forced accuracy per length stratum, one line per order
    with its 95 % band over seeds (docs/order_quality_dflash.png)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from lengthwise.demo.report import order_color

    strata = full["strata"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((axes[0], "strata_acceptance", "acceptance length (T=0, decoding)"),
                           (axes[1], "strata_accuracy", "teacher-forced accuracy")):
        for i, (name, row) in enumerate(full["orders"].items()):
            ivs = [row[key][s] for s in strata]
            x = [k + (i - 2.5) * 0.06 for k in range(len(strata))]
            y = [iv["mean"] if iv["mean"] is not None else math.nan for iv in ivs]
            half = [iv["half"] or 0.0 for iv in ivs]
            c = order_color(name, i)
            ax.errorbar(x, y, yerr=half, color=c, lw=1.4, marker="o", ms=3, capsize=2,
                        label=name)
        ax.set_xticks(range(len(strata)), strata)
        ax.set_xlabel("sample length (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    n = len(full["config"]["seeds"])
    fig.suptitle(f"DFlash draft per order: mean and 95 % interval over {n} seeds, per length "
                 "stratum", fontsize=10)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
