"""What the batch order does to the model, with error bars, at equal real tokens.

Trains the demo's causal LM once per order and seed (every order x the config's ``seeds``) until
each run has trained the same number of real tokens, measures the held-out loss
overall and per length stratum along the way, and writes the figures with 95 %
intervals over seeds, paired differences against random and sorted, tokens and
seconds to a fixed held-out loss, and what the doctor says of each run's step log
and of rank 0's per-micro-batch log (:mod:`lengthwise.demo.evidence_report`)::

    python benchmarks/order_quality.py                  # the committed run -> ORDER_QUALITY.json
    python benchmarks/order_quality.py --workers 2      # two runs at a time (one thread each)
    python benchmarks/order_quality.py --check          # rerun the reduced check, compare
    python benchmarks/order_quality.py --out DIR        # the figures of the runs saved in DIR

Each run is saved as ``OUT/runs/ORDER-seedN.json`` as it ends, so an interrupted
benchmark continues where it stopped when given the same ``--out`` (and one whose runs are
all saved there trains nothing: its figures come from them). The committed
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
FULL: dict[str, Any] = {"max_samples": 3200, "epochs": 1.0, "eval_samples": 320,
                        "eval_points": 10}
#: the reduced run that CI repeats and compares with the committed one
CHECK: dict[str, Any] = {"orders": ("random", "bucket-random"), "seeds": (0,),
                         "token_budget": 24_000, "eval_samples": 96, "eval_points": 3,
                         "max_samples": 1500}
#: the files and the regions of each that this script writes from the committed figures
REGIONS: dict[str, tuple[str, ...]] = {
    "docs/demo.md": ("order-quality-detail",),
}
#: relative tolerance of a compared loss: a run repeated on this machine gives the same
#: figures to the last digit; other CPUs may round the kernels' sums differently
REL_TOL = 2e-3


def _config(settings: dict[str, Any]) -> Any:
    from lengthwise.demo.evidence import EvidenceConfig

    return EvidenceConfig(**settings)


def run(settings: dict[str, Any], out: Path, workers: int, cache_dir: str | None,
        redoctor: bool = False) -> dict[str, Any]:
    """Train every run of ``settings`` not yet saved under ``out/runs``; the figures.

    ``redoctor`` reads the saved runs' logs with the doctor again (after a change to it).
    """
    from lengthwise.demo.evidence import build_data
    from lengthwise.demo.evidence_report import doctor_figures, run_experiment, summarise

    cfg = _config(settings)
    saved = SavedRuns(out / "runs", cfg, lambda r: (
        f"held-out loss {r['eval_loss']:.4f} after {r['real_tokens']:,} real tokens, "
        f"{r['train_seconds']:.0f} s"))
    started = time.perf_counter()
    if saved.done() != saved.keys:
        run_experiment(cfg, out=out / "logs", workers=workers, cache_dir=cache_dir,
                       skip=saved.done(), on_run=saved.save)
    data = build_data(cfg, cache_dir=cache_dir)
    runs = saved.load()
    if redoctor:
        for r in runs:
            r["doctor"] = doctor_figures(r["log"], r["micro_log"], data)
    return stamp(summarise(cfg, data, runs), started, workers)


class SavedRuns:
    """The runs of an experiment, each saved as ``folder/ORDER-seedN.json`` as it ends, so
    that a benchmark stopped halfway continues where it stopped."""

    def __init__(self, folder: Path, cfg: Any, describe: Any) -> None:
        self.folder, self.describe = folder, describe
        self.keys = {(o, s) for s in cfg.seeds for o in cfg.orders}
        self.order = [(o, s) for s in cfg.seeds for o in cfg.orders]
        folder.mkdir(parents=True, exist_ok=True)

    def _path(self, order: str, seed: int) -> Path:
        return self.folder / f"{order}-seed{seed}.json"

    def done(self) -> set[tuple[str, int]]:
        """The (order, seed) runs already saved."""
        return {k for k in self.keys if self._path(*k).is_file()}

    def save(self, r: dict[str, Any]) -> None:
        """Save run ``r`` and say what it measured (``describe(r)``)."""
        self._path(r["order"], r["seed"]).write_text(json.dumps(r), encoding="utf-8")
        print(f"{Path(sys.argv[0]).stem}: {r['order']} seed {r['seed']}: {self.describe(r)}",
              file=sys.stderr, flush=True)

    def load(self) -> list[dict[str, Any]]:
        """Every run, seed by seed, in the config's order of orders."""
        return [json.loads(self._path(*k).read_text(encoding="utf-8")) for k in self.order]


def stamp(summary: dict[str, Any], started: float, workers: int) -> dict[str, Any]:
    """``summary`` with the benchmark's wall time since ``started``, the machine and the
    workers."""
    summary["wall_seconds"] = time.perf_counter() - started
    summary["machine"] = f"{platform.machine()}, {os.cpu_count()} CPU cores"
    summary["workers"] = workers
    return summary


def _say(text: str) -> None:
    print(f"order_quality: {text}", file=sys.stderr, flush=True)


def arguments(doc: str, script: str = __file__) -> argparse.ArgumentParser:
    """The options of an order-quality script (``doc``: its module docstring, ``script``: its
    file, whose name the messages start with); usage errors
    are one line (exit 2), as the ``lengthwise`` command's, and so are the folders' of
    :func:`parse`."""
    from lengthwise.cli import _Parser
    from lengthwise.cli.demo import _positive

    ap = _Parser(prog=Path(script).name, description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for logs and saved runs (default: temp)")
    ap.add_argument("--workers", type=_positive, default=1, help="runs trained at a time")
    ap.add_argument("--cache-dir", default=None, help="the demo's corpus/tokenizer cache")
    mode = ap.add_mutually_exclusive_group()  # each names what the script does: one at most
    mode.add_argument("--check", action="store_true",
                      help="rerun the reduced check and compare with the committed figures")
    mode.add_argument("--full-only", action="store_true", help="skip the reduced check run")
    mode.add_argument("--check-only", action="store_true",
                      help="run the reduced check and save it, keep the saved full run")
    mode.add_argument("--render", action="store_true",
                      help="rewrite the docs and plots from the committed figures only")
    return ap


def committed(path: Path, ap: argparse.ArgumentParser) -> dict[str, Any]:
    """The figures saved in ``path`` (none before the first run); a file that is not a JSON
    object (damaged, cut short) is a one-line usage error naming it (exit 2)."""
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        ap.error(f"{path}: not readable ({exc})")
    except ValueError as exc:
        ap.error(f"{path}: not valid JSON, damaged or cut short ({exc}); restore it (git "
                 "checkout) or rerun the experiment")
    if not isinstance(saved, dict):
        ap.error(f"{path}: holds a JSON {type(saved).__name__}, not the figures' object")
    return saved


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options of ``argv``, with ``--out`` and ``--cache-dir`` made as folders first: a
    path that cannot be one is a usage error naming the option (not a traceback later)."""
    from lengthwise.cli.demo import _check_folder
    from lengthwise.errors import ConfigError

    args = ap.parse_args(argv)
    for option, path in (("--out", args.out), ("--cache-dir", args.cache_dir)):
        if path is None:
            continue
        try:
            _check_folder(option, path)
            Path(path).mkdir(parents=True, exist_ok=True)
        except ConfigError as exc:
            ap.error(str(exc))
        except OSError as exc:
            ap.error(f"{option} {path}: cannot make this folder ({exc.strerror or exc})")
    return args


def main(argv: list[str] | None = None) -> int:
    ap = arguments(__doc__)
    ap.add_argument("--redoctor", action="store_true",
                    help="read the saved runs' logs under --out with the doctor again")
    args = parse(ap, argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="order-quality-"))
    saved = committed(SAVED, ap)
    if args.render:
        if "full" not in saved:
            ap.error(f"--render: {SAVED} holds no full run yet")
        plot(saved["full"])
        print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
        return 0
    if args.check:
        if "check" not in saved:
            ap.error(f"--check: {SAVED} holds no check run yet to compare with")
        fresh = run(CHECK, out / "check", 1, args.cache_dir)
        return say_drift("order_quality", compare(saved["check"], fresh))
    if not args.check_only:
        saved["full"] = run(FULL, out / "full", args.workers, args.cache_dir, args.redoctor)
        write(saved)
    if not args.full_only:
        saved["check"] = run(CHECK, out / "check", 1, args.cache_dir, args.redoctor)
        write(saved)
    _say(f"wrote {SAVED}")
    if "full" in saved:
        plot(committed(SAVED, ap)["full"])
        print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
    return 0


def write(saved: dict[str, Any], path: Path = SAVED) -> None:
    """Write the figures as JSON (NaN, e.g. the interval of one seed, as null)."""
    from lengthwise.demo.report import clean_json

    path.write_text(json.dumps(clean_json(saved), indent=1) + "\n", encoding="utf-8")


def say_drift(script: str, drift: list[str]) -> int:
    """Print the figures of a rerun check that moved and how many; the exit status (1: any)."""
    for line in drift:
        print(line)
    print(f"{script}: {len(drift)} figure(s) differ from the committed check run")
    return 1 if drift else 0


def compare(saved: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """The figures of the check run that moved (empty: none)."""
    def pairs(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        out = [("eval_loss", a["eval_loss"], b["eval_loss"])]
        out += [(f"strata[{i}]", x, y)
                for i, (x, y) in enumerate(zip(a["strata"], b["strata"], strict=True))]
        return out + [(f"curve[{i}]", p["eval_loss"], q["eval_loss"])
                      for i, (p, q) in enumerate(zip(a["curve"], b["curve"], strict=True))]

    return compare_runs(saved, fresh, ("steps", "real_tokens", "padded_tokens"), pairs)


def compare_runs(saved: dict[str, Any], fresh: dict[str, Any], exact: tuple[str, ...],
                 pairs: Any) -> list[str]:
    """The figures of ``saved``'s runs that ``fresh``'s do not repeat: the ``exact`` ones to
    the last digit, the ``(name, committed, now)`` triples of ``pairs(a, b)`` within
    :data:`REL_TOL` (empty: none moved)."""
    out = []
    old = {(r["order"], r["seed"]): r for r in saved["runs"]}
    new = {(r["order"], r["seed"]): r for r in fresh["runs"]}
    if set(old) != set(new):
        return [f"runs: {sorted(old)} committed, {sorted(new)} now"]
    for key, a in old.items():
        b = new[key]
        for name in exact:
            if a[name] != b[name]:
                out.append(f"{key} {name}: {a[name]} committed, {b[name]} now")
        for name, x, y in pairs(a, b):
            if not _close(x, y):
                out.append(f"{key} {name}: {x} committed, {y} now")
    return out


def _close(a: Any, b: Any) -> bool:
    import math

    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL_TOL)


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
    import textwrap

    return textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False)


def _bullets(lead: str, items: list[str]) -> str:
    """``lead`` on its own line, then ``items`` as a Markdown list (``;`` after each but the
    last, which ends with ``.``), wrapped at 100 columns."""
    import textwrap

    return "\n".join([lead, *(textwrap.fill(
        f"- {item}{'.' if k == len(items) - 1 else ';'}", width=100, subsequent_indent="  ",
        break_long_words=False, break_on_hyphens=False) for k, item in enumerate(items))])


def table(full: dict[str, Any]) -> str:
    """Order x held-out loss (overall, shortest and longest stratum), time to the target loss,
    throughput: mean ± 95 % interval over seeds."""
    strata = full["strata"]
    lo, hi = strata[0], strata[-1]
    head = ["order", "held-out loss", f"lengths {lo}", f"lengths {hi}", "vs random",
            "tokens to target", "seconds to target", "tokens/s", "steps", "settled"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, row in full["orders"].items():
        diff = row.get("vs_random", {}).get("eval_loss")
        lines.append("| " + " | ".join([
            name, _pm(row["eval_loss"]), _pm(row["strata"][lo]), _pm(row["strata"][hi]),
            _pm(diff, "+.3f") if diff else "-", _pm(row["tokens_to_target"], ",.0f"),
            _pm(row["seconds_to_target"], ".0f"), _pm(row["tokens_per_second"], ",.0f"),
            f"{row['steps']['mean']:.0f}", "yes" if row["settled"] else "no"]) + " |")
    return "\n".join(lines)


def _caption(full: dict[str, Any]) -> str:
    c, d, eq = full["config"], full["data"], full["equal_tokens"]
    seeds = len(c["seeds"])
    wall, cpu = full.get("runs_wall_seconds"), full.get("runs_cpu_seconds")
    took = (f"The {len(full['runs'])} runs took {wall / 60:.0f} min of wall time in all "
            f"(training and held-out evaluation, one thread each; {full['machine']}, shared "
            "with other jobs)" + (f". They took {cpu / 60:.0f} min of CPU time, about "
                                  f"{cpu / 120:.0f} min on two free cores" if cpu else "")
            if wall else full["machine"])
    return _wrap(
        f"`python benchmarks/order_quality.py`: the {c['model_size']} causal LM of the demo "
        f"trained from scratch once per order and seed ({seeds} seeds). Every run goes to "
        f"{eq['budget']:,} real tokens: one epoch of {d['train_samples']:,} samples of "
        f"{d['length_min']}-{d['length_max']} tokens (a {d['length_span']:.0f}x span, median "
        f"{d['length_p50']}); runs end within {eq['spread']:.1%} of one another. Learning "
        "rate: warm-up then cosine to zero over those tokens. Steps are "
        f"{c['grad_accum']} micro-batches of at most {c['max_tokens']} tokens from a simulated "
        f"world of {c['world']} ranks. Held-out loss on {d['eval_samples']} samples, per "
        f"length stratum (the plan's {len(full['strata'])} buckets). Mean ± 95 % t-interval "
        "over seeds; 'vs random' is the paired difference (same seed) from random. The target "
        f"loss is {full['target_loss']:.3f} (the highest any run has at half the budget). "
        f"'settled': the held-out loss moves less over the last {full['settle_share']:.0%} of "
        "the tokens than its interval. Seconds and tokens/s depend on the machine's load. "
        f"{took}.")


def _detected(diff: dict[str, Any] | None) -> bool:
    return bool(diff and diff.get("detected"))


def against(orders: dict[str, Any], ref: str, lead: str, *, metric: str, per: str,
            overall: str, only: str, spec: str, alone: str = "") -> list[str]:
    """Every other order's paired difference from ``ref`` (``[]`` when ``ref`` was not run):
    ``lead``, then a list of one order a bullet (on ``lead``'s line where no order differs).

    An order whose difference in ``metric`` is detected reads ``overall`` (a template of
    ``{name}``, ``{ref}`` and ``{word}``: higher or lower), then the difference with its
    interval, then the strata of ``per`` where one is detected too (``alone`` where none
    is); an order detected on strata alone reads ``only``, then those strata; the others
    close the list as "no difference detected at this size". Numbers as ``spec``.
    """
    if ref not in orders:
        return []
    found, none = [], []
    for name, row in orders.items():
        if name == ref:
            continue
        cmp = row.get(f"vs_{ref}", {})
        diff = cmp.get(metric)
        strata = [s for s, d in (cmp.get(per) or {}).items() if _detected(d)]
        if _detected(diff):  # a detected difference is not 0
            word = "higher" if diff["mean"] > 0 else "lower"
            found.append(overall.format(name=name, ref=ref, word=word)
                         + f" {abs(diff['mean']):{spec}} ± {diff['half']:{spec}}"
                         + (f" (lengths {', '.join(strata)})" if strata else alone))
        elif strata:
            parts = [f"{s} ({cmp[per][s]['mean']:+{spec}} ± {cmp[per][s]['half']:{spec}})"
                     for s in strata]
            found.append(only.format(name=name, ref=ref) + f" {', '.join(parts)} only")
        else:
            none.append(name)
    if none:
        found.append(f"no difference detected at this size for {', '.join(none)}")
    if len(found) == 1 and none:
        return [_wrap(f"{lead.rstrip()} {found[0]}.")]
    return [_bullets(lead.rstrip(), found)]


def reading(full: dict[str, Any]) -> str:
    """What the figures say, in words: a difference where a paired interval excludes zero,
    "no difference detected at this size" where it does not."""
    orders = full["orders"]
    lists, sentences = [], []
    for ref in ("random", "sorted"):
        lists += against(orders, ref, f"Against {ref} (paired by seed): ",
                             metric="eval_loss", per="strata", spec=".3f",
                             overall="{name}'s held-out loss is {word} than {ref}'s by",
                             only="{name} differs from {ref} on lengths")
    any_found = any(_detected(r.get(f"vs_{ref}", {}).get("eval_loss"))
                    or any(_detected(d) for d in (r.get(f"vs_{ref}", {}).get("strata") or {})
                           .values())
                    for r in orders.values() for ref in ("random", "sorted"))
    if not any_found:
        sentences.append("At this size the order does not change the final model beyond seed "
                         "noise; it changes the curve and the throughput.")
    unsettled = [n for n, r in orders.items() if not r["settled"]]
    if unsettled:
        sentences.append(f"The held-out loss of {', '.join(unsettled)} still moves over the "
                         "last 20 % of the tokens by more than its interval: a longer run could "
                         "change the comparison.")
    steps = {n: r["steps"]["mean"] for n, r in orders.items()}
    most, fewest = max(steps, key=steps.get), min(steps, key=steps.get)
    sentences.append(f"Equal tokens are not equal updates. A micro-batch holds at most "
                     f"{full['config']['max_tokens']} padded tokens, so the order that pads most "
                     f"takes the most optimizer steps ({most}, {steps[most]:.0f}, against "
                     f"{steps[fewest]:.0f} for {fewest}), each on fewer tokens. Part of any "
                     f"difference in held-out loss is that.")
    ttl = {n: r["tokens_to_target"]["mean"] for n, r in orders.items()
           if r["tokens_to_target"].get("mean") is not None}
    if ttl:
        fast = min(ttl, key=ttl.get)
        slow = max(ttl, key=ttl.get)
        sentences.append(f"Tokens to the target loss: fewest {fast} "
                         f"({_pm(orders[fast]['tokens_to_target'], ',.0f')}), most {slow} "
                         f"({_pm(orders[slow]['tokens_to_target'], ',.0f')}).")
    return "\n\n".join([*lists, _wrap(" ".join(sentences))])


def doctor_text(full: dict[str, Any]) -> str:
    """What the doctor says of each order's logs, and the noise budget with intervals."""
    lines = []
    for name, row in full["orders"].items():
        step, micro = row["doctor"]["step"], row["doctor"]["micro"]
        # quote the per-micro-batch verdict of a seed with per-bucket levels when there is
        # one, else of a seed with bands
        found = micro.get("levels_found") or []
        k = next((i for i, f in enumerate(found) if f),
                 next((i for i, c in enumerate(micro["band_counts"]) if c), 0))
        tested = sum(micro.get("levels_tested") or [])
        levels = (f"one loss level per length range in {sum(found)} of the {tested} seeds "
                  "whose levels could be tested" if tested else
                  "per-bucket levels tested in no seed")
        noise = row.get("noise") or {}
        budget = ", ".join(f"{k} {_pm(v, '.2f')}" for k, v in noise.items()) or "not measured"
        lines.append(_wrap(
            f"- `{name}`: step log, bands found in {sum(c > 0 for c in step['band_counts'])} of "
            f"{len(step['band_counts'])} seeds; rank 0's per-micro-batch log, in "
            f"{sum(c > 0 for c in micro['band_counts'])} ({levels}). Noise budget of the step "
            f"loss (shares of its detrended variance): {budget}.").replace("\n", "\n  "))
        verdict = _docs_figures().verdict_text
        lines.append(verdict(f"The doctor on seed {row['seeds'][0]}'s step log:",
                             step["verdicts"][0], indent="  - "))
        lines.append(verdict(f"The doctor on seed {row['seeds'][k]}'s per-micro-batch log:",
                             micro["verdicts"][k], indent="  - "))
    return "\n".join(lines)


def render(name: str, saved: dict[str, Any]) -> str:
    """The text of region ``name`` from the committed figures."""
    full = saved["full"]
    if name == "order-quality":
        return (_caption(full) + "\n\n" + table(full) + "\n\n" + reading(full) + "\n\n"
                + "![held-out loss vs real tokens](docs/order_quality_tokens.png)")
    if name == "order-quality-detail":
        return (_caption(full) + "\n\n" + table(full) + "\n\n" + reading(full) + "\n\n"
                + doctor_text(full) + "\n\n"
                + "![held-out loss vs real tokens](order_quality_tokens.png)\n"
                + "![held-out loss vs training seconds](order_quality_seconds.png)")
    raise KeyError(f"no region {name!r}")


def _docs_figures() -> Any:
    """``benchmarks/docs_figures.py``, whose marked-region functions this script shares."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_figures",
                                                  Path(__file__).with_name("docs_figures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def region_text(text: str, name: str, where: str) -> tuple[int, int]:
    """Start and end offsets of region ``name``'s body in ``text``."""
    return _docs_figures().region_text(text, name, where)


def rewrite(saved: dict[str, Any], root: Path = ROOT) -> list[str]:
    """Rewrite every region of :data:`REGIONS` under ``root``; the files changed."""
    return _docs_figures().rewrite_regions(REGIONS, lambda name: render(name, saved), root)


def plot(full: dict[str, Any]) -> None:
    """Held-out loss vs real tokens and vs training seconds, one line per order with its
    95 % band over seeds (docs/order_quality_*.png)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from lengthwise.demo.report import order_color

    for axis, path in PLOTS.items():
        fig, ax = plt.subplots(figsize=(8, 5))
        for i, (name, row) in enumerate(full["orders"].items()):
            pts = row["curve"]
            x = [p[axis] for p in pts]
            y = [p["eval_loss"]["mean"] for p in pts]
            half = [p["eval_loss"]["half"] or 0.0 for p in pts]
            c = order_color(name, i)
            ax.plot(x, y, color=c, lw=1.6, label=name, marker="o", ms=3)
            ax.fill_between(x, [a - h for a, h in zip(y, half, strict=True)],
                            [a + h for a, h in zip(y, half, strict=True)], color=c, alpha=0.15)
        ax.axhline(full["target_loss"], color="grey", lw=0.8, ls="--", label="target loss")
        ax.set_xlabel("real tokens trained" if axis == "tokens" else
                      "training seconds (sum of step times; load-dependent)")
        ax.set_ylabel("held-out loss per token")
        n = len(full["config"]["seeds"])
        ax.set_title(f"held-out loss, mean and 95 % interval over {n} seeds", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
