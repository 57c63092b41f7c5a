"""SpikeGuard on synthetic loss curves."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.train import SpikeGuard, StepLogger


def synthetic_curve(n=1500, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 2.0 + 2.0 * np.exp(-t / 400) + rng.normal(0.0, 0.05, size=n)


def test_flags_injected_spikes_and_nothing_else():
    losses = synthetic_curve()
    spikes = [200, 201, 555, 900, 1320]
    for i in spikes:
        losses[i] += 1.0  # ~20 noise standard deviations
    guard = SpikeGuard(window=100, threshold=6.0, warmup=20)
    flagged = [i for i, x in enumerate(losses) if guard.check(float(x))]
    assert flagged == spikes
    assert guard.skipped == len(spikes) and guard.checked == len(losses)


def test_moderate_excursions_pass():
    losses = synthetic_curve(seed=1)
    losses[700] += 0.15  # 3 noise standard deviations: ordinary
    guard = SpikeGuard()
    assert not any(guard.check(float(x)) for x in losses)


def test_warmup_never_skips_a_finite_loss_but_nonfinite_always_skips():
    guard = SpikeGuard(warmup=10)
    assert not any(guard.check(x) for x in [1.0, 1.0, 1.0, 100.0, 1.0])
    assert guard.check(float("nan")) and guard.check(float("inf"))
    assert (guard.skipped, guard.nonfinite) == (2, 2)


def test_low_outliers_are_not_skipped():
    guard = SpikeGuard(warmup=5)
    for x in synthetic_curve(50):
        guard.check(float(x))
    assert not guard.check(-100.0)


def test_a_lasting_change_of_level_is_accepted_after_a_while():
    guard = SpikeGuard(window=40, warmup=10)
    for x in synthetic_curve(100):
        guard.check(float(x))
    decisions = [guard.check(10.0 + 0.01 * (i % 3)) for i in range(40)]
    assert decisions[0] is True
    assert not any(decisions[25:])  # once the new level holds the window's median
    assert guard.skipped <= 21


def test_flat_loss_uses_a_relative_floor_for_the_spread():
    guard = SpikeGuard(warmup=5, min_scale=1e-3)
    for _ in range(10):
        guard.check(1.0)
    assert not guard.check(1.005)  # 5 floors: within the threshold
    assert guard.check(1.01)  # 10 floors: beyond it


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.5, 5.0), min_size=25, max_size=80),
    st.integers(-20, 20),
)
def test_decisions_do_not_depend_on_the_scale_of_the_loss(losses, exponent):
    scale = 2.0**exponent  # exact in floating point
    a, b = SpikeGuard(window=30, warmup=5), SpikeGuard(window=30, warmup=5)
    assert [a.check(x) for x in losses] == [b.check(x * scale) for x in losses]


def test_state_dict_resumes_the_same_decisions():
    losses = synthetic_curve(300, seed=3)
    losses[[150, 220]] += 1.0
    full = SpikeGuard(window=50, warmup=10)
    expected = [full.check(float(x)) for x in losses]
    first = SpikeGuard(window=50, warmup=10)
    head = [first.check(float(x)) for x in losses[:120]]
    second = SpikeGuard(window=50, warmup=10)
    second.load_state_dict(first.state_dict())
    tail = [second.check(float(x)) for x in losses[120:]]
    assert head + tail == expected and sum(expected) == 2
    assert second.skipped == full.skipped


def test_skips_go_to_the_logger(tmp_path):
    import json

    path = tmp_path / "log.jsonl"
    with StepLogger(path) as log:
        guard = SpikeGuard(warmup=5, logger=log)
        for step, x in enumerate([1.0, 1.1, 0.9, 1.0, 1.05, 1.0, 30.0, 1.0]):
            skip = guard.check(x, step=step)
            log.step(step, loss=x, skipped=skip)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    events = [x for x in lines if "event" in x]
    steps = [x for x in lines if "event" not in x]
    assert [(e["event"], e["step"], e["loss"]) for e in events] == [("spike_skip", 6, 30.0)]
    assert math.isfinite(events[0]["z"]) and events[0]["z"] > 6
    assert [s["skipped"] for s in steps].count(True) == 1 and steps[-1]["skipped_total"] == 1


def test_tensor_losses_are_accepted():
    torch = pytest.importorskip("torch")
    guard = SpikeGuard(warmup=3)
    assert not guard.check(torch.tensor(1.0, requires_grad=True))
    with pytest.raises(ValueError, match="scalar"):
        guard.check(torch.ones(2))


@pytest.mark.parametrize(
    "kwargs",
    [{"window": 2}, {"threshold": 0}, {"warmup": 2}, {"warmup": 200}, {"min_scale": -1.0}],
)
def test_bad_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        SpikeGuard(**kwargs)


def test_non_numbers_raise():
    with pytest.raises(TypeError, match="number"):
        SpikeGuard().check("1.0")
