"""The DFlash recipe's step log: one micro-batch a step, empty steps skipped by the trainer."""

from __future__ import annotations

import math

import pytest

from lengthwise.doctor import EmptyLogError, diagnose
from lengthwise.doctor.report import render_text

from simulated_logs.events import dflash_log

SKIPPED = tuple(range(100, 3000, 300))


@pytest.fixture(scope="module")
def report():
    return diagnose(dflash_log(3000, skipped=SKIPPED))


def test_steps_skipped_empty_are_the_trainers_word_not_divergence(report) -> None:
    names = [c.name for c in report.verdict.causes]
    assert "nonfinite_loss" not in names and report.stats.nonfinite.count == 0
    cause = next(c for c in report.verdict.causes if c.name == "empty_steps")
    assert cause.claim.startswith("10 step(s) skipped by the trainer")
    assert "max_len" in cause.fix[0] and "lower the learning rate" not in str(cause)
    assert report.to_dict()["skipped_steps"] == {"count": 10, "share": round(10 / 3000, 6),
                                                 "first_steps": [100, 400, 700, 1000, 1300],
                                                 "field": "slots"}


def test_a_step_of_one_micro_batch_is_never_called_stratified(report) -> None:
    assert report.context.micro_batches == 1
    text = render_text(report)
    assert "stratified" not in text.split("verdict")[1]
    assert "each step holds one micro-batch" in report.verdict.causes[0].fix[0]


def test_a_skipped_step_that_held_tokens_keeps_its_nan_in_the_count() -> None:
    rows = dflash_log(1500)
    for row in rows[200:203]:  # the spike guard skipped them: their slots were supervised
        row.update(loss=math.nan, skipped=True)
    r = diagnose(rows)
    assert r.stats.nonfinite.count == 3 and r.skipped.count == 0
    assert "nonfinite_loss" in {c.name for c in r.verdict.causes}


def test_a_log_of_only_skipped_steps_says_so() -> None:
    rows = dflash_log(200, skipped=range(1, 201))
    with pytest.raises(EmptyLogError, match="all 200 steps were skipped by the trainer"):
        diagnose(rows)
