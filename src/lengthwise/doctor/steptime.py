"""Step time: slow steps, the period they come at, and the throughput after each restart.

A step's time is its logged ``seconds`` (lengthwise's step log), else the wall
``time`` between logged rows over the steps between them. A step is *slow* when
its time is at least :data:`SLOW_FACTOR` times the median and more than
:data:`SLOW_Z` robust standard deviations (1.4826 MAD of ``log(seconds)``) above
it: for log-normal step times the rate of false slow steps is below 3e-7 a step.
Slow steps that recur at one spacing (at least :data:`MIN_PERIODIC` of them, the
spacings within :data:`PERIOD_SPREAD` of their median) have a *period*, matched to
the save or evaluation interval when it is known. The share of the run's time
they cost is their time beyond the median step's. Throughput after a restart is
the median ``tokens_per_second`` of the rows after it over the median before it.

Example::

    >>> import numpy as np
    >>> s = np.arange(1.0, 1001.0)
    >>> sec = np.exp(0.05 * np.random.default_rng(0).standard_normal(1000))
    >>> sec[99::100] = 6.0                     # every 100th step saves
    >>> st = step_times(s, {"seconds": sec}, checkpoint_every=100.0)
    >>> st.slow, st.period, st.matches
    (10, 100.0, 'the checkpoint interval')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lengthwise.doctor.numbers import num, significant

__all__ = ["StepTimes", "Stragglers", "step_times", "stragglers"]

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
MIN_POINTS = 30


@dataclass(frozen=True)
class StepTimes:
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

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``step_time`` key of the report)."""
        return {"points": self.points, "source": self.source,
                "median_seconds": significant(self.median_seconds), "slow": self.slow,
                "slow_steps": [num(s) for s in self.slow_steps[:20]],
                "cost_share": significant(self.cost_share), "period": num(self.period),
                "matches": self.matches,
                "throughput_after_restarts": [{"step": num(s), "ratio": round(r, 4)}
                                              for s, r in self.after_restarts],
                "stragglers": (self.stragglers or Stragglers()).to_dict(),
                "note": self.note}


def step_times(
    step: np.ndarray,
    columns: dict[str, np.ndarray],
    *,
    checkpoint_every: float | None = None,
    eval_every: float | None = None,
    restarts: Sequence[float] = (),
    rank_seconds: np.ndarray | None = None,
) -> StepTimes:
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
    if s.size < MIN_POINTS:
        return StepTimes(points=int(s.size), source=source, after_restarts=after,
                         stragglers=late,
                         note=f"not tested: {s.size} step times (need {MIN_POINTS})")
    x = np.log(sec)
    med = float(np.median(x))
    scale = 1.4826 * float(np.median(np.abs(x - med)))
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
class Stragglers:
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

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``stragglers`` key of ``step_time``)."""
        return {"ranks": self.ranks, "steps": self.steps, "found": self.found,
                "rank": self.rank, "slowest_share": significant(self.slowest_share),
                "p_value": significant(self.p_value), "excess": significant(self.excess),
                "wait_share": significant(self.wait_share), "note": self.note}


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
    if n < MIN_POINTS:
        return Stragglers(ranks=w, steps=n, note=f"not tested: {n} steps with every rank's "
                          f"time (need {MIN_POINTS})")
    slowest = np.bincount(np.argmax(full, axis=1), minlength=w)
    rank = int(np.argmax(slowest))
    median = np.median(full, axis=1)
    excess = float(np.median(full[:, rank] / median) - 1.0)
    wait = float(np.sum(full.max(axis=1) - median) / np.sum(full.max(axis=1)))
    return Stragglers(ranks=w, steps=n, rank=rank, slowest_share=float(slowest[rank] / n),
                      p_value=min(1.0, _binomial_sf(int(slowest[rank]), n, 1.0 / w) * w),
                      excess=excess, wait_share=wait)


def _binomial_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X`` ~ binomial(n, p), in logs (exact)."""
    from math import exp, lgamma, log

    if k <= 0:
        return 1.0
    terms = [lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1) + i * log(p)
             + (n - i) * log(1 - p) for i in range(k, n + 1)]
    top = max(terms)
    return float(min(1.0, exp(top) * sum(exp(t - top) for t in terms)))
