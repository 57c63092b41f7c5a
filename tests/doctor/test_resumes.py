"""Resumes with rollback, a second writer, and a step field that never counts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.doctor import diagnose, read_records
from lengthwise.doctor.report import render_text

from simulated_logs.events import with_resumes
from simulated_logs.runs import simulate_clean


def _restart_cause(report):
    return next(c for c in report.verdict.causes if c.name == "restarts")


def test_steps_that_go_back_with_a_restarted_schedule_are_resumes_with_rollback() -> None:
    rows = with_resumes(simulate_clean(24_000, seed=3), [(8310, 8001), (16620, 16001)])
    r = diagnose(rows)
    assert r.verdict.clean is False
    assert r.input.restart_count == 2 and r.input.duplicate_rows == 0
    first, second = r.input.restarts
    assert (first.step_before, first.step_after, first.rolled_back) == (8310, 8001, 309)
    assert (second.step_before, second.step_after) == (16620, 16001)
    assert first.gap_seconds == 601 and r.input.lr_jumped(first) and r.input.lr_jumped(second)
    cause = _restart_cause(r)
    assert "steps 8001..8310 run again" in cause.claim
    assert "the learning rate jumped at 2 of them: the schedule restarted" in cause.claim
    assert cause.fix[0].startswith("load the scheduler's state")
    points = r.to_dict()["input"]["restart_points"]
    assert points[0]["lr_jumped"] is True and points[0]["rolled_back"] == 309
    assert "2 resume(s) with rollback" in render_text(r)


def test_a_resume_that_restores_the_scheduler_says_the_schedule_resumed() -> None:
    rows = with_resumes(simulate_clean(6000, seed=4), [(3000, 2501)], restart_schedule=False)
    r = diagnose(rows)
    cause = _restart_cause(r)
    assert "schedule restarted" not in cause.claim and cause.score < 0.3
    assert any("matches the earlier run's" in e for e in cause.evidence)
    assert r.input.lr_jumped(r.input.restarts[0]) is False


def test_a_step_logged_again_after_a_pause_is_a_resume_not_a_second_writer() -> None:
    rows = [{"step": s, "loss": 2.0 - s / 1e4, "time": float(s)} for s in range(1, 401)]
    rows.insert(200, {"step": 200, "loss": 1.98, "time": 900.0})
    for row in rows[201:]:
        row["time"] += 900.0
    log = read_records(rows)
    assert log.input.restart_count == 1 and log.input.duplicate_rows == 0
    assert log.input.restarts[0].rolled_back == 0
    # without the wall time too: one step logged again, then steps that go on
    plain = read_records([{k: v for k, v in row.items() if k != "time"} for row in rows])
    assert plain.input.restart_count == 1 and plain.input.duplicate_rows == 0


def test_resumes_that_log_a_step_or_a_few_again_without_a_clock_are_not_a_second_writer() -> None:
    """No wall-time column: two resumes each log their first step again, a third a few steps."""
    base = simulate_clean(3000, seed=6)
    at = {int(r["step"]): i for i, r in enumerate(base)}
    rows = [{k: v for k, v in r.items() if k != "time"} for r in base]
    relog = [dict(rows[at[900]]), dict(rows[at[2100]])] + [dict(rows[at[s]])
                                                            for s in (1498, 1499, 1500)]
    for r in relog:
        r["loss"] = float(r["loss"]) * 1.01
    rows = (rows[: at[900] + 1] + relog[:1] + rows[at[900] + 1 : at[1500] + 1] + relog[2:]
            + rows[at[1500] + 1 : at[2100] + 1] + relog[1:2] + rows[at[2100] + 1 :])
    r = diagnose(rows)
    assert r.input.duplicate_rows == 0 and r.input.restart_count == 3
    assert [p.step_after for p in r.input.restarts] == [900, 1498, 2100]
    names = {c.name for c in r.verdict.causes}
    assert "restarts" in names and "duplicate_writer" not in names
    assert r.input.loss_rows == len(base) and np.all(np.diff(r.series.step) > 0)
    # a second writer rewrites steps all through the log
    twice = [dict(row) for row in rows[:600] for _ in range(2)]
    w = read_records(twice)
    assert w.input.duplicate_rows == 600 and w.input.restart_count == 0


def test_a_loss_spike_right_after_a_resume_is_told_with_the_resume_not_as_a_hard_batch() -> None:
    """A resume whose schedule restarted, the loss +0.9 one step later; three spikes elsewhere."""
    rows = with_resumes(simulate_clean(6000, seed=4), [(3000, 2501)])
    i = next(k for k in range(1, len(rows)) if rows[k]["step"] < rows[k - 1]["step"])
    rows[i + 1]["loss"] += 0.9
    rows[i + 2]["loss"] += 0.4
    for k in (1000, 4200, 5100):
        rows[k]["loss"] += 0.8
    r = diagnose(rows)
    assert 2502 in [c.step for c in r.cliffs] and len(r.cliffs) == 4
    spikes = next(c for c in r.verdict.causes if c.name == "loss_spikes")
    assert spikes.claim.startswith("3 one-step loss spike(s)") and "2502" not in spikes.evidence[0]
    cause = _restart_cause(r)
    assert "the schedule restarted; the loss spikes right after 1 of them (+0.92" in cause.claim
    assert any("+0.92" in e and "at step 2502, 1 step(s) after the resume at 2501" in e
               for e in cause.evidence)


def test_the_epoch_test_runs_across_resumes() -> None:
    rows = with_resumes(simulate_clean(6000, seed=5, epochs=3, epoch_drop=0.08, lr_drop=False),
                        [(3500, 3301)])
    r = diagnose(rows)
    assert r.input.restart_count == 1
    assert r.epochs.found and len(r.epochs.starts) == 2
    assert {"epoch_boundaries", "restarts"} <= {c.name for c in r.verdict.causes}


def test_rows_that_all_log_step_zero_are_read_by_row_index() -> None:
    rng = np.random.default_rng(0)
    rows = [{"step": 0, "loss": 2.0 + 0.05 * rng.standard_normal()} for _ in range(500)]
    r = diagnose(rows)
    assert r.input.constant_step == 0 and r.input.step_key == "row index"
    assert r.input.loss_rows == 500 and r.input.duplicate_rows == 0
    assert "duplicate_writer" not in {c.name for c in r.verdict.causes}
    assert "the step field is 0 on every row (no step counter): row index used" in render_text(r)


@settings(max_examples=25, deadline=None)
@given(st.integers(50, 350), st.integers(1, 40))
def test_any_rollback_keeps_the_resumed_run_in_step_order(before: int, back: int) -> None:
    rows = with_resumes(simulate_clean(400, seed=1), [(before, before - back)])
    log = read_records(rows)
    assert log.input.restart_count == 1 and log.input.duplicate_rows == 0
    assert log.input.superseded_rows == back + 1
    assert np.all(np.diff(log.step) > 0) and log.step.size == 400
    assert log.input.restarts[0].rolled_back == back


def test_a_resume_between_logged_rows_compares_the_rate_the_earlier_run_had_there() -> None:
    rows = [{"step": s, "loss": 2.0, "lr": 1e-3 * (1 - s / 1000)} for s in range(10, 601, 10)]
    resumed = [{"step": s, "loss": 2.0, "lr": 1e-3 * (1 - s / 1000)}
               for s in range(501, 1001)]  # now logged every step
    log = read_records(rows + resumed)
    r = log.input.restarts[0]
    assert (r.step_before, r.step_after) == (600, 501)
    assert abs(r.lr_before - 1e-3 * (1 - 501 / 1000)) < 1e-12
    assert log.input.lr_jumped(r) is False
