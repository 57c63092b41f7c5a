"""The logged signals beside the loss: gradient norm, held-out loss, schedule, step time.

The methods are in docs/doctor.md (Gradient norm, Held-out loss, Step time, Schedule).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> s = np.arange(1.0, 2001.0)
    >>> g = np.exp(0.1 * rng.standard_normal(2000))
    >>> g[[500, 900, 1300, 1700]] = 20.0
    >>> gn = grad_norm_findings(s, g, cliffs=[503.0, 903.0, 1303.0, 1703.0], interval=1.0)
    >>> gn.spikes, gn.lead.found, gn.co_spikes.found, gn.lead.to_dict()["median_lag_points"]
    (4, True, False, 2)
    >>> s = np.arange(1.0, 1001.0)
    >>> train = 3.0 - s / 1000
    >>> ev = np.column_stack([np.arange(100.0, 1001, 100), [2.95, 2.85, 2.74, 2.62, 2.6,
    ...                       2.6, 2.62, 2.66, 2.7, 2.75]])
    >>> g = eval_gap(s, train, ev)
    >>> g.widening, g.widens_from
    (True, 500.0)
    >>> s = np.arange(1.0, 1001.0)
    >>> lr = 1e-4 * np.minimum(1.0, s / 100)
    >>> check_schedule(s, lr, {"peak": 2e-4, "warmup_steps": 100},
    ...                "training_args.json").mismatches
    ['the learning rate peaks at 0.0001, the configuration says 0.0002']
    >>> s = np.arange(1.0, 1001.0)
    >>> sec = np.exp(0.05 * np.random.default_rng(0).standard_normal(1000))
    >>> sec[99::100] = 6.0                     # every 100th step saves
    >>> st = step_times(s, {"seconds": sec}, checkpoint_every=100.0)
    >>> st.slow, st.period, st.matches
    (10, 100.0, 'the checkpoint interval')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthwise.doctor.cliffs import binomial_sf, hypergeom_sf
from lengthwise.doctor.numeric import (
    JsonForm,
    counted,
    each,
    fixed,
    num,
    robust_std,
    rolling_mean,
    rolling_median,
    significant,
    step_noise,
)

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
class Alignment(JsonForm):
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

    JSON = {"found": None, "aligned": None, "cliffs": None, "expected": fixed(3),
            "p_value": significant, "median_lag_points": (
                "lags", lambda lags: num(float(np.median(lags))) if lags else None)}


@dataclass(frozen=True)
class GradNorm(JsonForm):
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

    JSON = {"points": None, "median": significant, "spikes": None,
            "spike_steps": each(num, 20), "co_spikes": None, "lead": None, "clip": None,
            "clip_source": None, "clip_rate": fixed(4), "clipped_often": None,
            "clipped_spikes": None, "logged": None, "zero_steps": None, "zero_share": fixed(4),
            "no_update_often": None, "trend": None, "note": None}

    @property
    def trend(self) -> dict[str, object]:
        """The trend test: whether the norm rises, Kendall's tau, its p-value and the rise."""
        return {"rising": self.rising, "kendall_tau": significant(self.trend_tau),
                "p_value": significant(self.trend_p), "rise": significant(self.rise)}


def grad_norm_findings(steps: np.ndarray, grad_norm: np.ndarray | None, *, cliffs: Sequence[float],
                       interval: float, clip: float | None = None, clip_source: str | None = None,
                       analysed: np.ndarray | None = None) -> GradNorm:
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
        spike_steps=[float(x) for x in s[spikes][:50]], co_spikes=_aligned(s, spikes, near, -1, 0),
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
    dev = x - rolling_median(x, SPIKE_WINDOW, edges="edge")
    scale = robust_std(dev)
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


def _aligned(s: np.ndarray, spikes: np.ndarray, cliffs: np.ndarray, lo: int, hi: int,
             exclude: tuple[int, int] | None = None) -> Alignment:
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


#: evaluations needed to say anything
MIN_EVALS = 4
#: evaluations after the smallest gap for a widening
MIN_AFTER = 3
#: the last gap over the smallest, in units of the gap's noise
WIDEN_SIGMAS = 3.0
#: ... and as a share of the training loss level
MIN_WIDENING = 0.05
#: points of the running mean of the training loss the gap is taken against
TRAIN_WINDOW = 51


@dataclass(frozen=True)
class EvalGap(JsonForm):
    """Held-out minus training loss at each evaluation, and whether (and where) it widens."""

    evals: int = 0
    first_gap: float | None = None
    last_gap: float | None = None
    min_gap: float | None = None
    widens_from: float | None = None
    widening: bool = False
    eval_min_step: float | None = None
    eval_rising: bool = False
    noise: float | None = None
    note: str = ""

    JSON = {"evals": None, "first_gap": significant, "last_gap": significant,
            "min_gap": significant, "widening": None, "widens_from": num, "eval_rising": None,
            "eval_min_step": num, "noise": significant, "note": None}


def eval_gap(step: np.ndarray, loss: np.ndarray, evals: np.ndarray) -> EvalGap:
    """The :class:`EvalGap` of training losses ``loss`` at ``step`` and ``(step, eval_loss)``
    rows ``evals``."""
    if evals.shape[0] == 0:
        return EvalGap(note="not tested: no held-out loss logged (eval_loss)")
    inside = (evals[:, 0] >= step[0]) & (evals[:, 0] <= step[-1])
    ev = evals[inside]
    if ev.shape[0] < MIN_EVALS:
        return EvalGap(evals=int(ev.shape[0]),
                       note=f"not tested: {counted(int(ev.shape[0]), 'evaluation')} inside "
                            f"the training log (need {MIN_EVALS})")
    trend = rolling_mean(loss, TRAIN_WINDOW)
    at = np.clip(np.searchsorted(step, ev[:, 0]), 0, step.size - 1)
    gap = ev[:, 1] - trend[at]
    noise = step_noise(gap)  # the gap's evaluation-to-evaluation noise
    level = float(np.median(np.abs(trend)))
    margin = max(WIDEN_SIGMAS * noise, MIN_WIDENING * level)
    low = int(np.argmin(gap))
    # a held-out loss still below the training loss has not pulled away from it
    widening = (gap.size - 1 - low >= MIN_AFTER and gap[-1] - gap[low] > margin
                and gap[-1] > margin)
    emin = int(np.argmin(ev[:, 1]))
    rising = ev.shape[0] - 1 - emin >= MIN_AFTER and ev[-1, 1] - ev[emin, 1] > margin
    # the gap leaves its floor after the last evaluation still within the noise of its minimum
    above = np.flatnonzero(gap[low:] > gap[low] + WIDEN_SIGMAS * noise)
    start = low + int(above[0]) - 1 if above.size else low
    return EvalGap(evals=int(ev.shape[0]), first_gap=float(gap[0]), last_gap=float(gap[-1]),
                   min_gap=float(gap[low]), widens_from=float(ev[start, 0]) if widening else None,
                   widening=bool(widening), eval_min_step=float(ev[emin, 0]),
                   eval_rising=bool(rising), noise=noise)


#: the logged peak may differ from the configured rate by this share
PEAK_TOLERANCE = 0.02
#: the warm-up ends where the rate first reaches this share of the peak
WARM_SHARE = 0.98
#: the logged warm-up may differ from the configured one by this share
WARM_TOLERANCE = 0.1
#: the configuration keys read, each with its aliases
SCHEDULE_KEYS: dict[str, tuple[str, ...]] = {"peak": ("learning_rate", "lr"),
                                             "warmup_steps": ("warmup_steps", "num_warmup_steps"),
                                             "warmup_ratio": ("warmup_ratio",),
                                             "max_steps": ("max_steps", "total_steps")}


@dataclass(frozen=True)
class Schedule(JsonForm):
    """The configured and logged peak rate and warm-up, and what disagrees."""

    source: str | None = None
    peak: float | None = None
    logged_peak: float | None = None
    warmup: float | None = None
    logged_warmup: float | None = None
    mismatches: list[str] = field(default_factory=list)
    note: str = ""

    JSON = {"source": None, "peak": significant, "logged_peak": significant, "warmup": num,
            "logged_warmup": num, "mismatches": None, "note": None}


def check_schedule(step: np.ndarray, lr: np.ndarray | None, config: dict[str, Any],
                   source: str | None, interval: float = 1.0) -> Schedule:
    """Compare the logged ``lr`` at ``step`` with ``config`` (keys of :data:`SCHEDULE_KEYS`)."""
    if not config:
        return Schedule(note="not tested: no learning-rate schedule recorded beside the log "
                             "(`learning_rate` and `warmup_steps` in a training_args.json, "
                             "args.json, config.json or run_config.json)")
    if lr is None or np.isfinite(lr).sum() < 3:
        return Schedule(source=source, note="not tested: no learning rate logged")
    ok = np.isfinite(lr)
    s, r = step[ok], lr[ok]
    logged_peak = float(np.max(r))
    reach = np.flatnonzero(r >= WARM_SHARE * logged_peak)
    logged_warm = float(s[reach[0]]) if reach.size and reach[0] > 0 else 0.0
    peak = config.get("peak")
    warm = config.get("warmup_steps")
    if warm is None and config.get("warmup_ratio") is not None and config.get("max_steps"):
        warm = float(config["warmup_ratio"]) * float(config["max_steps"])
    if peak is None and warm is None:
        return Schedule(source=source, note="not tested: no peak learning rate or warm-up "
                        "configured beside the log")
    out = []
    if peak is not None and abs(logged_peak - peak) > PEAK_TOLERANCE * peak:
        out.append(f"the learning rate peaks at {logged_peak:.3g}, the configuration says "
                   f"{peak:.3g}")
    if warm is not None and abs(logged_warm - warm) > max(WARM_TOLERANCE * warm,
                                                          2 * interval):
        out.append(f"the warm-up ends at step {logged_warm:g}, the configuration says "
                   f"{warm:g} steps")
    return Schedule(source=source, peak=peak, logged_peak=logged_peak,
                    warmup=None if warm is None else float(warm), logged_warmup=logged_warm,
                    mismatches=out)


#: a slow step takes at least this many median step times ...
SLOW_FACTOR = 2.0
#: ... and this many robust standard deviations above the median
SLOW_Z = 5.0
#: slow steps needed to look for their period
MIN_PERIODIC = 3
#: the spacings of periodic slow steps lie within this share of their median
PERIOD_SPREAD = 0.05
#: slow steps costing at least this share of the run's time are a cause
COST_SHARE = 0.05
#: throughput after a restart below this share of before is a cause
RESTART_THROUGHPUT = 0.8
#: rows needed on each side of a restart to compare throughput
MIN_ROWS = 10
#: step times needed to test anything
STEP_TIME_POINTS = 30


@dataclass(frozen=True)
class StepTimes(JsonForm):
    """What the logged step times say (``points`` 0: none logged, nothing tested)."""

    points: int = 0
    source: str | None = None
    median_seconds: float | None = None
    slow: int = 0
    slow_steps: list[float] = field(default_factory=list)
    cost_share: float | None = None
    period: float | None = None
    matches: str | None = None
    after_restarts: list[tuple[float, float]] = field(default_factory=list)
    note: str = ""
    stragglers: Stragglers | None = None

    @property
    def costly(self) -> bool:
        """The slow steps cost at least :data:`COST_SHARE` of the run's time."""
        return self.cost_share is not None and self.cost_share >= COST_SHARE

    @property
    def slower_after_restart(self) -> list[tuple[float, float]]:
        """``(step, ratio)`` of restarts after which the throughput fell below
        :data:`RESTART_THROUGHPUT` of before."""
        return [(s, r) for s, r in self.after_restarts if r < RESTART_THROUGHPUT]

    JSON = {"points": None, "source": None, "median_seconds": significant, "slow": None,
            "slow_steps": each(num, 20), "cost_share": significant, "period": num,
            "matches": None, "throughput_after_restarts": ("after_restarts", each(
                lambda sr: {"step": num(sr[0]), "ratio": round(sr[1], 4)})),
            "stragglers": lambda s: (s or Stragglers()).to_dict(), "note": None}


def step_times(step: np.ndarray, columns: dict[str, np.ndarray], *,
               checkpoint_every: float | None = None, eval_every: float | None = None,
               restarts: Sequence[float] = (), rank_seconds: np.ndarray | None = None) -> StepTimes:
    """The :class:`StepTimes` of a log's steps and columns (``seconds``, ``time``,
    ``tokens_per_second``); ``restarts`` are the steps the log resumed at; ``rank_seconds``
    each row's step time on each rank (for stragglers)."""
    seconds, source = _seconds(step, columns)
    after = _after_restarts(step, columns.get("tokens_per_second"), restarts)
    late = stragglers(rank_seconds)
    if seconds is None and rank_seconds is not None and rank_seconds.ndim == 2:
        seconds, source = np.nanmax(rank_seconds, axis=1), "slowest rank_seconds"
    if seconds is None:
        return StepTimes(after_restarts=after, stragglers=late,
                         note="not tested: no step time logged (seconds or time)")
    ok = np.isfinite(seconds) & (seconds > 0)
    s, sec = step[ok], seconds[ok]
    if s.size < STEP_TIME_POINTS:
        return StepTimes(points=int(s.size), source=source, after_restarts=after,
                         stragglers=late,
                         note=f"not tested: {s.size} step times (need {STEP_TIME_POINTS})")
    x = np.log(sec)
    med = float(np.median(x))
    scale = robust_std(x)
    slow = (sec >= SLOW_FACTOR * np.exp(med)) & (x - med > SLOW_Z * max(scale, 1e-12))
    cost = float(np.sum(sec[slow] - np.exp(med)) / np.sum(sec))
    period = _period(s[slow])
    return StepTimes(points=int(s.size), source=source, median_seconds=float(np.exp(med)),
                     slow=int(slow.sum()), slow_steps=[float(v) for v in s[slow][:50]],
                     cost_share=cost, period=period,
                     matches=_match(period, checkpoint_every, eval_every),
                     after_restarts=after, stragglers=late)


def _seconds(step: np.ndarray, columns: dict[str, np.ndarray]) -> tuple[np.ndarray | None,
                                                                          str | None]:
    """Each row's step time: ``seconds``, else the wall ``time`` between rows per step."""
    if "seconds" in columns and np.isfinite(columns["seconds"]).sum() >= 2:
        return columns["seconds"], "seconds"
    time = columns.get("time")
    if time is None or np.isfinite(time).sum() < 3:
        return None, None
    out = np.full(step.size, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        out[1:] = np.diff(time) / np.diff(step)
    return out, "time between rows"


def _period(slow_steps: np.ndarray) -> float | None:
    """The spacing of slow steps that recur at one spacing (None: they do not)."""
    if slow_steps.size < MIN_PERIODIC:
        return None
    gaps = np.diff(slow_steps)
    mid = float(np.median(gaps))
    if mid <= 0 or np.max(np.abs(gaps - mid)) > PERIOD_SPREAD * mid:
        return None
    return mid


def _match(period: float | None, checkpoint_every: float | None,
           eval_every: float | None) -> str | None:
    """The known interval the period matches (within :data:`PERIOD_SPREAD`)."""
    if period is None:
        return None
    for every, what in ((checkpoint_every, "the checkpoint interval"),
                        (eval_every, "the evaluation interval")):
        if every and abs(period - every) <= PERIOD_SPREAD * every:
            return what
    return None


def _after_restarts(step: np.ndarray, tps: np.ndarray | None,
                    restarts: Sequence[float]) -> list[tuple[float, float]]:
    """``(step, throughput after / before)`` for each restart with enough rows on each side."""
    if tps is None or not restarts:
        return []
    out = []
    bounds = [float(step[0]) - 1, *sorted(restarts), float(step[-1]) + 1]
    for i in range(1, len(bounds) - 1):
        before = tps[(step > bounds[i - 1]) & (step < bounds[i]) & np.isfinite(tps)]
        after = tps[(step >= bounds[i]) & (step < bounds[i + 1]) & np.isfinite(tps)]
        if before.size >= MIN_ROWS and after.size >= MIN_ROWS and np.median(before) > 0:
            out.append((bounds[i], float(np.median(after) / np.median(before))))
    return out


@dataclass(frozen=True)
class Stragglers(JsonForm):
    """Per-rank step times: a rank that is the slowest at most steps (``ranks`` 0: none)."""

    ranks: int = 0
    steps: int = 0
    rank: int | None = None
    slowest_share: float | None = None
    p_value: float | None = None
    excess: float | None = None
    wait_share: float | None = None
    note: str = ""

    @property
    def found(self) -> bool:
        """One rank is the slowest far more often than by chance and by at least
        :data:`STRAGGLER_EXCESS` of the ranks' median time."""
        return (self.p_value is not None and self.p_value < STRAGGLER_ALPHA
                and (self.excess or 0.0) >= STRAGGLER_EXCESS)

    JSON = {"ranks": None, "steps": None, "found": None, "rank": None,
            **{k: significant for k in ("slowest_share", "p_value", "excess", "wait_share")},
            "note": None}


#: a straggler is the slowest rank at significantly more steps than 1 / ranks (binomial tail)
STRAGGLER_ALPHA = 0.01
#: ... and its median step time is at least this share above the ranks' median
STRAGGLER_EXCESS = 0.05


def stragglers(rank_seconds: np.ndarray | None) -> Stragglers:
    """The straggler test over a rows x ranks array of step times (NaN: not logged)."""
    if rank_seconds is None or rank_seconds.ndim != 2 or rank_seconds.shape[1] < 2:
        return Stragglers(note="not tested: no per-rank step times logged (rank_seconds)")
    full = rank_seconds[np.all(np.isfinite(rank_seconds), axis=1)]
    n, w = full.shape
    if n < STEP_TIME_POINTS:
        return Stragglers(ranks=w, steps=n, note=f"not tested: {n} steps with every rank's "
                          f"time (need {STEP_TIME_POINTS})")
    slowest = np.bincount(np.argmax(full, axis=1), minlength=w)
    rank = int(np.argmax(slowest))
    median = np.median(full, axis=1)
    excess = float(np.median(full[:, rank] / median) - 1.0)
    wait = float(np.sum(full.max(axis=1) - median) / np.sum(full.max(axis=1)))
    return Stragglers(ranks=w, steps=n, rank=rank, slowest_share=float(slowest[rank] / n),
                      p_value=min(1.0, binomial_sf(int(slowest[rank]), n, 1.0 / w) * w),
                      excess=excess, wait_share=wait)
