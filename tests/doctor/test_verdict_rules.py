"""The verdict's rules: causes only where the arithmetic fits, every finding in it, one summary."""

from __future__ import annotations

import numpy as np
import pytest

from lengthwise.doctor import diagnose, verdict_for
from lengthwise.doctor.context import (
    RunContext,
    apparent_period,
    epochs_from_field,
    match_period,
    megabatch_steps,
    run_context,
)
from lengthwise.doctor.epochs import epoch_boundaries
from lengthwise.doctor.numeric import detrended
from lengthwise.doctor.periodicity import fold_test
from lengthwise.doctor.report import render_text

from simulated_logs.runs import simulate_clean, simulate_run


def _ctx(**kw) -> RunContext:
    return RunContext(first_step=1, last_step=10_000, interval=kw.pop("interval", 1), **kw)


@pytest.mark.parametrize(
    ("period", "ctx", "mechanism"),
    [
        (50.0, _ctx(steps_per_epoch=412.0, steps_per_epoch_source="epoch field"), "megabatch"),
        (25.0, _ctx(steps_per_epoch=100.0, steps_per_epoch_source="x"), "megabatch"),
        (374.0, _ctx(steps_per_epoch=374.0, steps_per_epoch_source="x"), "epoch"),
        (500.0, _ctx(checkpoint_every=500.0, checkpoint_source="events"), "checkpoint"),
        (200.0, _ctx(eval_every=200.0), "evaluation"),
        (60.0, _ctx(steps_per_epoch=412.0, steps_per_epoch_source="x"), None),
        (1850.0, _ctx(steps_per_epoch=374.0, steps_per_epoch_source="x"), None),
        (60.0, _ctx(), None),
    ],
)
def test_a_period_names_a_mechanism_only_when_its_length_fits(period, ctx, mechanism) -> None:
    m = match_period(period, ctx)
    assert m.mechanism == mechanism
    if mechanism is None:
        assert "no known mechanism" in m.arithmetic
    else:
        assert m.arithmetic.startswith("matches")


def test_megabatch_arithmetic_and_aliases() -> None:
    assert megabatch_steps(412) == 50 and megabatch_steps(100) == 25 and megabatch_steps(3) == 1
    # a 3.125-step cycle logged every 10 steps shows as a 50-step one; a 20-step one as itself
    assert apparent_period(3.125, 10.0) == pytest.approx(50.0)
    assert apparent_period(20.0, 10.0) == 20.0
    assert apparent_period(5.0, 10.0) is None  # logged in phase: invisible


def test_steps_per_epoch_from_the_epoch_field() -> None:
    steps = np.arange(10.0, 8001.0, 10.0)
    per, starts = epochs_from_field(steps, np.round(steps / 2904.0, 2))
    assert per == pytest.approx(2904, rel=0.01)
    assert starts[:2] == pytest.approx([2900, 5810], abs=20)
    ctx = run_context(steps, {}, steps_per_epoch=1000)
    assert ctx.steps_per_epoch_source == "--steps-per-epoch" and ctx.epoch_starts[0] == 1001


def test_fold_test_is_calibrated_on_autocorrelated_noise_and_finds_short_cycles() -> None:
    rng = np.random.default_rng(0)
    false = 0
    for _ in range(40):
        x = np.zeros(80)
        e = rng.standard_normal(80)
        for i in range(1, 80):
            x[i] = 0.7 * x[i - 1] + e[i]
        false += fold_test(x - x.mean(), window=39, rng=rng, surrogates=199).p_value < 0.01
    assert false <= 2
    saw = np.tile([0.0, 0.25, 0.5, 0.75, 1.0], 8) + 0.1 * rng.standard_normal(40)
    f = fold_test(saw - saw.mean(), window=19, rng=rng)
    assert f.period == 5 and f.p_value < 0.01


def test_staircase_under_fast_decay_is_found() -> None:
    """A loss falling 100x with a step down every 400 steps: detrending keeps the steps."""
    t = np.arange(4000.0)
    loss = 5 * np.exp(-t / 870) * 0.8 ** np.floor(t / 400)
    loss *= np.exp(0.01 * np.random.default_rng(1).standard_normal(t.size))
    r = detrended(loss, 1001)
    assert abs(r).max() < 0.2  # no leftover decay
    rows = [{"step": int(s) + 1, "loss": float(v), "epoch": float(s / 400)}
            for s, v in zip(t, loss, strict=True)]
    rep = diagnose(rows)
    assert rep.epochs.found and len(rep.epochs.starts) >= 5
    assert all(-0.25 < d < -0.15 for d in rep.epochs.relative_drops)
    cause = next(c for c in rep.verdict.causes if c.name == "epoch_boundaries")
    assert "memorisation" in " ".join(cause.evidence) and rep.verdict.clean is False
    assert not rep.cliffs


def test_epoch_placebo_test_holds_its_level_on_clean_runs() -> None:
    found = 0
    for k in range(30):
        rows = simulate_clean(900, seed=k, phi=0.6, epochs=0, fall=30.0)
        s = np.array([r["step"] for r in rows], dtype=float)
        y = np.array([r["loss"] for r in rows])
        found += bool(epoch_boundaries(s, y, [301.0, 601.0], source="x",
                                       rng=np.random.default_rng(k)).found)
    assert found <= 2


def test_every_significant_bucket_effect_is_in_the_verdict() -> None:
    run = simulate_run("bucketed", steps=1500, seed=2, length_effect=0.05, noise=0.03)
    r = diagnose(run.records)
    a = r.attribution
    assert a.bucket_p_value < 0.05 and (r.bands.count or 1) == 1
    names = {c.name for c in r.verdict.causes}
    assert names & {"composition_noise", "composition_weak"}
    assert r.verdict.clean is False


def test_one_verdict_everywhere() -> None:
    records = simulate_run("sorted_megabatch", steps=1500, seed=3, megabatch=50).records
    r = diagnose(records)
    assert verdict_for(records) == r.verdict
    assert r.verdict.causes[0].claim in render_text(r)
    assert all(c.where for c in r.verdict.causes)


def test_spikes_in_early_training_are_reported_as_such() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(3000.0)
    loss = 2 + 3 * np.exp(-t / 150) + 0.02 * rng.standard_normal(t.size)
    spikes = [60, 90, 130, 170, 210, 250, 290, 2500]
    loss[spikes] += 1.0
    lr = np.minimum(1.0, (t + 1) / 30)
    r = diagnose([{"step": int(s), "loss": float(v), "lr": float(w)}
                  for s, v, w in zip(t, loss, lr, strict=True)])
    early = [c for c in r.cliffs if c.phase == "early"]
    assert len(early) >= 6 and r.phases.start > 290
    cause = next(c for c in r.verdict.causes if c.name == "loss_spikes")
    assert "in early training" in cause.claim


def test_a_regular_staircase_without_epoch_info_is_read_as_epochs() -> None:
    t = np.arange(4000.0)
    loss = 5 * np.exp(-t / 870) * 0.8 ** np.floor(t / 250)
    loss *= np.exp(0.01 * np.random.default_rng(1).standard_normal(t.size))
    r = diagnose([{"step": int(s) + 1, "loss": float(v)} for s, v in zip(t, loss, strict=True)])
    assert r.periodicity.period == 250 and r.epochs.found
    assert r.context.steps_per_epoch_source.startswith("a regular staircase")
    cause = next(c for c in r.verdict.causes if c.name == "epoch_boundaries")
    assert any("--steps-per-epoch" in f for f in cause.fix)
    # a saw-tooth of the same period rises between its drops: not a staircase
    saw = 2.0 + 0.2 * ((t % 250) / 250) + 0.01 * np.random.default_rng(2).standard_normal(t.size)
    r2 = diagnose([{"step": int(s) + 1, "loss": float(v)} for s, v in zip(t, saw, strict=True)])
    assert r2.periodicity.period is not None and r2.epochs.found is None


def test_a_smooth_cycle_without_epoch_info_is_a_periodic_component_not_epochs() -> None:
    """A sine of period 40 on a falling loss falls over half of each cycle: no staircase."""
    rng = np.random.default_rng(0)
    t = np.arange(1, 401)
    loss = (2.5 + 3 * np.exp(-t / 300) + 0.05 * rng.standard_normal(400)
            + 0.3 * np.sin(2 * np.pi * t / 40))
    r = diagnose([{"step": int(s), "loss": float(v), "lr": 3e-4}
                  for s, v in zip(t, loss, strict=True)])
    assert r.periodicity.period is not None and abs(r.periodicity.period - 40) <= 1
    assert r.context.steps_per_epoch is None and r.epochs.found is None
    names = [c.name for c in r.verdict.causes]
    assert names[0] == "periodic_unknown" and "epoch_boundaries" not in names
    assert "epoch" not in r.verdict.causes[0].claim


def test_epoch_starts_where_the_level_rises_are_not_called_step_downs() -> None:
    t = np.arange(4000.0)
    factor = np.cumprod(np.where(np.arange(10) == 4, 1.05, 0.8))[np.floor(t / 400).astype(int)]
    loss = 5 * np.exp(-t / 870) * factor / 0.8
    loss *= np.exp(0.01 * np.random.default_rng(1).standard_normal(t.size))
    r = diagnose([{"step": int(s) + 1, "loss": float(v), "epoch": float(s / 400)}
                  for s, v in zip(t, loss, strict=True)])
    assert r.epochs.found and sum(d > 0 for d in r.epochs.drops) == 1
    cause = next(c for c in r.verdict.causes if c.name == "epoch_boundaries")
    n = len(r.epochs.drops)
    assert f"at epoch starts ({n - 1} of {n} boundaries" in cause.claim
    assert "each epoch start" not in cause.claim


def test_a_periodic_component_is_not_read_as_hundreds_of_epochs() -> None:
    """A fixed 46-step data-order pattern under a fast initial descent: a period, not epochs."""
    rng = np.random.default_rng(0)
    t = np.arange(12000.0)
    wave = rng.standard_normal(46)
    loss = (3 + 40 * np.exp(-t / 600)) * np.exp(
        0.002 * wave[(t % 46).astype(int)] + 0.003 * rng.standard_normal(t.size))
    r = diagnose([{"step": int(s), "loss": float(v)} for s, v in zip(t, loss, strict=True)])
    assert r.periodicity.period is not None and abs(r.periodicity.period - 46) < 0.5
    assert not r.epochs.found and r.context.steps_per_epoch is None
    names = [c.name for c in r.verdict.causes]
    assert "periodic_unknown" in names and "epoch_boundaries" not in names


def test_epoch_step_downs_are_shown_with_their_sign() -> None:
    t = np.arange(4000.0)
    loss = 5 * np.exp(-t / 870) * 0.8 ** np.floor(t / 250)
    loss *= np.exp(0.01 * np.random.default_rng(1).standard_normal(t.size))
    r = diagnose([{"step": int(s) + 1, "loss": float(v)} for s, v in zip(t, loss, strict=True)])
    cause = next(c for c in r.verdict.causes if c.name == "epoch_boundaries")
    line = next(e for e in cause.evidence if e.startswith("level change"))
    assert "drops +" not in line and line.count("-") >= 2 * min(6, len(r.epochs.starts))
