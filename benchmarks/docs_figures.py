"""Regenerate every demo figure in README.md and docs/ from fresh runs of both demos.

The figures in the docs are never typed: this script runs ``lengthwise demo`` (the
causal-LM task) and ``lengthwise demo --task dflash`` with every order at the
settings below, saves what they measured in ``benchmarks/DOCS_FIGURES.json``, and
rewrites the marked regions of the docs (``<!-- figures:NAME start -->`` ...
``<!-- figures:NAME end -->``) from that file::

    python benchmarks/docs_figures.py              # run both demos, save, rewrite the docs
    python benchmarks/docs_figures.py --check      # run both, exit 1 if a checked figure moved
    python benchmarks/docs_figures.py --render     # rewrite the docs from the saved figures only
    python benchmarks/docs_figures.py --tasks lm   # one task (the other keeps its saved figures)
    python benchmarks/docs_figures.py --from DIR   # the figures of an earlier run's --out DIR

Deterministic figures (losses, padding, step composition, roughness, the doctor's
verdicts, decoding results) must be the same on every run and machine;
``tests/docs/test_docs_figures.py`` reruns the demos and fails when they drift.
Throughput and wall time depend on the machine and its load: they are shown,
never checked.

One exception: the DFlash demo's target writes the responses its draft learns from,
greedily, so a target whose weights differ in the last bits (another CPU's float
kernels round their sums differently) writes other responses, and every DFlash figure
after them moves. Its held-out loss (``target_eval_loss``) tells which case a run is:
the same to the last digit, every DFlash figure is compared; within :data:`REL_TOL`
but not the same, the kernels differ and only that loss is compared
(:func:`other_kernels`); beyond it, it is drift.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from lengthwise.demo.report import TABLE_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "benchmarks" / "DOCS_FIGURES.json"

#: the options each task runs with in the docs (and in the test that checks them): none, so
#: the docs show what ``lengthwise demo`` prints with its defaults, which are sized so that the
#: check of every order of both tasks fits in CI on two cores
SETTINGS: dict[str, list[str]] = {
    "lm": [],
    "dflash": [],
}
#: per-order figures that must not move between runs (compared by ``--check``)
DETERMINISTIC: dict[str, tuple[str, ...]] = {
    "lm": ("steps", "padding_efficiency", "real_tokens", "padded_tokens", "real_tokens_per_step",
           "flops", "step_cv_ratio", "loss_roughness", "excess", "roughness_ratio", "eval_loss",
           "final_loss", "stable_region", "verdict"),
    "dflash": ("padding_efficiency", "real_tokens", "padded_tokens", "loss_roughness", "excess",
               "eval_loss", "final_loss", "accuracy_first", "accuracy_final",
               "simulated_acceptance_length", "acceptance_length", "lossless", "skipped_steps",
               "verdict"),
}
#: per-order figures that depend on the machine (shown, not compared)
MACHINE: tuple[str, ...] = ("tokens_per_second", "throughput_vs_sorted", "train_seconds")
#: relative tolerance of a float figure: on one machine a rerun gives the same figures to the
#: last digit (single-threaded, deterministic kernels); on another CPU the kernels may round
#: their sums differently, which moved the causal-LM losses by 1.3e-4 relative on a fresh machine
REL_TOL = 1e-3
#: the first float figure of each task that every later one depends on bit for bit, where a
#: later one does: the DFlash target's held-out loss (its weights decide the responses)
KERNEL_FIGURE: dict[str, str] = {"dflash": "target_eval_loss"}
#: the files and the regions of each that this script writes
REGIONS: dict[str, tuple[str, ...]] = {
    "README.md": ("lm-table",),
    "docs/demo.md": ("lm-measured",),
    "docs/dflash.md": ("dflash-measured",),
}


def command(task: str) -> str:
    """The command line the docs show for ``task``.

    Example::

        >>> command("dflash")
        'lengthwise demo --task dflash'
    """
    task_opt = [] if task == "lm" else ["--task", task]
    return " ".join(["lengthwise", "demo", *task_opt, *SETTINGS[task]])


def run_task(task: str, out: Path, cache_dir: str | None = None) -> dict[str, Any]:
    """Run one demo task with every order at :data:`SETTINGS`; its ``--json`` summary.

    Progress goes to stderr as the demo prints it.
    """
    argv = [sys.executable, "-m", "lengthwise", "demo", "--task", task, *SETTINGS[task],
            "--orders", "all", "--out", str(out / task), "--json", "--no-plot"]
    if cache_dir:
        argv += ["--cache-dir", cache_dir]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"docs_figures: {command(task)} exited with {done.returncode}")
    return json.loads(done.stdout)


def figures(task: str, summary: dict[str, Any]) -> dict[str, Any]:
    """What the docs quote of one summary: per-order figures and the run's settings."""
    keys = DETERMINISTIC[task] + MACHINE
    rows = {name: {k: row.get(k) for k in keys}
            for name, row in summary["strategies"].items()}
    data = summary.get("data", {})
    config = summary.get("config", {})
    keep = ("parameters", "train_samples", "train_tokens", "length_p50", "length_p99",
            "length_max", "eval_samples", "target", "target_eval_loss", "target_steps",
            "dropped_short_responses", "response_mean", "prompt_mean")
    return {
        "command": command(task),
        "strategies": rows,
        "stable_region": summary.get("stable_region"),
        "config": {k: config.get(k) for k in (("epochs", "max_samples") if task == "lm"
                                              else ("steps",))
                   + ("grad_accum", "max_tokens", "max_len", "seed", "model_size", "block_size")
                   if k in config},
        "data": {k: data[k] for k in keep if k in data},
        "wall_seconds": summary.get("wall_seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "cpu": cpu_name(),
    }


def cpu_name() -> str:
    """The CPU's model name and the vector instructions torch's kernels use here."""
    from lengthwise.train.device import cpu_model

    name = cpu_model()
    try:
        import torch

        return f"{name}, torch kernels {torch.backends.cpu.get_cpu_capability()}"
    except (ImportError, AttributeError):
        return name


def other_kernels(saved: dict[str, Any], fresh: dict[str, Any], task: str) -> str | None:
    """Why ``fresh`` cannot repeat the figures of ``saved`` to the last digit, or None.

    Where :data:`KERNEL_FIGURE` of ``task`` agrees within :data:`REL_TOL` but not exactly,
    this machine's kernels round differently from the one the docs were made on, and
    what follows from that figure bit for bit is not compared (see the module doc).

    Example::

        >>> a = {"data": {"target_eval_loss": 5.3644737}, "cpu": "cpu A"}
        >>> other_kernels(a, {"data": {"target_eval_loss": 5.3644737}, "cpu": "A"}, "dflash")
        >>> other_kernels(a, {"data": {"target_eval_loss": 5.3644213}, "cpu": "B"}, "dflash")[:28]
        'the target trained to 5.3644'
    """
    key = KERNEL_FIGURE.get(task)
    if key is None:
        return None
    a, b = saved.get("data", {}).get(key), fresh.get("data", {}).get(key)
    if not (isinstance(a, float) and isinstance(b, float)) or a == b or not _same(a, b):
        return None
    return (f"the target trained to {b!r} held-out loss here, {a!r} in the docs (within "
            f"{REL_TOL:g}): this machine's float kernels ({fresh.get('cpu', '?')}) round "
            f"differently from those the docs were made on ({saved.get('cpu', 'not recorded')}), "
            "so the target writes other responses and the DFlash figures after them are not "
            "comparable; regenerate them here with `python benchmarks/docs_figures.py --tasks "
            "dflash` to compare on this kind of machine")


def compare(saved: dict[str, Any], fresh: dict[str, Any], task: str) -> list[str]:
    """The deterministic figures of ``fresh`` that differ from ``saved`` (empty: none).

    Example::

        >>> a = {"strategies": {"random": {"eval_loss": 5.0, "verdict": "clean",
        ...                                "tokens_per_second": 10.0}}}
        >>> b = {"strategies": {"random": {"eval_loss": 5.0, "verdict": "clean",
        ...                                "tokens_per_second": 99.0}}}
        >>> compare(a, b, "lm")
        []
        >>> b["strategies"]["random"]["eval_loss"] = 5.1
        >>> compare(a, b, "lm")
        ['lm random eval_loss: 5.0 in the docs, 5.1 now']
    """
    out = []
    key = KERNEL_FIGURE.get(task)
    if key is not None:
        a, b = saved.get("data", {}).get(key), fresh.get("data", {}).get(key)
        if not _same(a, b):
            out.append(f"{task} {key}: {a} in the docs, {b} now")
        if out or other_kernels(saved, fresh, task):
            return out
    old, new = saved["strategies"], fresh["strategies"]
    if list(old) != list(new):
        return [f"{task} orders: {list(old)} in the docs, {list(new)} now"]
    for name in old:
        for key in DETERMINISTIC[task]:
            a, b = old[name].get(key), new[name].get(key)
            if not _same(a, b):
                out.append(f"{task} {name} {key}: {a} in the docs, {b} now")
    return out


def _same(a: Any, b: Any) -> bool:
    """Whether two figures agree: floats within :data:`REL_TOL`; texts (verdicts) word for word,
    the numbers they quote aside (the figures behind them are compared on their own).

    Example::

        >>> _same("clean (loss_roughness 0.0935)", "clean (loss_roughness 0.0936)")
        True
        >>> _same("clean (loss_roughness 0.0935)", "2 loss bands (loss_roughness 0.0935)")
        False
    """
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-6)
    if isinstance(a, str) and isinstance(b, str):
        return _words(a) == _words(b)
    return a == b


def _words(text: str) -> str:
    """``text`` with every number replaced by ``#``."""
    return re.sub(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?%?", "#", text)


# -- rendering -----------------------------------------------------------------------------
def _wrap(text: str, bullet: bool = False) -> str:
    """A paragraph (or a ``- `` bullet) wrapped at 100 columns, as the docs are written."""
    import textwrap

    return textwrap.fill(text, width=100, subsequent_indent="  " if bullet else "",
                         break_long_words=False, break_on_hyphens=False)


#: the checks a verdict lists after "not tested: ", one after each "; "
UNTESTED = ("bands, ", "periodicity, ", "per-bucket levels, ")


def verdict_parts(verdict: str) -> list[str]:
    """A doctor's verdict cut into its parts: at every ``; `` and `` -> `` outside brackets;
    each check of a "not tested: " list keeps those words.

    >>> verdict_parts("bands (a; b) -> stratify; no cliffs")
    ['bands (a; b)', 'stratify', 'no cliffs']
    >>> verdict_parts("not tested: bands, 28 points; periodicity, 28 points; no cliffs")
    ['not tested: bands, 28 points', 'not tested: periodicity, 28 points', 'no cliffs']
    """
    parts, depth, start, i = [], 0, 0, 0
    while i < len(verdict):
        ch = verdict[i]
        depth += (ch == "(") - (ch == ")")
        cut = next((sep for sep in ("; ", " -> ") if verdict.startswith(sep, i)), None)
        if cut and depth == 0:
            parts.append(verdict[start:i])
            start = i = i + len(cut)
            continue
        i += 1
    out = [p for p in (*parts, verdict[start:]) if p]
    for k in range(1, len(out)):
        if out[k - 1].startswith("not tested: ") and out[k].startswith(UNTESTED):
            out[k] = "not tested: " + out[k]
    return out


def verdict_text(lead: str, verdict: str | None, indent: str = "") -> str:
    """``lead`` then a doctor's verdict: on the same line where it is one part, else as a
    list under it, one part a bullet (``indent``: the lead's own list indent)."""
    import textwrap

    parts = verdict_parts(verdict or "-")
    if len(parts) == 1:
        return _wrap_at(f"{lead} {parts[0]}.", indent)
    sub = " " * len(indent)
    items = [textwrap.fill(p + ("." if k == len(parts) - 1 else ";"), width=100,
                           initial_indent=sub + "- ", subsequent_indent=sub + "  ",
                           break_long_words=False, break_on_hyphens=False)
             for k, p in enumerate(parts)]
    return "\n".join([_wrap_at(lead, indent), *items])


def _wrap_at(text: str, indent: str) -> str:
    """``text`` wrapped at 100 columns; ``indent``: ``""`` (a paragraph) or a list item's
    ``"- "`` or ``"  - "``, which the text then opens with."""
    import textwrap

    return textwrap.fill(text, width=100, initial_indent=indent,
                         subsequent_indent=" " * len(indent), break_long_words=False,
                         break_on_hyphens=False)


def _f(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec)


def _table(rows: dict[str, dict[str, Any]], columns: tuple[tuple[str, str], ...],
           verdict: bool = False) -> str:
    head = ["order", *(k for k, _ in columns)] + (["verdict"] if verdict else [])
    lines = ["| " + " | ".join(head) + " |",
             "|---|" + "---:|" * len(columns) + ("---|" if verdict else "")]
    for name, r in rows.items():
        cells = [name, *(_f(r.get(k), s) for k, s in columns)]
        if verdict:
            cells.append(str(r.get("verdict") or "-"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the columns ``lengthwise demo`` prints
LM_COLUMNS = TABLE_COLUMNS
DFLASH_SPEED = (("tokens_per_second", ",.0f"), ("throughput_vs_sorted", ".2f"),
                ("padding_efficiency", ".3f"), ("loss_roughness", ".4f"), ("excess", ".2f"),
                ("skipped_steps", "d"))
DFLASH_DRAFT = (("accuracy_first", ".3f"), ("accuracy_final", ".3f"), ("eval_loss", ".4f"),
                ("simulated_acceptance_length", ".2f"), ("acceptance_length", ".2f"),
                ("lossless", ""))


def _caption(fig: dict[str, Any]) -> str:
    """The DFlash demo's caption: its steps, and the stable region shared by every order."""
    c, region = fig["config"], fig.get("stable_region") or ["-", "-"]
    wall = fig.get("wall_seconds")
    took = f"{wall:.0f} s wall time on {fig['machine']}" if wall else fig["machine"]
    return _wrap(
        f"`{fig['command']}`: {c.get('steps')} steps x {c.get('grad_accum')} micro-batches of at "
        f"most {c.get('max_tokens')} tokens, seed {c.get('seed')}; {took}. `loss_roughness` and "
        f"the verdicts cover steps {region[0]}-{region[1]} for every order. Throughput depends on "
        "the machine and its load. `tests/docs/test_docs_figures.py` checks every other figure "
        f"against a fresh run, to within {REL_TOL:.1%} (another CPU's kernels may move a last "
        "digit).")


def _lm_caption(fig: dict[str, Any], *, verdicts: bool = True) -> str:
    """What the demo ran; with ``verdicts``, where the verdicts come from and what is checked."""
    c, d = fig["config"], fig.get("data", {})
    wall = fig.get("wall_seconds")
    took = f"{wall:.0f} s on {fig['machine']}" if wall else fig["machine"]
    epochs = c.get("epochs")
    more = ("The verdicts are the doctor's on each log. `tests/docs/test_docs_figures.py` checks "
            f"every figure but the seconds and throughput against a fresh run, to within "
            f"{REL_TOL:.1%}." if verdicts else "")
    return _wrap(
        f"`{fig['command']}`: the same {_f(d.get('train_samples'), ',d')} samples for {epochs} "
        f"epoch{'' if epochs == 1 else 's'} per order, in steps of {c.get('grad_accum')} "
        f"micro-batches of at most {c.get('max_tokens')} tokens, seed {c.get('seed')}; {took}. "
        + more)


def _lm_reading(fig: dict[str, Any]) -> str:
    rows = fig["strategies"]
    s, r, st = rows.get("sorted", {}), rows.get("random", {}), rows.get("stratified", {})
    tokens = {row.get("real_tokens") for row in rows.values()}
    rough = {n: row.get("loss_roughness") for n, row in rows.items()
             if row.get("loss_roughness") is not None}
    smoothest = min(rough, key=rough.get) if rough else "-"
    roughest = max(rough, key=rough.get) if rough else "-"
    evals = {n: row.get("eval_loss") for n, row in rows.items() if row.get("eval_loss")}
    best = min(evals, key=evals.get) if evals else "-"
    others = {n: v for n, v in evals.items() if n != best}
    clean = [n for n, row in rows.items() if str(row.get("verdict", "")).startswith("clean")]
    text = [
        (f"Every order trained the same {_f(min(tokens), ',d')} real tokens." if len(tokens) == 1
         and None not in tokens else "The orders trained different real tokens."),
        f"Random pads most (`padding_efficiency` {_f(r.get('padding_efficiency'), '.3f')}), so "
        f"it takes {_f(r.get('steps'), 'd')} steps to stratified's {_f(st.get('steps'), 'd')}, "
        f"and stratified costs {_f(_ratio(st.get('flops'), r.get('flops')), '.2f')}x random's "
        "FLOPs.",
        f"Stratified steps carry the length mix: `step_cv_ratio` "
        f"{_f(st.get('step_cv_ratio'), '.2f')}, against sorted's "
        f"{_f(s.get('step_cv_ratio'), '.2f')}.",
        f"The lowest held-out loss is {best}'s ({_f(evals.get(best), '.4f')}).",
        f"For the same data, random made {_f(_ratio(r.get('steps'), st.get('steps')), '.1f')}x "
        f"stratified's optimizer updates, at {_f(_ratio(r.get('flops'), st.get('flops')), '.1f')}x "
        "its FLOPs.",
        (f"The others lie within {_spread(others)}. One seed cannot tell whether "
         "differences this small hold over other seeds." if len(others) > 1 else ""),
        f"The smoothest loss is {smoothest}'s ({_f(rough.get(smoothest), '.4f')}), the roughest "
        f"{roughest}'s ({_f(rough.get(roughest), '.4f')}).",
        ("The doctor finds no bands, period or cliffs in " + _series(clean) + "."
         if clean else ""),
        "The order experiment below gives every order the same steps too, over 5 paired seeds.",
    ]
    return _wrap(" ".join(t for t in text if t))


def _spread(values: dict[str, float]) -> str:
    """How far apart ``values`` lie, and their range.

    Example::

        >>> _spread({"a": 5.3752, "b": 5.4249})
        '0.05 nats (5.3752-5.4249)'
    """
    lo, hi = min(values.values()), max(values.values())
    return f"{hi - lo:.2f} nats ({lo:.4f}-{hi:.4f})"


def _series(names: list[str]) -> str:
    """``a``, ``a and b`` or ``a, b and c``.

    Example::

        >>> _series(["random", "packed", "sorted"])
        'random, packed and sorted'
    """
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _ratio(a: Any, b: Any) -> float | None:
    return None if a is None or not b else a / b


def _lm_bullets(fig: dict[str, Any]) -> str:
    rows = fig["strategies"]
    ref = rows.get("random", {}).get("flops")
    out = []
    for name, row in rows.items():
        out.append(verdict_text(
            f"`{name}`: {_f(row.get('steps'), 'd')} steps of "
            f"{_f(row.get('real_tokens_per_step'), ',.0f')} real tokens, "
            f"{_f(_ratio(row.get('flops'), ref), '.2f')}x random's FLOPs, "
            f"{_f(row.get('throughput_vs_sorted'), '.2f')}x sorted's throughput, "
            f"`loss_roughness` {_f(row.get('loss_roughness'), '.4f')} (`excess` "
            f"{_f(row.get('excess'), '.2f')}), held-out loss {_f(row.get('eval_loss'), '.4f')}. "
            "The doctor:", row.get("verdict"), indent="- "))
    return "\n".join(out)


def _dflash_text(fig: dict[str, Any]) -> str:
    rows = fig["strategies"]
    d = fig["data"]
    # where this machine cached the target is no figure of the run
    target = re.sub(r" (trained here|trained earlier, loaded from .*)$",
                    " trained by the demo on the corpus", str(d.get("target", "-")))
    sims = [r["simulated_acceptance_length"] for r in rows.values()
            if r.get("simulated_acceptance_length") is not None]
    reals = [r["acceptance_length"] for r in rows.values()
             if r.get("acceptance_length") is not None]
    lossless = all(r.get("lossless") is True for r in rows.values())
    skipped = {n: r.get("skipped_steps") for n, r in rows.items() if r.get("skipped_steps")}
    lines = [
        _caption(fig),
        "",
        _wrap(f"Target: {target}"
              + (f" (held-out loss {d['target_eval_loss']:.2f})" if d.get("target_eval_loss")
                 else "")
              + f"; {_f(d.get('train_samples'), ',d')} training samples (median "
              f"{d.get('length_p50', '-')} tokens, longest {d.get('length_max', '-')})."),
        "",
        _table(rows, DFLASH_SPEED),
        "",
        _table(rows, DFLASH_DRAFT),
        "",
        _wrap("- Every speculative decoding is "
              + ("lossless" if lossless else "NOT lossless for some order")
              + " (the output equals the target's greedy output).", bullet=True),
    ]
    if sims and reals:
        lines.append(_wrap(
            f"- `acceptance_length` (tokens per verifying target forward, measured by decoding) "
            f"is {min(reals):.2f}-{max(reals):.2f}; `simulated_acceptance_length` (the "
            f"teacher-forced estimate from the per-slot accuracies on held-out samples, which "
            f"treats the slots as independent) is {min(sims):.2f}-{max(sims):.2f}.", bullet=True))
    lines.append(_wrap("- Updates SpikeGuard skipped: " + (
        ", ".join(f"{n} {k}" for n, k in skipped.items()) if skipped else "none") + ".",
        bullet=True))
    lines.append("- The doctor, per order:")
    lines += [verdict_text(f"`{n}`:", r.get("verdict"), indent="  - ") for n, r in rows.items()]
    return "\n".join(lines)


def render(name: str, saved: dict[str, Any]) -> str:
    """The text of region ``name`` from the saved figures."""
    lm, df = saved.get("lm"), saved.get("dflash")
    if name == "lm-table":
        return _lm_caption(lm, verdicts=False) + "\n\n" + _table(lm["strategies"], LM_COLUMNS)
    if name == "lm-measured":
        return (_lm_caption(lm) + "\n\n" + _table(lm["strategies"], LM_COLUMNS, verdict=True)
                + "\n\n" + _lm_reading(lm) + "\n\n" + _lm_bullets(lm))
    if name == "dflash-measured":
        return _dflash_text(df)
    raise KeyError(f"no region {name!r}")


def markers(name: str) -> tuple[str, str]:
    """The comments that open and close region ``name``."""
    return f"<!-- figures:{name} start -->", f"<!-- figures:{name} end -->"


def region_text(text: str, name: str, where: str) -> tuple[int, int]:
    """Start and end offsets of region ``name``'s body in ``text``."""
    start, end = markers(name)
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"{where} has no region {name} ({start} ... {end})")
    return i + len(start), j


def rewrite_regions(regions: dict[str, tuple[str, ...]], text_of: Any, root: Path = ROOT,
                    keep: Any = None) -> list[str]:
    """Put ``text_of(name)`` into every region ``name`` of ``regions`` (file -> names) under
    ``root`` (those ``keep(name)`` allows); the files changed."""
    changed = []
    for rel, names in regions.items():
        path = root / rel
        text = path.read_text(encoding="utf-8")
        new = text
        for name in names:
            if keep is not None and not keep(name):
                continue
            i, j = region_text(new, name, rel)
            new = new[:i] + "\n" + text_of(name) + "\n" + new[j:]
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(rel)
    return changed


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; a missing, cut or other file exits with one line naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"docs_figures: {path}: no such file ({what})") from None
    except (OSError, ValueError) as exc:  # unreadable, cut short, not JSON, not UTF-8
        raise SystemExit(f"docs_figures: {path}: not a readable JSON file ({what}): "
                         f"{' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"docs_figures: {path}: not a JSON object ({what})")
    return data


def rewrite(saved: dict[str, Any], root: Path = ROOT) -> list[str]:
    """Rewrite every region of :data:`REGIONS` under ``root``; the files changed."""

    def keep(name: str) -> bool:
        if name.split("-")[0] in saved:
            return True
        print(f"docs_figures: no saved figures for region {name}; run its task first",
              file=sys.stderr)  # that task was never run: its region stays as it is
        return False

    return rewrite_regions(REGIONS, lambda name: render(name, saved), root, keep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="run the demos and compare with the saved figures; change nothing")
    ap.add_argument("--render", action="store_true",
                    help="rewrite the docs from the saved figures without running anything")
    ap.add_argument("--tasks", default="lm,dflash", help="tasks to run (default: lm,dflash)")
    ap.add_argument("--out", default=None, help="folder for the demos' output (default: temp)")
    ap.add_argument("--cache-dir", default=None, help="the demos' --cache-dir")
    ap.add_argument("--from", dest="source", default=None, metavar="DIR",
                    help="take the figures from DIR/<task>/summary.json of an earlier run of "
                         "this script (--out DIR) instead of running the demos")
    args = ap.parse_args(argv)
    saved = (read_json(SAVED, "the saved figures; delete it to measure them again")
             if SAVED.exists() or args.render or args.check else {})
    if args.render:
        print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
        return 0
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    absent = [t for t in tasks if t not in saved]
    if args.check and absent:  # before the demos run
        raise SystemExit(f"docs_figures: {SAVED} holds no figures of task(s) "
                         f"{', '.join(absent)}: nothing to check against")
    out = Path(args.out or tempfile.mkdtemp(prefix="docs-figures-"))
    fresh = {}
    for task in tasks:
        if not args.source:
            print(f"docs_figures: {command(task)} (every order) -> {out / task}",
                  file=sys.stderr, flush=True)
        if args.source:
            summary = read_json(Path(args.source) / task / "summary.json",
                                f"the {task} demo's summary from --from")
        else:
            summary = run_task(task, out, args.cache_dir)
        fresh[task] = figures(task, summary)
    if args.check:
        for t in tasks:
            why = other_kernels(saved[t], fresh[t], t)
            if why:
                print(f"docs_figures: {t}: only {KERNEL_FIGURE[t]} compared: {why}")
        drift = [line for t in tasks for line in compare(saved[t], fresh[t], t)]
        for line in drift:
            print(line)
        print(f"docs_figures: {len(drift)} deterministic figure(s) differ from the docs")
        return 1 if drift else 0
    saved.update(fresh)
    SAVED.write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
    print("rewrote:", ", ".join(rewrite(saved)) or "nothing (already current)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
