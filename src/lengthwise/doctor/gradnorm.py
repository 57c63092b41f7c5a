"""The gradient norm beside the loss: co-spikes, spikes that lead, the clip rate and a trend.

Each test reads the logged ``grad_norm`` (the norm before clipping, as
``clip_grad_norm_`` returns it and trainers log it) over the analysed steps:

* **spikes**: points where ``log(grad_norm)`` stands more than :data:`SPIKE_Z`
  robust standard deviations (1.4826 MAD of the difference from a centred rolling
  median of :data:`SPIKE_WINDOW` points) above that median. For Gaussian noise
  the rate of false spikes is below 3e-7 a point.
* **co-spikes**: loss cliffs (:mod:`lengthwise.doctor.cliffs`) with a gradient-norm
  spike at the cliff's first logged point or the next one; **leads**: cliffs with a
  spike 1 to :data:`LEAD_POINTS` logged points before them and none at the cliff. Both
  are tested like the checkpoint alignment (:func:`~lengthwise.doctor.checkpoints.
  hypergeom_sf`): under the null the cliffs sit at random analysed points, so the
  number that land in the spikes' windows is hypergeometric and ``p`` is exact;
  found when ``p <`` :data:`ALPHA` and at least 2 cliffs align.
* **clip rate**: the share of the logged steps (a norm of 0 included) at or above
  the clipping norm (from ``--clip`` or a config file beside the log); clipping at
  :data:`CLIP_SHARE` of them at least is ``clipped_often``. It is context, not a
  cause of the curve's shape, unless the loss shows it: **clipped spikes**, loss
  cliffs whose first logged point is a clipped step, tested like the co-spikes
  against the clipped steps, or a loss that does not move (the verdict's stall).
* **zero norms**: steps that log a gradient norm of exactly 0 took no update (no
  trainable weight got a gradient); their count and share, a finding of its own
  from :data:`ZERO_SHARE` of the logged steps. The other tests read the positive
  norms.
* **trend**: Kendall's tau of the medians of :data:`TREND_BLOCKS` equal blocks of
  the analysed points against their order (block medians tame the
  autocorrelation of the raw series), and the rise: the median of the last block
  over the first; found when ``p <`` :data:`ALPHA` and the norm at least
  :data:`TREND_RISE` times what it was.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> s = np.arange(1.0, 2001.0)
    >>> g = np.exp(0.1 * rng.standard_normal(2000))
    >>> g[[500, 900, 1300, 1700]] = 20.0
    >>> gn = grad_norm_findings(s, g, cliffs=[503.0, 903.0, 1303.0, 1703.0], interval=1.0)
    >>> gn.spikes, gn.lead.found, gn.co_spikes.found, gn.lead.to_dict()["median_lag_points"]
    (4, True, False, 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.checkpoints import hypergeom_sf
from lengthwise.doctor.numbers import num, significant

__all__ = ["Alignment", "GradNorm", "grad_norm_findings"]

#: a point this many robust standard deviations above the rolling median is a spike
SPIKE_Z = 5.0
#: points of the centred rolling median the spikes are measured from
SPIKE_WINDOW = 51
#: a gradient-norm spike up to this many logged points before a cliff leads it
LEAD_POINTS = 5
#: significance level of the alignment and trend tests
ALPHA = 0.01
#: a clip rate at or above this share is ``clipped_often``
CLIP_SHARE = 0.25
#: logged steps with a gradient norm of 0 (no update) from this share on are a finding
ZERO_SHARE = 0.1
#: blocks whose medians the trend test ranks
TREND_BLOCKS = 20
#: the last block's median over the first block's for a rising trend
TREND_RISE = 2.0
#: analysed points below which nothing is tested
MIN_POINTS = 60


@dataclass(frozen=True)
class Alignment:
    """Cliffs that line up with gradient-norm spikes at a given lag, and the exact test."""

    aligned: int = 0
    cliffs: int = 0
    expected: float | None = None
    p_value: float | None = None
    lags: list[int] = field(default_factory=list)

    @property
    def found(self) -> bool:
        """At least 2 cliffs align and ``p <`` :data:`ALPHA`."""
        return self.p_value is not None and self.p_value < ALPHA and self.aligned >= 2

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"found": self.found, "aligned": self.aligned, "cliffs": self.cliffs,
                "expected": None if self.expected is None else round(self.expected, 3),
                "p_value": significant(self.p_value),
                "median_lag_points": num(float(np.median(self.lags))) if self.lags else None}


@dataclass(frozen=True)
class GradNorm:
    """What the logged gradient norm says (``points`` 0: none logged, nothing tested)."""

    points: int = 0
    spikes: int = 0
    spike_steps: list[float] = field(default_factory=list)
    co_spikes: Alignment = field(default_factory=Alignment)
    lead: Alignment = field(default_factory=Alignment)
    clip: float | None = None
    clip_source: str | None = None
    clip_rate: float | None = None
    #: loss cliffs whose first logged point is a clipped step
    clipped_spikes: Alignment = field(default_factory=Alignment)
    #: logged steps whose gradient norm is exactly 0 (no update), and the first of them
    zero_steps: int = 0
    zero_first: list[float] = field(default_factory=list)
    #: logged steps with a finite gradient norm (0 included): what the rates are shares of
    logged: int = 0
    trend_tau: float | None = None
    trend_p: float | None = None
    rise: float | None = None
    median: float | None = None
    note: str = ""

    @property
    def clipped_often(self) -> bool:
        """At least :data:`CLIP_SHARE` of the steps are at or above the clipping norm."""
        return self.clip_rate is not None and self.clip_rate >= CLIP_SHARE

    @property
    def zero_share(self) -> float:
        """The share of the logged steps whose gradient norm is 0 (0.0: none logged)."""
        return self.zero_steps / self.logged if self.logged else 0.0

    @property
    def no_update_often(self) -> bool:
        """At least :data:`ZERO_SHARE` of the logged steps have a gradient norm of 0."""
        return self.zero_steps > 0 and self.zero_share >= ZERO_SHARE

    @property
    def rising(self) -> bool:
        """The trend test found a rise of at least :data:`TREND_RISE` times."""
        return (self.trend_p is not None and self.trend_p < ALPHA and self.rise is not None
                and self.rise >= TREND_RISE)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``grad_norm`` key of the report)."""
        return {
            "points": self.points, "median": significant(self.median),
            "spikes": self.spikes, "spike_steps": [num(s) for s in self.spike_steps[:20]],
            "co_spikes": self.co_spikes.to_dict(), "lead": self.lead.to_dict(),
            "clip": self.clip, "clip_source": self.clip_source,
            "clip_rate": None if self.clip_rate is None else round(self.clip_rate, 4),
            "clipped_often": self.clipped_often,
            "clipped_spikes": self.clipped_spikes.to_dict(),
            "logged": self.logged, "zero_steps": self.zero_steps,
            "zero_share": round(self.zero_share, 4), "no_update_often": self.no_update_often,
            "trend": {"rising": self.rising, "kendall_tau": significant(self.trend_tau),
                      "p_value": significant(self.trend_p), "rise": significant(self.rise)},
            "note": self.note,
        }


def grad_norm_findings(
    steps: np.ndarray,
    grad_norm: np.ndarray | None,
    *,
    cliffs: Sequence[float],
    interval: float,
    clip: float | None = None,
    clip_source: str | None = None,
    analysed: np.ndarray | None = None,
) -> GradNorm:
    """Every gradient-norm test over the logged ``steps`` (``grad_norm`` aligned with them):
    the clip rate and the zero norms over all of them, the others over the ``analysed``
    ones (a mask; None: all)."""
    if grad_norm is None:
        return GradNorm(note="not tested: no grad_norm logged")
    logged = np.isfinite(grad_norm) & (grad_norm >= 0)
    s_all, g_all = steps[logged], grad_norm[logged]
    zero = g_all == 0
    zeros = {"logged": int(s_all.size), "zero_steps": int(zero.sum()),
             "zero_first": [float(x) for x in s_all[zero][:20]]}
    use = ~zero if analysed is None else ~zero & analysed[logged]
    s, g = s_all[use], g_all[use]
    if s.size < MIN_POINTS:
        return GradNorm(points=int(s.size), **zeros, note=f"not tested: {s.size} points with "
                        f"a positive grad_norm (need {MIN_POINTS})")
    spikes = spike_mask(np.log(g))
    clipped = None if clip is None else g_all >= clip * (1 - 1e-6)
    tau, p, rise = trend(np.log(g))
    near = np.asarray(cliffs, dtype=np.float64)
    near = near[(near >= s[0]) & (near <= s[-1])]
    return GradNorm(
        points=int(s.size), spikes=int(spikes.sum()),
        spike_steps=[float(x) for x in s[spikes][:50]],
        co_spikes=_aligned(s, spikes, near, -1, 0),
        lead=_aligned(s, spikes, near, 1, LEAD_POINTS, exclude=(-1, 0)),
        clip=clip, clip_source=clip_source if clip is not None else None,
        clip_rate=None if clipped is None else float(np.mean(clipped)),
        clipped_spikes=Alignment() if clipped is None else _aligned(s_all, clipped, near, 0, 0),
        **zeros, trend_tau=tau, trend_p=p, rise=rise, median=float(np.median(g)),
        note="" if clip is not None else "clip rate not tested: clipping norm unknown "
        "(pass --clip, or keep max_grad_norm in a training_args.json beside the log)",
    )


def spike_mask(x: np.ndarray) -> np.ndarray:
    """Points more than :data:`SPIKE_Z` robust standard deviations above the rolling median."""
    half = SPIKE_WINDOW // 2
    padded = np.pad(x, half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, SPIKE_WINDOW)
    dev = x - np.median(windows, axis=1)
    scale = 1.4826 * float(np.median(np.abs(dev - np.median(dev))))
    if not scale > 0:
        return np.zeros(x.size, dtype=bool)
    return dev > SPIKE_Z * scale


def trend(x: np.ndarray) -> tuple[float | None, float | None, float | None]:
    """Kendall's tau of :data:`TREND_BLOCKS` block medians, its p-value (two-sided, normal
    approximation without ties) and the last block's median over the first (of ``exp(x)``)."""
    blocks = np.array_split(x, TREND_BLOCKS)
    med = np.array([float(np.median(b)) for b in blocks if b.size])
    n = med.size
    if n < 8:
        return None, None, None
    i, j = np.triu_indices(n, 1)
    conc = float(np.sign(med[j] - med[i]).sum())
    tau = conc / (n * (n - 1) / 2)
    var = n * (n - 1) * (2 * n + 5) / 18
    z = (abs(conc) - 1) / math.sqrt(var)
    p = math.erfc(max(z, 0.0) / math.sqrt(2))
    return tau, p, float(math.exp(med[-1] - med[0]))


def _aligned(
    s: np.ndarray, spikes: np.ndarray, cliffs: np.ndarray, lo: int, hi: int,
    exclude: tuple[int, int] | None = None,
) -> Alignment:
    """Cliffs with a spike ``lo..hi`` logged points before them (0: at the cliff, -1: the
    point after it), and none ``exclude[0]..exclude[1]`` points before (when given), with
    the hypergeometric test."""
    if cliffs.size == 0 or not spikes.any():
        return Alignment(cliffs=int(cliffs.size))
    window = _spike_before(spikes, lo, hi)
    if exclude is not None:
        window &= ~_spike_before(spikes, *exclude)
    at = np.clip(np.searchsorted(s, cliffs), 0, s.size - 1)
    hit = window[at]
    total, good = int(s.size), int(window.sum())
    if good == 0:
        return Alignment(cliffs=int(cliffs.size))
    lags = [_lag(spikes, int(i), lo, hi) for i in at[hit]]
    return Alignment(aligned=int(hit.sum()), cliffs=int(cliffs.size),
                     expected=cliffs.size * good / total,
                     p_value=hypergeom_sf(int(hit.sum()), total, good,
                                          min(int(cliffs.size), total)),
                     lags=lags)


def _spike_before(spikes: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Mask of points with a spike ``lo..hi`` points before them (a negative lag: after)."""
    out = np.zeros(spikes.size, dtype=bool)
    n = spikes.size
    for k in range(lo, hi + 1):
        if k >= 0:
            out[k:] |= spikes[: n - k]
        else:
            out[: n + k] |= spikes[-k:]
    return out


def _lag(spikes: np.ndarray, i: int, lo: int, hi: int) -> int:
    """Points from the nearest spike in the window to point ``i`` (positive: it came first)."""
    for k in sorted(range(lo, hi + 1), key=abs):
        if 0 <= i - k < spikes.size and spikes[i - k]:
            return k
    return hi
