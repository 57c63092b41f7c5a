"""The gradient norm beside the loss: co-spikes, spikes that lead, the clip rate, a trend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.cli import main
from lengthwise.doctor import diagnose
from lengthwise.doctor.report import render_text
from lengthwise.doctor.signals import SPIKE_Z, grad_norm_findings, spike_mask

from simulated_logs.events import grad_norm_log
from simulated_logs.runs import simulate_clean

GRAD_CAUSES = {"grad_norm_leads", "grad_norm_co_spikes", "grad_clipped_often",
               "grad_norm_rising"}


def _names(report) -> set[str]:
    return {c.name for c in report.verdict.causes}


def test_gradient_norm_spikes_at_the_loss_spikes_are_co_spikes() -> None:
    rows, spikes = grad_norm_log(3000, lead=0, seed=1)
    r = diagnose(rows)
    g = r.grad_norm
    assert g.co_spikes.found and g.co_spikes.aligned == len(spikes) == 6
    assert not g.lead.found and "grad_norm_co_spikes" in _names(r)
    d = r.to_dict()["grad_norm"]
    assert d["co_spikes"]["median_lag_points"] == 0 and d["spikes"] == 6
    assert "6 of 6 loss spikes with a spike at the same step" in render_text(r)


def test_gradient_norm_spikes_before_the_loss_spikes_lead_them() -> None:
    rows, _ = grad_norm_log(3000, lead=3, seed=2)
    r = diagnose(rows)
    assert r.grad_norm.lead.found and not r.grad_norm.co_spikes.found
    assert r.grad_norm.lead.to_dict()["median_lag_points"] == 3
    cause = next(c for c in r.verdict.causes if c.name == "grad_norm_leads")
    assert "by 3 logged point(s)" in cause.claim


def test_loss_spikes_without_gradient_norm_spikes_align_with_nothing() -> None:
    rows, _ = grad_norm_log(3000, lead=None, seed=3)
    r = diagnose(rows)
    assert r.grad_norm.spikes == 0 and not _names(r) & GRAD_CAUSES


def test_a_rising_gradient_norm_is_a_trend_a_flat_one_is_not() -> None:
    alone = diagnose(grad_norm_log(3000, spikes=0, lead=None, rise=3.0)[0])
    assert alone.grad_norm.rising and "grad_norm_rising" not in _names(alone)  # reported only
    rising = diagnose(grad_norm_log(3000, lead=None, rise=3.0)[0])  # with loss spikes
    assert rising.grad_norm.rising and "grad_norm_rising" in _names(rising)
    flat = diagnose(grad_norm_log(3000, spikes=0, lead=None, rise=1.0)[0])
    assert not flat.grad_norm.rising and flat.verdict.clean is True


def test_the_clip_rate_from_the_option_and_from_the_config_beside_the_log(tmp_path: Path,
                                                                           capsys) -> None:
    rows, _ = grad_norm_log(2000, spikes=0, lead=None, level=1.2)
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert diagnose(log).grad_norm.clip_rate is None
    (tmp_path / "training_args.json").write_text(json.dumps({"max_grad_norm": 1.0}))
    r = diagnose(log)
    assert r.grad_norm.clip_source == "training_args.json" and r.grad_norm.clip_rate > 0.8
    assert r.grad_norm.clipped_often and "grad_clipped_often" not in _names(r)  # context
    assert diagnose(log, clip=100.0).grad_norm.clip_rate == 0.0
    assert main(["doctor", str(log), "--clip", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "lengthwise doctor: error: --clip must be positive, got 0.0"


def test_clipping_alone_is_context_and_a_cause_only_when_the_loss_shows_it() -> None:
    """A clean curve clipped at most steps stays clean; clipped steps at the loss spikes do not."""
    rows, _ = grad_norm_log(3000, spikes=0, lead=None, level=1.2)
    r = diagnose(rows, clip=1.0)
    assert r.grad_norm.clip_rate > 0.8 and r.grad_norm.clipped_often
    assert r.verdict.clean is True and not _names(r)
    assert "context, not a cause" in render_text(r)
    rows, spikes = grad_norm_log(3000, lead=0, level=0.95, seed=1)
    r = diagnose(rows, clip=1.0)
    g = r.grad_norm
    assert 0.25 <= g.clip_rate < 0.5 and g.clipped_spikes.found
    cause = next(c for c in r.verdict.causes if c.name == "grad_clipped_often")
    assert f"{g.clipped_spikes.aligned} of {len(spikes)} loss spikes start at a clipped step" \
        in cause.claim


def test_steps_with_a_zero_gradient_norm_count_in_the_clip_rate_and_are_a_finding() -> None:
    """Batch 1: 168 of 300 logged norms are exactly 0 (no update); 117 of the others clip."""
    rng = np.random.default_rng(0)
    rows = simulate_clean(300, seed=2)
    zero = rng.permutation(300)[:168]
    g = np.where(rng.random(300) < 117 / 132, 1.5, 0.5) * np.exp(0.05 * rng.standard_normal(300))
    g[zero] = 0.0
    g[np.setdiff1d(np.arange(300), zero)] = np.r_[np.full(117, 1.5), np.full(15, 0.5)]
    for row, x in zip(rows, g, strict=True):
        row["grad_norm"] = float(x)
    r = diagnose(rows, clip=1.0)
    gn = r.grad_norm
    assert gn.logged == 300 and gn.zero_steps == 168
    assert abs(gn.clip_rate - 117 / 300) < 1e-9  # 39 %, not 117 of the 132 non-zero norms
    cause = next(c for c in r.verdict.causes if c.name == "no_update_steps")
    assert cause.claim.startswith("168 of 300 logged steps (56%) have a gradient norm of 0")
    text = render_text(r)
    assert "clipped at 39.0% of 300 logged steps" in text and "norm 0 (no update) at 168" in text
    # a few zero norms are reported, not a cause
    few = simulate_clean(300, seed=2)
    for i, row in enumerate(few):
        row["grad_norm"] = 0.0 if i % 50 == 0 else 0.5
    r = diagnose(few)
    assert r.grad_norm.zero_steps == 6 and "no_update_steps" not in _names(r)


def test_the_grad_norm_panel_is_plotted(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows, _ = grad_norm_log(1500, lead=0, seed=4)
    log = tmp_path / "g.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "g.png"
    assert main(["doctor", str(log), "--plot", str(out)]) == 0
    assert out.stat().st_size > 10_000


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.05, 0.5), st.sampled_from([300, 3000]))
def test_clean_logs_with_a_noisy_gradient_norm_show_no_gradient_finding(
        seed: int, noise: float, points: int) -> None:
    rows = simulate_clean(points, seed=seed)
    rng = np.random.default_rng(seed)
    ar = np.zeros(points)
    for i in range(1, points):  # autocorrelated log-normal noise
        ar[i] = 0.5 * ar[i - 1] + noise * rng.standard_normal()
    for row, a in zip(rows, ar, strict=True):
        row["grad_norm"] = float(0.4 * np.exp(a))
    assert not _names(diagnose(rows)) & GRAD_CAUSES


def test_spikes_are_points_far_above_the_rolling_median() -> None:
    rng = np.random.default_rng(0)
    x = 0.1 * rng.standard_normal(5000)
    assert spike_mask(x).sum() == 0  # Gaussian noise: below 3e-7 false spikes a point
    x[[100, 2000]] += 0.1 * (SPIKE_Z + 3)
    assert np.flatnonzero(spike_mask(x)).tolist() == [100, 2000]
    assert grad_norm_findings(np.arange(10.0), np.ones(10), cliffs=[], interval=1.0).note \
        .startswith("not tested: 10 points")
