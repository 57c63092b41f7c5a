"""Step time: slow steps and their period, and the throughput after a restart."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.doctor import diagnose
from lengthwise.doctor.report import render_text

from simulated_logs.events import with_resumes
from simulated_logs.runs import simulate_clean


def _timed(rows: list[dict], *, every: int | None = None, slow: float = 8.0,
           sd: float = 0.05, seed: int = 0) -> list[dict]:
    """``rows`` with a log-normal step time in ``seconds`` and ``slow`` s more every
    ``every`` steps (a save)."""
    rng = np.random.default_rng(seed)
    for row in rows:
        row["seconds"] = float(0.5 * np.exp(sd * rng.standard_normal()))
        if every and row["step"] % every == 0:
            row["seconds"] += slow
    return rows


def test_slow_steps_at_the_save_interval_are_named_and_costed() -> None:
    rows = _timed(simulate_clean(3000, seed=1), every=250)
    r = diagnose(rows, checkpoint_every=250)
    t = r.step_time
    assert t.slow == 12 and t.period == 250 and t.matches == "the checkpoint interval"
    assert 0.05 < t.cost_share < 0.07
    cause = next(c for c in r.verdict.causes if c.name == "slow_steps")
    assert cause.claim.startswith("12 slow step(s) every 250 steps (the checkpoint interval)")
    assert cause.fix == ["save asynchronously, or less often"]
    assert "every 250 steps (the checkpoint interval)" in render_text(r)


def test_step_times_from_the_wall_time_between_rows() -> None:
    rows = simulate_clean(2000, seed=2)
    clock = 0.0
    for row in rows:
        clock += 1.0 + (30.0 if row["step"] % 400 == 0 else 0.0)
        row["time"] = clock
    t = diagnose(rows).step_time
    assert t.source == "time between rows" and t.slow == 5 and t.period == 400
    assert t.matches is None  # no save or evaluation interval known


def test_a_slower_run_after_a_restart_is_a_cause() -> None:
    rows = with_resumes(simulate_clean(4000, seed=3), [(2000, 1801)])
    for row in rows:
        row["tokens_per_second"] = 1000.0 if row["time"] < 2001 else 600.0
    r = diagnose(rows)
    assert r.step_time.after_restarts == [(1801.0, 0.6)]
    cause = next(c for c in r.verdict.causes if c.name == "slower_after_restart")
    assert "60% of the throughput before at step 1801" in cause.claim


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.01, 0.3))
def test_log_normal_step_times_have_no_slow_steps(seed: int, sd: float) -> None:
    r = diagnose(_timed(simulate_clean(1000, seed=seed), sd=sd, seed=seed))
    assert r.step_time.slow == 0
    assert not {"slow_steps", "slower_after_restart"} & {c.name for c in r.verdict.causes}


def test_without_step_times_nothing_is_tested() -> None:
    t = diagnose(simulate_clean(500)).step_time
    assert t.median_seconds is None and t.note.startswith("not tested: no step time")


def _ranked(rows: list[dict], *, slow_rank: int | None, factor: float = 1.15,
            ranks: int = 4, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    for row in rows:
        t = 0.5 * np.exp(0.05 * rng.standard_normal(ranks))
        if slow_rank is not None:
            t[slow_rank] *= factor
        row["rank_seconds"] = t.tolist()
    return rows


def test_a_rank_that_is_the_slowest_at_most_steps_is_a_straggler() -> None:
    r = diagnose(_ranked(simulate_clean(1000, seed=5), slow_rank=2))
    late = r.step_time.stragglers
    assert late.found and late.rank == 2 and late.ranks == 4 and late.slowest_share > 0.8
    assert r.step_time.source == "slowest rank_seconds"
    cause = next(c for c in r.verdict.causes if c.name == "straggler")
    assert cause.claim.startswith("rank 2 is a straggler: the slowest of 4 ranks")
    assert r.to_dict()["step_time"]["stragglers"]["found"] is True


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 16))
def test_ranks_of_equal_speed_have_no_straggler(seed: int, ranks: int) -> None:
    r = diagnose(_ranked(simulate_clean(500, seed=seed), slow_rank=None, ranks=ranks,
                         seed=seed))
    assert not r.step_time.stragglers.found
    assert r.step_time.stragglers.p_value <= 1.0
