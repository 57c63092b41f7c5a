"""The logged learning rate against the schedule configured beside the log."""

from __future__ import annotations

import json
from pathlib import Path

from lengthwise.doctor import diagnose

from simulated_logs.runs import simulate_clean


def _log(tmp_path: Path, args: dict) -> Path:
    rows = simulate_clean(2000, seed=1)  # warm-up over the first 100 steps to a peak of 3e-4
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "training_args.json").write_text(json.dumps(args))
    return log


def test_a_schedule_as_configured_is_no_cause(tmp_path: Path) -> None:
    r = diagnose(_log(tmp_path, {"learning_rate": 3e-4, "warmup_steps": 100}))
    assert r.schedule.mismatches == [] and r.schedule.source == "training_args.json"
    assert "schedule_not_as_configured" not in {c.name for c in r.verdict.causes}


def test_a_peak_and_a_warm_up_not_as_configured_are_a_cause(tmp_path: Path) -> None:
    r = diagnose(_log(tmp_path, {"learning_rate": 1e-3, "warmup_ratio": 0.25,
                                 "max_steps": 2000}))
    assert r.schedule.warmup == 500 and r.schedule.logged_warmup < 110
    cause = next(c for c in r.verdict.causes if c.name == "schedule_not_as_configured")
    assert cause.claim == (f"the learning rate peaks at {r.schedule.logged_peak:.3g}, the "
                           "configuration says 0.001; "
                           f"the warm-up ends at step {r.schedule.logged_warmup:g}, the "
                           "configuration says 500 steps")


def test_without_a_configuration_the_schedule_is_not_tested() -> None:
    assert diagnose(simulate_clean(500)).schedule.note.startswith("not tested")
