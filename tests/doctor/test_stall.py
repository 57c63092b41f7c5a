"""A run that does not learn: "the loss has not moved since step N", first in the verdict."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lengthwise.doctor import diagnose
from lengthwise.doctor.curve import find_stall
from lengthwise.doctor.report import render_text

from simulated_logs.runs import simulate_clean


def _rows(steps: np.ndarray, loss: np.ndarray) -> list[dict[str, float]]:
    return [{"step": int(s), "loss": float(v)} for s, v in zip(steps, loss, strict=True)]


def test_a_flat_loss_is_the_first_cause() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(10, 1090, 10)
    r = diagnose(_rows(steps, 4.77 + 0.005 * rng.standard_normal(steps.size)))
    first = r.verdict.causes[0]
    assert first.name == "not_learning" and r.verdict.clean is False
    assert first.claim.startswith("the loss has not moved since step 10")
    assert r.verdict.summary.startswith("the loss has not moved since step 10")
    assert "the loss has not moved since step 10" in render_text(r)
    assert json.loads(r.to_json())["stall"]["since"] == 10


def test_a_run_that_learns_then_stops_is_dated_at_the_stop() -> None:
    rng = np.random.default_rng(1)
    steps = np.arange(1, 3001)
    level = np.where(steps < 900, 4.0 - 2.0 * steps / 900, 2.0)
    st = find_stall(steps.astype(float), level + 0.01 * rng.standard_normal(steps.size))
    assert st.since is not None and 850 <= st.since <= 1100 and st.share > 0.6


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fall", [3.0, 100.0])
def test_runs_that_learn_are_not_stalled(seed: int, fall: float) -> None:
    rows = simulate_clean(2000, seed=seed, fall=fall, epochs=seed % 3)
    r = diagnose(rows)
    assert r.stall.since is None
    assert "not_learning" not in {c.name for c in r.verdict.causes}


def test_a_short_flat_tail_is_not_a_stall() -> None:
    steps = np.arange(1.0, 1001.0)
    loss = np.where(steps < 700, 3.0 - steps / 700, 2.0)
    assert find_stall(steps, loss).since is None
