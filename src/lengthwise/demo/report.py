"""Compare the orders of one demo run: figures, the doctor's verdicts, a table, a plot.

``loss_roughness`` and the verdict of the causal-LM demo come from one
:func:`lengthwise.doctor.diagnose` per log without its step times, exactly what
``lengthwise doctor --no-timing OUT/<order>/train_log.jsonl`` says: each log over its own
automatic stable region (``stable_region`` per order). Step times depend on the machine's
load, so a verdict that read them would not repeat from run to run. The DFlash demo passes one
region shared by every order (:func:`common_region`): it starts where the slowest of
the runs has finished warming up and settling and ends at the last step.
``throughput_vs_sorted`` divides by the ``sorted`` run and ``roughness_ratio`` by the
``random`` run (``None`` when that order was not trained).

Example::

    >>> rows = {"sorted": {"tokens_per_second": 100.0, "loss_roughness": 0.1},
    ...         "random": {"tokens_per_second": 40.0, "loss_roughness": 0.2}}
    >>> add_ratios(rows)["random"]["throughput_vs_sorted"]
    0.4
    >>> rows["sorted"]["roughness_ratio"]
    0.5
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

from lengthwise.atomic import atomic_path
from lengthwise.terminal import TEXT_WIDTH

__all__ = ["JSON_KEYS", "ORDER_COLORS", "TABLE_COLUMNS", "add_ratios", "clean_json",
           "common_region", "diagnose_runs", "format_columns", "format_markdown", "format_table",
           "format_verdicts", "order_color", "plot_curves", "residual_ticks", "summary_json"]

#: columns of the causal-LM table, named as in ``--json``; (key, format)
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("steps", "d"), ("real_tokens", "d"), ("padding_efficiency", ".3f"),
    ("step_cv_ratio", ".2f"), ("flops", ".3g"), ("train_seconds", ".0f"),
    ("throughput_vs_sorted", ".2f"), ("eval_loss", ".4f"), ("loss_roughness", ".4f"),
)
#: keys every strategy has in ``--json`` output: the table's columns, then the verdict
JSON_KEYS: tuple[str, ...] = (*(k for k, _ in TABLE_COLUMNS), "verdict")
#: the stable region keeps at least this many steps (when the run has them)
MIN_REGION = 50


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None:
        return None
    a, b = float(a), float(b)
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return None
    return a / b


def add_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Add ``throughput_vs_sorted`` and ``roughness_ratio`` to every row (in place)."""
    ref_tps = rows.get("sorted", {}).get("tokens_per_second")
    ref_rough = rows.get("random", {}).get("loss_roughness")
    for row in rows.values():
        row["throughput_vs_sorted"] = _ratio(row.get("tokens_per_second"), ref_tps)
        row["roughness_ratio"] = _ratio(row.get("loss_roughness"), ref_rough)
    return rows


def common_region(logs: dict[str, str | Path]) -> tuple[int, int]:
    """``(start, end)`` steps of the stable region shared by all runs (see the module doc)."""
    import numpy as np

    from lengthwise.doctor import load
    from lengthwise.doctor.curve import find_phases

    starts, ends = [], []
    for path in logs.values():
        log = load(str(path))
        ok = np.isfinite(log.loss)
        lr = log.columns.get("lr")
        phases = find_phases(log.step[ok], log.loss[ok], lr=None if lr is None else lr[ok])
        starts.append(float(phases.start))
        ends.append(float(log.step[-1]))
    end = int(min(ends))
    return max(1, min(int(math.ceil(max(starts))), end - MIN_REGION + 1)), end


def diagnose_runs(logs: dict[str, str | Path], *, region: tuple[int, int] | None = None,
                  ) -> dict[str, dict[str, Any]]:
    """The doctor's ``loss_roughness``, ``excess``, verdict and stable region of every log.

    Every figure of a log, its verdict included, comes from one
    :func:`lengthwise.doctor.diagnose`, so the table and the verdict quote one
    ``loss_roughness``. Without ``region`` it is the diagnosis ``lengthwise doctor
    --no-timing LOG`` makes (each log's own stable region); with it, every log is diagnosed
    over ``region``. Neither reads the step times. ``excess`` is the roughness over (divided by)
    the run's own sampling floor, when the doctor measures it (``None`` otherwise).
    """
    from lengthwise.doctor import diagnose

    start, end = region or (None, None)
    out = {}
    for name, path in logs.items():
        report = diagnose(str(path), start=start, end=end, timing=False)
        noise = report.noise
        out[name] = {
            "loss_roughness": float(report.stats.loss_roughness),
            "corrected_roughness": report.stats.corrected_roughness,
            "excess": noise.excess if noise is not None else None,
            "sampling_floor": noise.sampling_floor if noise is not None else None,
            "verdict": report.verdict.summary,
            "stable_region": [int(math.ceil(report.phases.start)), int(report.phases.end)],
            "bands": getattr(report.bands, "count", None),
        }
    return out


def _cell(row: dict[str, Any], key: str) -> str:
    """The figure ``key`` of ``row`` as a table shows it."""
    value = row.get(key)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, _FORMATS.get(key, ".4g"))


_FORMATS = dict(TABLE_COLUMNS) | {
    "tokens_per_second": ".0f", "excess": ".4f", "roughness_ratio": ".2f",
    "accuracy_first": ".3f", "accuracy_final": ".3f", "simulated_acceptance_length": ".2f",
    "acceptance_length": ".2f", "lossless": "", "real_tokens_per_step": ".0f",
    "skipped_steps": "d"}


def format_columns(rows: dict[str, dict[str, Any]], keys: tuple[str, ...], *,
                   width: int | None = TEXT_WIDTH) -> str:
    """A plain-text table: one line per order, one column per key (headed by the key); when
    that is wider than ``width``, one line per key and one column per order instead (``None``:
    one line per order whatever its width).

    Example::

        >>> print(format_columns({"random": {"eval_loss": 4.5}}, ("eval_loss",)))
        order          eval_loss
        ------------------------
        random            4.5000
        >>> print(format_columns({"random": {"eval_loss": 4.5}}, ("eval_loss",), width=20))
        figure     random
        -----------------
        eval_loss  4.5000
    """
    cells = {name: [_cell(r, k) for k in keys] for name, r in rows.items()}
    widths = [max(len(k), 8) for k in keys]
    head = f"{'order':<14} " + " ".join(f"{k:>{w}}" for k, w in zip(keys, widths, strict=True))
    if width is None or len(head) <= width:
        lines = [head, "-" * len(head)]
        lines += [f"{name:<14} " + " ".join(f"{c:>{w}}" for c, w in zip(row, widths, strict=True))
                  for name, row in cells.items()]
        return "\n".join(lines)
    first = max(len("figure"), *(len(k) for k in keys))
    cols = [max(len(name), *(len(c) for c in row)) for name, row in cells.items()]
    head = f"{'figure':<{first}}  " + "  ".join(
        f"{name:>{w}}" for name, w in zip(cells, cols, strict=True))
    lines = [head, "-" * len(head)]
    for i, k in enumerate(keys):
        lines.append(f"{k:<{first}}  " + "  ".join(
            f"{row[i]:>{w}}" for row, w in zip(cells.values(), cols, strict=True)))
    return "\n".join(lines)


def format_verdicts(rows: dict[str, dict[str, Any]], *, width: int = TEXT_WIDTH) -> str:
    """The doctor's verdict of every order, wrapped at word boundaries (never cut)."""

    lines = ["doctor:"]
    for name, r in rows.items():
        verdict = str(r.get("verdict") or "-")
        lines.extend(textwrap.wrap(verdict, width=width, initial_indent=f"  {name:<14} ",
                                   subsequent_indent=" " * 17, break_long_words=False,
                                   break_on_hyphens=False))
    return "\n".join(lines)


def format_table(rows: dict[str, dict[str, Any]], *, width: int | None = TEXT_WIDTH) -> str:
    """The causal-LM demo's table (figures named as in ``--json``), then the verdicts."""
    return format_columns(rows, tuple(k for k, _ in TABLE_COLUMNS), width=width) + "\n\n" + \
        format_verdicts(rows)


def format_markdown(rows: dict[str, dict[str, Any]],
                    keys: tuple[str, ...] | None = None) -> str:
    """The same figures as a Markdown table (verdicts in full)."""
    keys = keys or tuple(k for k, _ in TABLE_COLUMNS)
    out = ["| order | " + " | ".join(keys) + " | verdict |",
           "|---|" + "---:|" * len(keys) + "---|"]
    for name, r in rows.items():
        cells = [_cell(r, k) for k in keys]
        out.append(f"| {name} | " + " | ".join(cells) + f" | {r.get('verdict') or '-'} |")
    return "\n".join(out)


def clean_json(x: Any) -> Any:
    """``x`` with every non-finite float (NaN, inf) replaced by ``None``, for strict JSON.

    Example::

        >>> clean_json({"a": [float("nan"), 1.0]})
        {'a': [None, 1.0]}
    """
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean_json(v) for v in x]
    return x


def summary_json(rows: dict[str, dict[str, Any]], **meta: Any) -> str:
    """``{"strategies": {name: figures}, ...meta}`` as JSON (NaN written as null)."""
    return json.dumps(clean_json({"strategies": rows, **meta}), indent=2)


def plot_runs(curves: dict[str, list[float]], out: str | Path, *,
              region: tuple[int, int] | dict[str, tuple[int, int]],
              roughness: dict[str, float], title: str, group: Any = None) -> str | None:
    """Write ``out/loss_curves.png`` and return its path; without matplotlib, say so and
    return ``None`` (the figures still come out)."""
    from lengthwise.train.device import say

    try:
        return str(plot_curves(curves, Path(out) / "loss_curves.png", region=region,
                               roughness=roughness, title=title))
    except ImportError as exc:
        say(group, f"lengthwise demo: no plot ({exc})")
        return None


#: one colour per order name, the same in every plot whatever orders are drawn
ORDER_COLORS: dict[str, str] = {
    "sorted": "#1f77b4", "random": "#ff7f0e", "bucket-random": "#2ca02c",
    "interleave": "#d62728", "stratified": "#9467bd", "packed": "#8c564b",
}
_OTHER_COLORS = ("#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def order_color(name: str, position: int = 0) -> str:
    """The colour of an order's curves: fixed per order name (others by position).

    Example::

        >>> order_color("stratified") == order_color("stratified", 4)
        True
    """
    return ORDER_COLORS.get(name, _OTHER_COLORS[position % len(_OTHER_COLORS)])


def residual_ticks(offsets: list[float], spacing: float) -> tuple[list[float], list[str]]:
    """The residual panel's y scale: each trace's zero and +-``spacing / 4`` around it.

    Example::

        >>> ticks, labels = residual_ticks([0.0, -0.4], 0.4)
        >>> [round(t, 2) for t in ticks], labels[:3]
        ([-0.1, 0.0, 0.1, -0.5, -0.4, -0.3], ['-0.1', '0', '+0.1'])
    """
    q = spacing / 4
    ticks = [t for offset in offsets for t in (offset - q, offset, offset + q)]
    return ticks, [f"-{q:.2g}", "0", f"+{q:.2g}"] * len(offsets)


def plot_curves(curves: dict[str, list[float]], path: str | Path, *,
                region: tuple[int, int] | dict[str, tuple[int, int]] | None = None,
                roughness: dict[str, float] | None = None, title: str = "") -> Path:
    """Two panels: every strategy's loss curve, and what ``loss_roughness`` measures.

    Left: per-step loss (faint) and its centred rolling mean (solid, drawn where the
    window is complete). Right: ``loss - rolling_mean_51(loss)`` over the stable
    region (one for all, or each strategy's own: a dict), one trace per strategy, stacked
    with an offset, labelled with its ``loss_roughness``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    from lengthwise.doctor.numeric import ROUGHNESS_WINDOW, rolling_mean

    fig, (ax, res) = plt.subplots(1, 2, figsize=(14, 5.2),
                                  gridspec_kw={"width_ratios": [1.1, 1.0]})
    show = 21
    spread = []
    for i, (name, loss) in enumerate(curves.items()):
        y = np.asarray(loss, dtype=np.float64)
        x = np.arange(1, y.size + 1)
        c = order_color(name, i)
        smooth = rolling_mean(y, show)
        full = (x > show // 2) & (x <= y.size - show // 2)
        ax.plot(x, y, color=c, alpha=0.3, lw=0.8)
        ax.plot(x[full], smooth[full], color=c, lw=1.8, label=name)
        resid = y - rolling_mean(y, ROUGHNESS_WINDOW)
        own = region.get(name) if isinstance(region, dict) else region
        lo, hi = own or (1, y.size)
        keep = (x >= lo) & (x <= hi)
        spread.append((name, c, x[keep], resid[keep]))
    step = 4 * max((float(np.std(r)) for *_, r in spread if r.size), default=0.1) or 0.1
    offsets = [-k * step for k in range(len(spread))]
    for offset, (name, c, x, r) in zip(offsets, spread, strict=True):
        res.plot(x, r + offset, color=c, lw=0.9)
        res.axhline(offset, color=c, lw=0.5, alpha=0.5)
        label = name
        if roughness and roughness.get(name) is not None:
            label += f"  {roughness[name]:.4f}"
        res.text(1.01, offset, label, color=c, transform=res.get_yaxis_transform(),
                 va="center", fontsize=8)
    ticks, labels = residual_ticks(offsets, step)
    res.set_yticks(ticks, labels, fontsize=7)
    res.set_ylabel(f"loss - rolling mean (traces {step:.2g} apart)")
    where = ("each order's stable region" if isinstance(region, dict)
             else f"steps {region[0]}-{region[1]}" if region else "all steps")
    res.set_title(f"loss - rolling mean of {ROUGHNESS_WINDOW}, {where} (std = loss_roughness)",
                  fontsize=10)
    ax.set_title(f"loss per optimizer step (faint), rolling mean of {show}", fontsize=10)
    ax.set_ylabel("loss per token")
    ax.legend(loc="upper right", fontsize=8)
    for a in (ax, res):
        a.set_xlabel("optimizer step")
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path
