"""Simulated events on top of a clean log, for the doctor's tests: resumes with rollback, and
the step log of lengthwise's DFlash recipe (one micro-batch a step, empty steps skipped).

:func:`dflash_log` is a ``simulate_run("bucketed")`` log as the DFlash recipe
writes it: a ``plan`` event naming the stratified order, then one micro-batch of
one length bucket a step (``micro_batches`` 1, ``slots``), and at ``skipped``
steps a row ``"skipped": true, "slots": 0`` with a null loss (a step that held no
supervised token).

:func:`grad_norm_log` is a ``simulate_run`` log with loss spikes whose
``grad_norm`` is log-normal noise around a level that grows ``rise``-fold over the
run, with a spike ``lead`` steps before each loss spike (0: at the same step, None:
none), and clipped in the log at ``clip`` never (the logged norm is the norm before
clipping, as trainers log it).

:func:`with_resumes` takes the rows of a log (``simulate_clean`` or ``simulate_run``)
and makes it a log that crashed and resumed: at each ``(before, after)`` pair the
log runs to step ``before``, pauses, and a resumed run logs again from step
``after`` (the rows of the earlier run from ``after`` on are superseded). The
resumed run's losses get fresh noise; its learning rate is the logged one at
each step (a resumed scheduler) or, with ``restart_schedule``, the schedule from
its start again (a scheduler that was not restored). Rows carry a wall-clock
``time`` field, one second a logged row, with ``pause`` seconds before a resume.

Example::

    >>> from simulated_logs.runs import simulate_clean
    >>> rows = with_resumes(simulate_clean(100), [(60, 41)])
    >>> [r["step"] for r in rows][58:62]
    [59, 60, 41, 42]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["dflash_log", "grad_norm_log", "with_evals", "with_resumes", "with_second_writer"]


def with_resumes(
    rows: Sequence[dict[str, Any]],
    resumes: Sequence[tuple[int, int]],
    *,
    restart_schedule: bool = True,
    pause: float = 600.0,
    noise: float = 0.01,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``rows`` (one per step, increasing) as a log that resumed at each ``(before, after)``."""
    rng = np.random.default_rng(seed)
    steps = [r for r in rows if "loss" in r and "event" not in r]
    at = {int(r["step"]): i for i, r in enumerate(steps)}
    out: list[dict[str, Any]] = []
    clock, start, resumed_at = 0.0, 0, None
    for before, after in [*resumes, (int(steps[-1]["step"]), None)]:
        for i in range(start, at[before] + 1):
            row = dict(steps[i])
            if resumed_at is not None:
                row["loss"] = float(row["loss"]) * float(np.exp(noise * rng.standard_normal()))
                if restart_schedule and "lr" in row:
                    row["lr"] = steps[i - resumed_at]["lr"]
            clock += 1.0
            row["time"] = clock
            out.append(row)
        if after is None:
            break
        clock += pause
        start = resumed_at = at[after]
    return out


def with_second_writer(rows: Sequence[dict[str, Any]], lag: int = 1,
                       seed: int = 0) -> list[dict[str, Any]]:
    """``rows`` as two processes write them into one file: every step twice, the second
    writer ``lag`` rows behind the first (its loss differs by a little noise)."""
    rng = np.random.default_rng(seed)
    steps = [r for r in rows if "loss" in r and "event" not in r]
    out: list[dict[str, Any]] = []
    for i, row in enumerate(steps):
        out.append(dict(row))
        if i >= lag:
            late = dict(steps[i - lag])
            late["loss"] = float(late["loss"]) + 1e-4 * float(rng.standard_normal())
            out.append(late)
    for row in steps[len(steps) - lag:]:
        out.append(dict(row))
    return out


def with_evals(
    rows: Sequence[dict[str, Any]],
    every: int,
    *,
    offset: float = 0.01,
    flat_from: int | None = None,
    rise: float = 0.0,
    noise: float = 0.002,
    inline: bool = False,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``rows`` with an evaluation every ``every`` steps: the training loss's running mean
    plus ``offset`` and noise, which from step ``flat_from`` stops falling and climbs by
    ``rise`` over the rest of the run (over-fitting). Evaluations are Hugging Face's own rows
    (``{"step", "eval_loss"}``), or with ``inline`` an ``eval_loss`` in the step's row."""
    rng = np.random.default_rng([seed, 23])
    steps = [r for r in rows if "loss" in r and "event" not in r]
    at = np.array([float(r["step"]) for r in steps])
    smooth = np.convolve([float(r["loss"]) for r in steps], np.ones(51) / 51, mode="same")
    last = float(at[-1])
    out: list[dict[str, Any]] = []
    for row in steps:
        out.append(dict(row))
        s = float(row["step"])
        if s % every:
            continue
        level = float(np.interp(s, at, smooth))
        if flat_from is not None and s > flat_from:
            floor = float(np.interp(flat_from, at, smooth))
            level = floor + rise * (s - flat_from) / max(last - flat_from, 1.0)
        value = level + offset + noise * float(rng.standard_normal())
        if inline:
            out[-1]["eval_loss"] = value
        else:
            out.append({"step": row["step"], "eval_loss": value, "eval_runtime": 3.0})
    return out


def dflash_log(
    steps: int = 3000,
    *,
    skipped: Sequence[int] = (),
    seed: int = 0,
    length_effect: float = 0.3,
) -> list[dict[str, Any]]:
    """A DFlash recipe's step log of ``steps`` steps with the ``skipped`` steps empty."""
    from simulated_logs.runs import simulate_run

    run = simulate_run("bucketed", steps=steps, seed=seed, length_effect=length_effect)
    empty = set(skipped)
    out: list[dict[str, Any]] = [{"event": "plan", "order": "stratified", "layout": "pad"}]
    for row in run.records:
        if "event" in row:
            continue
        row = {**row, "micro_batches": 1, "slots": int(row["real_tokens"]) // 2,
               "skipped": False}
        if row["step"] in empty:
            row.update(loss=None, slots=0, skipped=True, corrected_loss=None)
        out.append(row)
    return out


def grad_norm_log(
    steps: int = 3000,
    *,
    spikes: int = 6,
    lead: int | None = 0,
    rise: float = 1.0,
    level: float = 0.5,
    noise: float = 0.15,
    seed: int = 0,
) -> tuple[list[dict[str, Any]], list[int]]:
    """A log with ``spikes`` loss spikes and a simulated ``grad_norm``; the spike steps."""
    from simulated_logs.runs import simulate_run

    run = simulate_run("random", steps=steps, seed=seed, random_spikes=spikes,
                       length_effect=0.0)
    rng = np.random.default_rng([seed, 17])
    t = np.arange(steps) / max(steps - 1, 1)
    g = level * rise**t * np.exp(noise * rng.standard_normal(steps))
    loss_spikes = [int(x) for x in run.labels["cliffs"]]
    if lead is not None:
        for x in loss_spikes:
            if x - lead >= 1:
                g[x - lead - 1] *= 8.0 + 4.0 * rng.random()
    out = []
    for row in run.records:
        if "event" not in row:
            row = {**row, "grad_norm": float(g[int(row["step"]) - 1])}
        out.append(row)
    return out, loss_spikes
