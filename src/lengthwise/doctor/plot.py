"""PNG of the diagnosis: loss over steps, stable-region histogram, autocorrelation.

One row per run, titled by the start of the verdict; matplotlib's object-oriented API (no
pyplot, no global backend change).

Example::

    >>> from lengthwise.doctor import diagnose
    >>> import tempfile, pathlib
    >>> rng = np.random.default_rng(0)
    >>> rows = [{"step": s, "loss": 2.0 + 0.3 * b + 0.05 * rng.standard_normal(), "bucket": b}
    ...         for s, b in enumerate(rng.integers(0, 3, 800).tolist(), 1)]
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "doctor.png"
    >>> plot_reports({"run": diagnose(rows)}, out).exists()
    True
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lengthwise.atomic import atomic_path
from lengthwise.doctor.curve import roughness_residual
from lengthwise.doctor.errors import PlotUnavailableError
from lengthwise.doctor.numeric import ROUGHNESS_WINDOW

if TYPE_CHECKING:
    from lengthwise.doctor.report import Report, Series

#: points of the running mean drawn on the loss (the roughness window)
TREND_WINDOW = ROUGHNESS_WINDOW
#: lines of the verdict a row's title holds; the text report has all of it
VERDICT_LINES = 2
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
            "#bcbd22", "#7f7f7f", "#d62728"]


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib, which is not installed (pip install 'lengthwise[plots]')"
        ) from exc
    return Figure, FigureCanvasAgg


def plot_reports(reports: dict[str, Report], path: str | os.PathLike[str]) -> Path:
    """Write one PNG with a row of three panels per report; returns the path."""
    figure_cls, canvas_cls = _matplotlib()
    rows = len(reports)
    fig = figure_cls(figsize=(15, 4.2 * rows), dpi=110)
    canvas_cls(fig)
    grid = fig.add_gridspec(rows, 3, width_ratios=[3.2, 1.3, 1.3], hspace=0.45, wspace=0.28)
    for row, (name, report) in enumerate(reports.items()):
        _loss_panel(fig.add_subplot(grid[row, 0]), name, report)
        _histogram_panel(fig.add_subplot(grid[row, 1]), report)
        _acf_panel(fig.add_subplot(grid[row, 2]), report)
    out = Path(path)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    return out


def _loss_panel(ax: Any, name: str, r: Report) -> None:
    s = r.series
    if s is None:
        return
    reg = s.region
    keep = reg & ~s.cliff_mask
    _loss_points(ax, s)
    full = _full_windows(s.trend.size, TREND_WINDOW)  # no mean of a half window at the ends
    ax.plot(s.step[full], s.trend[full], color="black", linewidth=1.0,
            label=f"running mean ({TREND_WINDOW})")
    ax.axvspan(r.phases.start, r.phases.end, color="#2ca02c", alpha=0.07,
               label="stable region (analysed)")
    b = r.bands
    if b.count and b.count > 1:
        for i, off in enumerate(b.offsets):
            ax.plot(s.step[reg], s.trend[reg] + off, color="#d62728", linewidth=0.8,
                    linestyle="--", alpha=0.8, label="band centres" if i == 0 else None)
    if 0 < s.checkpoints.size <= 200:
        for i, c in enumerate(s.checkpoints):
            ax.axvline(c, color="grey", linewidth=0.6, linestyle=":", alpha=0.7,
                       label="checkpoint" if i == 0 else None)
    if r.cliffs:
        peaks = np.array([c.peak_step for c in r.cliffs])
        idx = np.searchsorted(s.step, peaks)
        ax.scatter(peaks, s.loss[np.clip(idx, 0, s.loss.size - 1)], marker="v", s=40,
                   color="#d62728", zorder=5, label="cliff")
    if keep.any() and s.loss.size:
        _loss_scale(ax, s.loss)
    if s.evals.shape[0]:
        ax.plot(s.evals[:, 0], s.evals[:, 1], color="#ff7f0e", marker="o", markersize=3,
                linewidth=1.0, label="held-out loss", zorder=4)
        if r.eval_gap.widening and r.eval_gap.widens_from is not None:
            ax.axvline(r.eval_gap.widens_from, color="#ff7f0e", linewidth=0.8, linestyle="--",
                       label="gap widens")
    _grad_norm_axis(ax, r)
    coloured = s.bucket_codes is not None and len(s.bucket_names) <= 8
    ax.legend(loc="upper right", fontsize=7, markerscale=2 if coloured else 1,
              ncol=2 if coloured else 1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    short = name if len(name) <= 80 else "..." + name[-77:]
    ax.set_title(f"{short}\n{_lines(r.verdict.summary, 95, VERDICT_LINES)}", fontsize=8.5,
                 loc="left")


def _grad_norm_axis(ax: Any, r: Report) -> None:
    """The logged gradient norm on a second (log) axis, its spikes marked, when it was tested."""
    s, g = r.series, r.grad_norm
    if s is None or s.grad_norm is None or g.median is None:
        return
    ok = np.isfinite(s.grad_norm) & (s.grad_norm > 0)
    twin = ax.twinx()
    twin.plot(s.step[ok], s.grad_norm[ok], color="#9467bd", linewidth=0.4, alpha=0.45)
    if g.spike_steps:
        at = np.isin(s.step, g.spike_steps) & ok
        twin.scatter(s.step[at], s.grad_norm[at], marker="^", s=18, color="#9467bd")
    twin.set_yscale("log")
    ax.set_zorder(twin.get_zorder() + 1)  # the loss and its legend over the gradient norm
    ax.patch.set_visible(False)
    twin.set_ylabel(f"grad norm ({g.spikes} spikes)", color="#9467bd", fontsize=8)


def _loss_points(ax: Any, s: Series) -> None:
    """The per-step losses: one colour per bucket when steps hold one bucket, else a line."""
    if s.bucket_codes is None:
        ax.plot(s.step, s.loss, color="#4c72b0", linewidth=0.5, alpha=0.8, label="loss")
        return
    mixed = s.bucket_codes < 0
    if mixed.any():
        ax.scatter(s.step[mixed], s.loss[mixed], s=3, color="#7f7f7f", alpha=0.5,
                   linewidths=0, label="mixed buckets", rasterized=True)
    for code, label in enumerate(s.bucket_names):
        sel = s.bucket_codes == code
        if not sel.any():
            continue
        ax.scatter(s.step[sel], s.loss[sel], s=3, color=_PALETTE[code % len(_PALETTE)],
                   alpha=0.6, linewidths=0, rasterized=True,
                   label=f"bucket {label}" if len(s.bucket_names) <= 8 else None)


def _loss_scale(ax: Any, loss: np.ndarray) -> None:
    """A log y-axis when the loss spans more than 5x, else limits padded by 8 %."""
    lo, hi = float(np.min(loss)), float(np.max(loss))
    if lo > 0 and hi / lo > 5:
        ax.set_yscale("log")  # every step on the chart, the stable region still readable
    else:
        pad = 0.08 * (hi - lo if hi > lo else 1.0)
        ax.set_ylim(lo - pad, hi + pad)


def _histogram_panel(ax: Any, r: Report) -> None:
    s = r.series
    if s is None:
        return
    use = s.region & ~s.cliff_mask
    resid = roughness_residual(s.loss, s.cliff_mask)[use] + r.stats.mean
    if resid.size == 0:
        return
    lo, hi = np.quantile(resid, [0.002, 0.998])
    ax.hist(resid, bins=80, range=(lo, hi), density=True, color="#8da0cb", edgecolor="none")
    b = r.bands
    if b.count and b.widths:
        x = np.linspace(lo, hi, 400)
        total = np.zeros_like(x)
        for c, w, sh in zip(b.centres, b.widths, b.shares, strict=True):
            comp = sh / (w * np.sqrt(2 * np.pi)) * np.exp(-0.5 * ((x - c) / w) ** 2)
            total += comp
            if b.count > 1:
                ax.plot(x, comp, color="#d62728", linewidth=0.8, linestyle="--")
        ax.plot(x, total, color="black", linewidth=1.0)
    label = "none" if not b.count or b.count < 2 else str(b.count)
    ax.set_title(f"stable-region loss, detrended\nbands: {label}", fontsize=9)
    ax.set_xlabel("loss - running mean + mean")


def _acf_panel(ax: Any, r: Report) -> None:
    per = r.periodicity
    acf = per.acf
    if acf.size < 3:
        ax.set_title("autocorrelation", fontsize=9)
        ax.text(0.5, 0.5, _wrap(per.note or "not computed", 30), ha="center", va="center",
                transform=ax.transAxes, fontsize=8)
        ax.set_axis_off()
        return
    lags = np.arange(acf.size)
    scale = r.series.step[1] - r.series.step[0] if r.series and r.series.step.size > 1 else 1.0
    ax.plot(lags[1:] * scale, acf[1:], color="#4c72b0", linewidth=0.8)
    bound = 2.0 / np.sqrt(max(per.points, 1))
    ax.axhspan(-bound, bound, color="grey", alpha=0.2, label="95% band of white noise")
    ax.axhline(0, color="black", linewidth=0.5)
    short = acf[1 : min(11, acf.size)]
    above = int(np.sum(np.abs(short) > bound))
    if per.period is not None:
        ax.axvline(per.period, color="#d62728", linewidth=1.0, linestyle="--")
        title = f"autocorrelation (detrended)\nperiod {per.period:.4g} steps, p={per.p_value:.2g}"
    elif above:
        title = (f"autocorrelation (detrended)\nno periodic cycle (p={per.p_value:.2g}); "
                 f"correlated at {above} of lags 1-{short.size}")
    else:
        title = "autocorrelation (detrended)\nno significant period or correlation"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("lag (steps)")
    ax.legend(loc="upper right", fontsize=7)


def _full_windows(n: int, window: int) -> np.ndarray:
    """Which of ``n`` points have a whole centred window of ``window`` points.

    >>> _full_windows(7, 3).tolist()
    [False, True, True, True, True, True, False]
    """
    half = window // 2
    idx = np.arange(n)
    return (idx >= half) & (idx < n - half)


def _lines(text: str, width: int, most: int) -> str:
    """``text`` wrapped at ``width``, cut to ``most`` lines (the last ending in ...).

    >>> _lines("one two three four five six", 9, 2).splitlines()
    ['one two', 'three ...']
    """
    lines = textwrap.wrap(text, width)
    if len(lines) <= most:
        return "\n".join(lines)
    return "\n".join([*lines[:most - 1], textwrap.shorten(lines[most - 1] + " " + lines[most],
                                                           width, placeholder=" ...")])


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.fill(line, width) for line in text.splitlines())
