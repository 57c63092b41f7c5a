"""Which mechanism's length a loss period matches: its arithmetic, or "unknown cause".

A period is evidence of a mechanism only when the numbers fit. The lengths tried:

* ``epoch``: the steps per epoch (a staircase or saw-tooth at each epoch start);
* ``megabatch``: Hugging Face's length-grouped sampler sorts each mega-batch of
  ``m = min(N // (4 * batch), 50)`` batches by length, ``N`` the data set size and
  ``batch`` the samples of one process's optimizer step (per-device batch x
  gradient accumulation). With ``W`` data-parallel processes an optimizer step
  takes ``W`` such batches, so the loss cycles every ``m / W`` steps, with
  ``N // batch = W x`` the steps per epoch; the cycle restarts at each epoch.
  When the world size is unknown, 1, 2, 4 and 8 processes are tried;
* ``checkpoint`` and ``evaluation`` intervals, and the spacing of learning-rate
  restarts.

A run logged every ``k`` steps sees a period ``P`` as ``P`` when ``P >= 2k``,
else as its alias: the logged points sample (and average) the cycle, whose
frequency folds to ``|k/P - round(k/P)|`` cycles per point. A period matches a
length when it lies within 5 % (or half a logging interval) of the length or
of its alias.

Example::

    >>> from lengthwise.doctor.context import RunContext
    >>> ctx = RunContext(first_step=10, last_step=10000, interval=10, steps_per_epoch=412.0,
    ...                  steps_per_epoch_source="epoch field")
    >>> m = match_period(50.0, ctx)
    >>> m.mechanism, m.expected
    ('megabatch', 50.0)
    >>> match_period(60.0, ctx).mechanism is None
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lengthwise.doctor.context import RunContext

#: Hugging Face's largest mega-batch, in batches
HF_MEGABATCH = 50
#: relative tolerance of a match
TOLERANCE = 0.05
#: world sizes tried when the log does not say
COMMON_WORLD_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class PeriodMatch:
    """The mechanism a period matched (None: none) and the arithmetic that fits."""

    mechanism: str | None
    expected: float | None
    arithmetic: str
    missing: str = ""


def apparent_period(period: float, interval: float) -> float | None:
    """The period (in steps) a cycle of ``period`` steps shows in a log every ``interval`` steps.

    >>> apparent_period(50.0, 1.0), apparent_period(3.125, 10.0)
    (50.0, 50.0)
    """
    if period >= 2 * interval:
        return period
    f = interval / period
    folded = abs(f - round(f))
    return None if folded < 1e-9 else round(interval / folded, 6)


def _fits(found: float, length: float, interval: float) -> bool:
    seen = apparent_period(length, interval)
    if seen is None:
        return False
    return abs(found - seen) <= max(TOLERANCE * seen, 0.5 * interval)


def megabatch_steps(steps_per_epoch: float, world_size: int = 1) -> float:
    """Optimizer steps per Hugging Face mega-batch cycle: ``min(W * spe // 4, 50) / W``.

    ``W * spe`` is the epoch in one process's batches (``N // batch``), so the
    mega-batch holds ``min(W * spe // 4, 50)`` of them (at least 1) and ``W``
    are used per optimizer step.

    >>> megabatch_steps(412), megabatch_steps(403, world_size=4), megabatch_steps(276, 10)
    (50.0, 12.5, 5.0)
    """
    batches = max(1, min(int(steps_per_epoch * world_size) // 4, HF_MEGABATCH))
    return batches / world_size


def world_sizes(ctx: RunContext) -> tuple[int, ...]:
    """The world sizes the arithmetic uses: the known one, else the common ones."""
    return (ctx.world_size,) if ctx.world_size else COMMON_WORLD_SIZES


def candidates(ctx: RunContext) -> list[tuple[str, float, str]]:
    """``(mechanism, length in steps, how it was computed)`` for every known length."""
    out: list[tuple[str, float, str]] = []
    spe = ctx.steps_per_epoch
    if spe is not None:
        out.append(("epoch", spe, f"{spe:.4g} steps per epoch ({ctx.steps_per_epoch_source})"))
        batch = f"batch {ctx.batch_size} per process, " if ctx.batch_size else ""
        for w in world_sizes(ctx):
            mb = megabatch_steps(spe, w)
            if any(name == "megabatch" and length == mb for name, length, _ in out):
                continue
            world = (f"world size {w} ({ctx.world_size_source})" if ctx.world_size
                     else f"world size {w} assumed")
            out.append(("megabatch", mb,
                        f"Hugging Face length-grouped mega-batch: min(N // (4 * batch), 50) / W"
                        f" = min({w} x {int(spe)} // 4, 50) / {w} = {mb:g} steps ({batch}"
                        f"{world}, {spe:.4g} steps per epoch)"))
    if ctx.checkpoint_every:
        out.append(("checkpoint", ctx.checkpoint_every,
                    f"checkpoint every {ctx.checkpoint_every:.4g} steps ({ctx.checkpoint_source})"))
    if ctx.eval_every:
        out.append(("evaluation", ctx.eval_every, f"evaluation every {ctx.eval_every:.4g} steps"))
    if len(ctx.lr_restarts) >= 2:
        gaps = [b - a for a, b in zip(ctx.lr_restarts[:-1], ctx.lr_restarts[1:], strict=True)]
        gap = sorted(gaps)[len(gaps) // 2]
        out.append(("lr_restarts", gap, f"learning-rate restarts every {gap:.4g} steps"))
    return out


def match_period(period: float, ctx: RunContext) -> PeriodMatch:
    """The first mechanism whose length (or its alias in the log) matches ``period`` steps."""
    for name, length, how in candidates(ctx):
        if _fits(period, length, ctx.interval):
            seen = apparent_period(length, ctx.interval)
            alias = "" if seen == length else (
                f", seen as {seen:.4g} steps when logged every {ctx.interval:.4g}")
            return PeriodMatch(name, length, f"matches {how}{alias}")
    missing = []
    if ctx.steps_per_epoch is None:
        missing.append("--steps-per-epoch N (or log `epoch`)")
    if ctx.batch_size is None and ctx.steps_per_epoch is None:
        missing.append("--batch-size B")
    if ctx.world_size is None:
        missing.append("--world-size W")
    if ctx.checkpoint_every is None:
        missing.append("--checkpoint-every N")
    tried = ", ".join(f"{n} {v:.4g}" for n, v, _ in candidates(ctx)) or "none known"
    hint = ("HF length grouping would give a 50-step cycle with 200+ steps per epoch"
            if ctx.steps_per_epoch is None and math.isclose(period, HF_MEGABATCH, rel_tol=0.05)
            else "")
    return PeriodMatch(None, None, f"matches no known mechanism (lengths tried: {tried})"
                       + (f"; {hint}" if hint else ""),
                       missing="pass " + ", ".join(missing) if missing else "")
