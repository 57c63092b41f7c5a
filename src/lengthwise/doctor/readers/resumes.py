"""What happened at each restart of a log: the pause before it and the learning rate after it.

A step that goes back is a resumed run (a re-logged step or range right after
it is superseded by the new run) unless it is a second writer's short rewind
(:func:`~lengthwise.doctor.readers.columns.step_order`). For each restart this
module reads, from the rows as they were logged (before the superseded ones
are dropped), the wall-time gap before it (the ``time`` field) and the learning
rate that the earlier run and the resumed run logged at the step it went back
to: a resumed scheduler logs the same rate there, a restarted schedule does not.

Example::

    >>> from lengthwise.doctor.runlog import Restart
    >>> step = np.array([1.0, 2.0, 3.0, 2.0, 3.0])
    >>> lr = np.array([1.0, 0.9, 0.8, 0.1, 0.2])
    >>> r = describe_restarts([Restart(4, 3.0, 2.0)], step, np.arange(1, 6), lr, None)[0]
    >>> r.lr_before, r.lr_after, r.rolled_back
    (0.9, 0.1, 1.0)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lengthwise.doctor.runlog import PAUSE_FACTOR, PAUSE_SECONDS, Restart

__all__ = ["describe_restarts", "pauses"]


def pauses(time: np.ndarray | None) -> np.ndarray | None:
    """Mask of the rows logged after a pause in wall time (None: no ``time`` logged).

    A pause lasts at least ``PAUSE_FACTOR`` median gaps between rows and at least
    ``PAUSE_SECONDS``: a process that stopped and was started again.

    >>> pauses(np.array([0.0, 1.0, 2.0, 3.0, 400.0, 401.0])).tolist()
    [False, False, False, False, True, False]
    """
    if time is None or time.size < 3:
        return None
    gaps = np.diff(time)
    fine = np.isfinite(gaps) & (gaps > 0)
    if fine.sum() < 2:
        return None
    limit = max(PAUSE_SECONDS, PAUSE_FACTOR * float(np.median(gaps[fine])))
    out = np.zeros(time.size, dtype=bool)
    out[1:] = np.isfinite(gaps) & (np.abs(gaps) >= limit)
    return out


def describe_restarts(
    restarts: list[Restart],
    step: np.ndarray,
    lines: np.ndarray,
    lr: np.ndarray | None,
    time: np.ndarray | None,
) -> list[Restart]:
    """``restarts`` with the learning rates around each and the wall-time gap before it.

    ``step``, ``lines``, ``lr`` and ``time`` are the rows in read order, before the
    superseded rows are dropped.
    """
    if not restarts:
        return restarts
    row_of = {int(ln): i for i, ln in enumerate(lines.tolist())}
    out = []
    for r in restarts:
        i = row_of.get(int(r.line))
        if i is None or i == 0:
            out.append(r)
            continue
        out.append(replace(r, lr_before=_earlier_lr(step, lr, i), lr_after=_value(lr, i),
                           gap_seconds=_gap(time, i)))
    return out


def _value(col: np.ndarray | None, i: int) -> float | None:
    if col is None or not np.isfinite(col[i]):
        return None
    return float(col[i])


def _earlier_lr(step: np.ndarray, lr: np.ndarray | None, i: int) -> float | None:
    """The rate the earlier run logged at row ``i``'s step: read there, else interpolated
    between the earlier run's rows around it, else its last row before ``i``."""
    if lr is None:
        return None
    same = np.flatnonzero((step[:i] == step[i]) & np.isfinite(lr[:i]))
    if same.size:
        return float(lr[same[-1]])
    back = np.flatnonzero(np.diff(step[:i]) <= 0)  # the earlier run's rows start after these
    lo = int(back[-1]) + 1 if back.size else 0
    seg_s, seg_lr = step[lo:i], lr[lo:i]
    ok = np.isfinite(seg_lr)
    if ok.sum() >= 2 and seg_s[ok][0] <= step[i] <= seg_s[ok][-1]:
        return float(np.interp(step[i], seg_s[ok], seg_lr[ok]))
    return _value(lr, i - 1)


def _gap(time: np.ndarray | None, i: int) -> float | None:
    if time is None or not (np.isfinite(time[i]) and np.isfinite(time[i - 1])):
        return None
    return float(time[i] - time[i - 1])
