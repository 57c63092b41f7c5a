"""calibrate / fit_cost: exact recovery on a fake clock, robustness to noise, a real model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.planning.cost import CostModel
from lengthwise.pytorch.calibrate import DEFAULT_SHAPES, Calibration, calibrate, fit_cost


class FakeStep:
    """A step whose duration follows a known cost model, read through a fake clock."""

    def __init__(self, a, b, c, overhead=0.0, noise=0.0, first_call=0.0, spikes=0.0, seed=0):
        self.coef = (a, b, c, overhead)
        self.noise = noise
        self.spikes = spikes
        self.first_call = first_call
        self.rng = np.random.default_rng(seed)
        self.now = 0.0
        self.calls = []

    def clock(self):
        return self.now

    def __call__(self, rows, p):
        a, b, c, d = self.coef
        dt = rows * (a * p + b * p * p + c) + d
        if self.noise:
            dt *= 1 + self.rng.normal(0, self.noise)
        if self.spikes and self.rng.random() < self.spikes:
            dt *= 1 + 3 * self.rng.random()  # another process took the CPU for a while
        if (rows, p) not in self.calls:
            dt += self.first_call  # e.g. compilation on first sight of a shape
        self.calls.append((rows, p))
        self.now += dt


def test_recovers_known_coefficients_exactly():
    step = FakeStep(a=3e-6, b=2e-9, c=4e-5, overhead=1e-3, first_call=50.0)
    cal = calibrate(step, clock=step.clock, sync=lambda: None, repeats=3, warmup=1)
    assert len(step.calls) == len(DEFAULT_SHAPES) * 4
    assert cal.a == pytest.approx(3e-6, rel=1e-6)
    assert cal.b == pytest.approx(2e-9, rel=1e-6)
    assert cal.c == pytest.approx(4e-5, rel=1e-6)
    assert cal.overhead == pytest.approx(1e-3, rel=1e-6)
    assert cal.relative_error < 1e-9 and cal.max_relative_error < 1e-9
    assert cal.cost_model == CostModel(a=cal.a, b=cal.b, c=cal.c)
    assert sorted(zip(cal.rows.tolist(), cal.padded_len.tolist(), strict=True)) == sorted(
        DEFAULT_SHAPES)
    assert cal.predict(4, 256) == pytest.approx(4 * (3e-6 * 256 + 2e-9 * 256**2 + 4e-5) + 1e-3)
    tok = cal.token_cost_model()
    assert (tok.a, tok.b, tok.c) == pytest.approx((1.0, 2e-9 / 3e-6, 4e-5 / 3e-6))


def test_warmup_keeps_first_call_cost_out_of_the_fit():
    step = FakeStep(a=1e-6, b=0.0, c=1e-5, first_call=5.0)
    cal = calibrate(step, clock=step.clock, sync=lambda: None, warmup=0, repeats=1)
    assert cal.overhead > 4.0  # the first-call cost was measured
    step = FakeStep(a=1e-6, b=0.0, c=1e-5, first_call=5.0)
    cal = calibrate(step, clock=step.clock, sync=lambda: None, warmup=1, repeats=1)
    assert cal.a == pytest.approx(1e-6, rel=1e-6) and cal.max_relative_error < 1e-9
    assert cal.overhead < 1e-9


def test_noisy_times_fit_close_and_stay_non_negative():
    shapes = list(itertools.product((1, 2, 4, 8), (64, 128, 256, 512, 1024)))
    step = FakeStep(a=2e-6, b=0.0, c=3e-5, overhead=2e-4, noise=0.03, seed=1)
    cal = calibrate(step, shapes=shapes, clock=step.clock, sync=lambda: None, repeats=5,
                    reduce="median")
    assert min(cal.a, cal.b, cal.c, cal.overhead) >= 0
    assert cal.a == pytest.approx(2e-6, rel=0.05)
    assert cal.b * 1024 < 0.05 * cal.a  # no attention term invented
    assert cal.relative_error < 0.05
    CostModel(cal.a, cal.b, cal.c)  # accepted: coefficients are non-negative


def test_min_of_repeats_ignores_one_sided_delays():
    kw = {"sync": lambda: None, "repeats": 6}
    step = FakeStep(a=2e-6, b=1e-9, c=3e-5, spikes=0.3, seed=4)
    fast = calibrate(step, clock=step.clock, **kw)
    assert (fast.a, fast.b, fast.c) == pytest.approx((2e-6, 1e-9, 3e-5), rel=1e-6)
    step = FakeStep(a=2e-6, b=1e-9, c=3e-5, spikes=0.3, seed=4)
    typical = calibrate(step, clock=step.clock, reduce="median", **kw)
    assert typical.max_relative_error > 1e-3
    with pytest.raises(ValueError, match="reduce"):
        calibrate(step, clock=step.clock, reduce="mean", **kw)


@settings(max_examples=50, deadline=None)
@given(a=st.floats(0, 1e-5), b=st.floats(0, 1e-8), c=st.floats(0, 1e-4),
       d=st.floats(0, 1e-2))
def test_fit_cost_recovers_any_non_negative_model(a, b, c, d):
    if a + b + c < 1e-9:
        c = 1e-5
    r, p = map(np.array, zip(*DEFAULT_SHAPES, strict=True))
    t = r * (a * p + b * p * p + c) + d
    fit = fit_cost(r, p, t)
    assert min(fit.a, fit.b, fit.c, fit.overhead) >= 0
    assert np.allclose(fit.predict(r, p), t, rtol=1e-6)
    assert fit.max_relative_error < 1e-6


def test_fit_without_overhead():
    r, p = np.array([1, 2, 1, 4]), np.array([32, 32, 64, 128])
    fit = fit_cost(r, p, r * (2.0 * p + 0.01 * p * p + 5.0), fit_overhead=False)
    assert (fit.a, fit.b, fit.c, fit.overhead) == pytest.approx((2.0, 0.01, 5.0, 0.0))


def test_sync_is_called_around_every_timed_call():
    step = FakeStep(a=1e-6, b=1e-9, c=1e-5)
    syncs = []
    calibrate(step, clock=step.clock, sync=lambda: syncs.append(1), repeats=2, warmup=1)
    assert len(syncs) == 1 + 2 * 2 * len(DEFAULT_SHAPES)


def test_errors():
    step = FakeStep(a=1e-6, b=0, c=0)
    kw = {"clock": step.clock, "sync": lambda: None}
    with pytest.raises(ValueError, match="cannot separate"):
        calibrate(step, shapes=[(1, 32), (2, 32), (4, 32)], **kw)
    with pytest.raises(ValueError, match="two row counts"):
        calibrate(step, shapes=[(1, 32), (1, 64), (1, 128)], **kw)
    with pytest.raises(ValueError, match="pair"):
        calibrate(step, shapes=[(1, 32, 3)], **kw)
    with pytest.raises(ValueError, match="positive integers"):
        calibrate(step, shapes=[(0, 32)], **kw)
    with pytest.raises(ValueError, match="duplicates"):
        calibrate(step, shapes=[(1, 32), (1, 32)], **kw)
    with pytest.raises(ValueError, match="repeats"):
        calibrate(step, repeats=0, **kw)
    with pytest.raises(TypeError, match="callable"):
        calibrate(None)
    with pytest.raises(ValueError, match="no measurable time"):
        calibrate(lambda r, p: None, clock=lambda: 0.0, sync=lambda: None)
    with pytest.raises(ValueError, match="positive and finite"):
        fit_cost([1, 2, 3], [1, 2, 3], [1.0, -1.0, 2.0])
    flat = Calibration(0.0, 0.0, 0.0, 1.0, *[np.zeros(0)] * 3, 0.0, 0.0)
    with pytest.raises(ValueError, match="no per-row cost"):
        flat.cost_model  # noqa: B018
    with pytest.raises(ValueError, match="a = 0"):
        flat.token_cost_model()


def test_real_tiny_model_step_time():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, attn_implementation="sdpa", use_cache=False)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(rows, p):
        ids = torch.randint(0, 256, (rows, p))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    shapes = list(itertools.product((1, 2, 4), (16, 32, 64, 128)))
    cal = calibrate(step, shapes=shapes, repeats=2, warmup=1)
    assert all(math.isfinite(v) and v >= 0 for v in (cal.a, cal.b, cal.c, cal.overhead))
    assert cal.a + cal.b + cal.c > 0
    assert math.isfinite(cal.relative_error) and cal.relative_error < 1.0
    assert cal.seconds.shape == (len(shapes),) and np.all(cal.seconds > 0)
    assert "relative error" in str(cal)
    print(cal)
