"""The held-out loss against the training loss, and learning-rate restarts that are not warm-up."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.doctor import diagnose, read_records
from lengthwise.doctor.context import lr_restarts
from lengthwise.doctor.report import render_text

from simulated_logs.events import with_evals
from simulated_logs.runs import simulate_clean


def test_a_held_out_loss_that_stops_falling_widens_the_gap() -> None:
    rows = simulate_clean(4000, seed=1, phi=0.5, lr_drop=False)
    r = diagnose(with_evals(rows, 250, flat_from=1500))
    e = r.eval_gap
    assert e.evals == 16 and e.widening and 1250 <= e.widens_from <= 1750
    assert not e.eval_rising and "eval_overfitting" not in {c.name for c in r.verdict.causes}
    assert (f"widens from step {e.widens_from:g} (the held-out loss still falls: not "
            "over-fitting)") in render_text(r)
    assert r.to_dict()["eval_gap"]["widening"] is True


def test_a_held_out_loss_in_the_step_rows_that_rises_is_over_fitting() -> None:
    rows = simulate_clean(4000, seed=2, phi=0.5, lr_drop=False)
    r = diagnose(with_evals(rows, 200, flat_from=2000, rise=0.2, inline=True))
    assert r.eval_gap.widening and r.eval_gap.eval_rising
    assert 1800 <= r.eval_gap.eval_min_step <= 2200
    cause = next(c for c in r.verdict.causes if c.name == "eval_overfitting")
    assert cause.claim.startswith(f"over-fitting: the held-out loss rises from step "
                                  f"{r.eval_gap.eval_min_step:g}")


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.floats(-0.05, 0.2))
def test_a_held_out_loss_that_follows_the_training_loss_never_widens(seed: int,
                                                                      offset: float) -> None:
    r = diagnose(with_evals(simulate_clean(2000, seed=seed, phi=0.5), 100, offset=offset,
                            seed=seed))
    assert not r.eval_gap.widening and not r.eval_gap.eval_rising
    assert "eval_overfitting" not in {c.name for c in r.verdict.causes}


def test_a_held_out_loss_below_the_training_loss_has_not_pulled_away() -> None:
    r = diagnose(with_evals(simulate_clean(3000, seed=3, phi=0.5), 150, offset=-0.5,
                            flat_from=1000))
    e = r.eval_gap
    assert e.last_gap < 0 and e.last_gap - e.min_gap > 0.2 and not e.widening


def test_evaluation_rows_are_read_beside_the_loss_rows() -> None:
    rows = with_evals(simulate_clean(300, seed=4), 100)
    log = read_records(rows)
    assert log.evals[:, 0].tolist() == [100, 200, 300] and log.step.size == 300
    r = diagnose(rows)
    assert r.eval_gap.note == "not tested: 3 evaluations inside the training log (need 4)"
    assert diagnose(simulate_clean(300)).eval_gap.note.startswith("not tested: no held-out")


def test_a_warm_up_logged_every_few_steps_is_not_a_learning_rate_restart() -> None:
    s = np.arange(10.0, 1001.0, 10.0)
    lr = np.minimum(1.0, s / 30.0) * np.cos(np.pi * s / 2200)
    assert lr_restarts(s, lr) == []
    cyclic = np.concatenate([lr[:50], lr[:50]])  # the schedule starts over at step 510
    assert lr_restarts(s, cyclic) == [520.0]  # its warm-up's first rise, once


def test_the_held_out_losses_are_plotted(tmp_path) -> None:
    import pytest

    pytest.importorskip("matplotlib")
    from lengthwise.doctor.plot import plot_reports

    r = diagnose(with_evals(simulate_clean(2000, seed=6), 100, flat_from=1000))
    assert r.series.evals.shape == (20, 2)
    out = plot_reports({"evals": r}, tmp_path / "e.png")
    assert out.stat().st_size > 10_000
