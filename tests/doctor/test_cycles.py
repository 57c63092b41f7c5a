"""Multi-process cycles, cycles that restart every epoch, epoch starts at k.0, resumes, drift."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lengthwise.doctor import diagnose
from lengthwise.doctor.context import (
    apparent_period,
    epoch_resets,
    epochs_from_field,
    match_period,
    megabatch_steps,
    run_context,
)
from lengthwise.doctor.periodicity import (
    Periodicity,
    checked_periodicity,
    cycle_groups,
    distinct_groupings,
    phase_test,
)
from lengthwise.doctor.report import render_text

from simulated_logs.hf import simulate_hf_log
from simulated_logs.runs import simulate_clean


@settings(max_examples=60, deadline=None)
@given(spe=st.integers(20, 2000), every=st.sampled_from([1, 5, 10, 50]),
       decimals=st.sampled_from([2, 4, None]))
def test_epoch_starts_are_one_step_after_progress_reaches_k(spe: int, every: int,
                                                           decimals: int | None) -> None:
    assume(2 * every <= spe)  # at least two rows per epoch
    steps = np.arange(every, 6 * spe + 1, every, dtype=np.float64)
    epoch = steps / spe if decimals is None else np.round(steps / spe, decimals)
    per, starts = epochs_from_field(steps, epoch)
    assert per == pytest.approx(spe, rel=0.01)
    true = [k * spe + 1.0 for k in range(1, int(steps[-1] // spe) + 1) if k * spe < steps[-1]]
    assert len(starts) >= len(true)
    # the first row of each epoch is the first row at or after its true start; where a row
    # straddles the start and the values are rounded, the next row is as good
    rows = np.searchsorted(steps, starts[: len(true)])
    want = np.searchsorted(steps, true)
    if spe % every == 0 or decimals is None:  # rows end on epoch ends: they read exactly k.0
        assert rows.tolist() == want.tolist()
    else:
        assert np.abs(rows - want).max() <= 1


def test_a_log_that_writes_k0_exactly_has_its_staircase_found() -> None:
    # 108 steps per epoch logged every 10: rows 540, 1080, ... read exactly 5.0, 10.0, ...
    rows = simulate_hf_log(steps=3000, steps_per_epoch=108, interval=10, grouped=False,
                           epoch_drop=0.05, noise=0.03, seed=1)
    assert any(r["epoch"] == 10.0 and r["step"] == 1080 for r in rows)
    r = diagnose(rows)
    assert 1081.0 in r.context.epoch_starts and 1080.0 not in r.context.epoch_starts
    assert r.epochs.found


def test_resumes_show_as_an_epoch_field_that_falls_back() -> None:
    rows = simulate_clean(600, seed=2, epochs=1)
    for r in rows[200:]:
        r["epoch"] = round(r["epoch"] - rows[199]["epoch"], 4)  # the data pass starts over
    assert epoch_resets(np.array([r["step"] for r in rows], dtype=float),
                        np.array([r["epoch"] for r in rows])) == [201.0]
    r = diagnose(rows)
    assert r.context.epoch_resets == [201.0]
    cause = next(c for c in r.verdict.causes if c.name == "resumes")
    assert "201" in cause.where and r.input.restart_count == 0
    assert json.loads(r.to_json())["context"]["epoch_resets"] == [201]


def test_world_size_enters_the_mega_batch_arithmetic() -> None:
    assert megabatch_steps(403, 4) == 12.5 and megabatch_steps(276, 10) == 5.0
    assert apparent_period(12.5, 10.0) == 50.0 and apparent_period(5.0, 10.0) is None
    steps = np.arange(10.0, 1210.0, 10.0)
    ctx = run_context(steps, {"epoch": steps / 403}, world_size=4, world_size_source="x")
    m = match_period(50.0, ctx)
    assert m.mechanism == "megabatch" and "/ 4 = 12.5 steps" in m.arithmetic
    with pytest.raises(ValueError, match="--world-size"):
        run_context(steps, {}, world_size=0)


def test_a_four_process_cycle_aliased_by_the_logging_interval_is_found() -> None:
    # 4 processes, 403 steps per epoch: a 12.5-step cycle that rows every 10 steps see as 50
    rows = simulate_hf_log(steps=1210, steps_per_epoch=403, world_size=4, interval=10,
                           amplitude=0.4, seed=0)
    for world in (None, 4):
        r = diagnose(rows, world_size=world)
        assert r.periodicity.period == pytest.approx(50.0), world
        assert r.verdict.causes[0].name == "sorted_batches_cycle"
    assert any("/ 4 = 12.5 steps" in e and "world size 4 (--world-size)" in e
               for e in r.verdict.causes[0].evidence)


def test_ten_processes_cancel_in_the_log_and_nothing_is_reported() -> None:
    # a 5-step cycle averaged over rows of 10 steps cancels: nothing to see, nothing claimed
    rows = simulate_hf_log(steps=2600, steps_per_epoch=276, world_size=10, interval=10, seed=0)
    assert diagnose(rows, world_size=10).periodicity.period is None


def test_a_cycle_that_restarts_every_epoch_is_found_with_the_phase_reset() -> None:
    # 210 steps per epoch = 4 cycles of 50 and 10 steps: one global phase drifts by 10 each epoch
    steps = np.arange(10.0, 631.0, 10.0)
    reset = cycle_groups(steps, 50.0, [211.0, 421.0])
    assert reset[:5].tolist() == reset[21:26].tolist() == [0, 1, 2, 3, 4]
    found = [diagnose(simulate_hf_log(steps=630, steps_per_epoch=210, interval=10, seed=s))
             for s in range(3)]
    assert all(r.periodicity.period == pytest.approx(50.0) for r in found)
    assert all("reset at each epoch start" in r.periodicity.test for r in found
               if r.periodicity.test.startswith("predicted"))


def test_relabelled_groupings_count_once() -> None:
    steps = np.arange(10.0, 410.0, 10.0)
    gs = [cycle_groups(steps, length, []) for length in (50.0, 25.0, 12.5)]
    assert distinct_groupings(gs) == [0]


def test_phase_test_is_calibrated_on_ar1_noise() -> None:
    rng = np.random.default_rng(5)
    steps = np.arange(10.0, 1210.0, 10.0)
    groups = cycle_groups(steps, 12.5, [404.0, 807.0])
    groups0 = cycle_groups(steps, 25.0, [404.0, 807.0])
    hits = 0
    for _ in range(60):
        x = np.zeros(120)
        for i in range(1, 120):
            x[i] = 0.6 * x[i - 1] + rng.standard_normal()
        t, _ = phase_test(x - x.mean(), [groups, groups0], window=59, rng=rng, surrogates=199)
        hits += t.p_value < 0.05
    assert hits <= 8  # 5 % of 60 is 3; binomial tail allows a few more


def test_an_unexplained_periodogram_peak_must_pass_the_surrogate_test() -> None:
    # the same claimed 100-step peak: kept over a real 100-step cycle, dropped over drift
    rng = np.random.default_rng(11)
    n = 3000
    steps = np.arange(1.0, n + 1)
    walk = np.convolve(np.cumsum(rng.standard_normal(n)) * 0.002, np.ones(25) / 25, "same")
    drift = np.exp(0.5 + walk + 0.01 * rng.standard_normal(n))
    cycle = drift * np.exp(0.02 * (0.5 - (steps % 100) / 100))
    claim = Periodicity(period=100.0, p_value=1e-4, period_points=100.0, best_period=100.0,
                        acf=np.zeros(300))
    ctx = run_context(steps, {})
    none = np.zeros(n, dtype=bool)
    kept = checked_periodicity(claim, steps, cycle, none, ctx, np.random.default_rng(0))
    assert kept.period == 100.0 and "passes the AR(1) surrogate test" in kept.note
    dropped = checked_periodicity(claim, steps, drift, none, ctx, np.random.default_rng(0))
    assert dropped.period is None and "fails the AR(1) surrogate test" in dropped.note


def test_world_size_is_read_beside_the_log_and_the_option_wins(tmp_path, capsys) -> None:
    from lengthwise.cli import main

    rows = simulate_hf_log(steps=1210, steps_per_epoch=403, world_size=4, interval=10,
                           amplitude=0.4, seed=0)
    log = tmp_path / "trainer_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "training_args.json").write_text(json.dumps({"args": {"world_size": 4}}))
    r = diagnose(log)
    assert (r.context.world_size, r.context.world_size_source) == (4, "training_args.json")
    assert diagnose(log, world_size=2).context.world_size_source == "--world-size"
    assert main(["doctor", str(log), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["context"]["world_size"] == 4 and d["periodicity"]["period"] == 50
    assert main(["doctor", str(log), "--world-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "--world-size must be positive" in err and err.count("\n") == 1


def test_steps_per_epoch_close_to_the_epoch_field_takes_its_starts() -> None:
    steps = np.arange(10.0, 1211.0, 10.0)
    epoch = np.round(steps / 406.3, 2)  # the trainer's own record: 406.3 steps per epoch
    near = run_context(steps, {"epoch": epoch}, steps_per_epoch=403)
    assert near.steps_per_epoch == 403 and near.epoch_starts == epochs_from_field(steps, epoch)[1]
    assert near.steps_per_epoch_source == "--steps-per-epoch, starts from the epoch field"
    far = run_context(steps, {"epoch": epoch}, steps_per_epoch=300)
    assert far.epoch_starts == [301.0, 601.0, 901.0, 1201.0]


def test_a_cycle_of_a_fractional_number_of_steps_is_found_with_its_precision() -> None:
    """46.6 steps: folded at 46 or 47 it smears over 12,000 steps; at its own frequency it holds."""
    rng = np.random.default_rng(3)
    t = np.arange(12000.0)
    wave = np.sin(2 * np.pi * t / 46.6) + 0.5 * np.sin(4 * np.pi * t / 46.6 + 1.0)
    loss = (3 + 5 * np.exp(-t / 4000)) * np.exp(0.003 * wave + 0.01 * rng.standard_normal(t.size))
    r = diagnose([{"step": int(s), "loss": float(v)} for s, v in zip(t, loss, strict=True)])
    per = r.periodicity
    assert per.period is not None and per.period_error is not None
    assert abs(per.period - 46.6) <= 3 * per.period_error and per.period_error < 0.1
    assert not float(per.period).is_integer()
    assert "+/-" in render_text(r) and r.verdict.causes[0].name == "periodic_unknown"
    assert json.loads(r.to_json())["periodicity"]["period_error"] > 0


def test_the_surrogate_retest_costs_the_same_on_any_longer_log(monkeypatch) -> None:
    """An unexplained period is re-tested on the last PHASE_TEST_ROWS rows at most."""
    import lengthwise.doctor.periodicity as periodicity

    sizes: list[int] = []
    real = periodicity.phase_test

    def spy(x, groupings, **kw):
        sizes.append(x.size)
        return real(x, groupings, **kw)

    monkeypatch.setattr(periodicity, "phase_test", spy)
    monkeypatch.setattr(periodicity, "PHASE_TEST_ROWS", 1500)
    t = np.arange(6000.0)
    loss = 2.0 + 0.05 * ((t % 37) / 37) + 0.01 * np.random.default_rng(0).standard_normal(t.size)
    r = diagnose([{"step": int(s), "loss": float(v)} for s, v in zip(t, loss, strict=True)])
    assert r.periodicity.period == 37 and sizes and max(sizes) == 1500
