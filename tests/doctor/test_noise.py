"""The noise budget end to end: StepLogger's per-sample losses -> the doctor's ``noise``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lengthwise.doctor import diagnose
from lengthwise.train import StepLogger

from simulated_logs.runs import simulate_run


def test_sample_losses_give_the_token_weighted_std_over_the_whole_step() -> None:
    log = StepLogger(None)
    a, wa = np.array([1.0, 2.0, 4.0]), np.array([10, 20, 30])
    b, wb = torch.tensor([3.0, 0.5]), [5, 15]
    log.record_micro(loss=2.0, real_tokens=wa, sample_losses=a)
    log.record_micro(loss=1.0, real_tokens=wb, sample_losses=b)
    rec = log.step(0)
    x = np.concatenate([a, b.numpy()])
    w = np.concatenate([wa, wb]).astype(float)
    mean = np.average(x, weights=w)
    neff = w.sum() ** 2 / (w * w).sum()
    var = np.average((x - mean) ** 2, weights=w) / (1 - 1 / neff)
    assert rec["real_tokens"] == 80
    assert rec["loss_sample_std"] == pytest.approx(np.sqrt(var))
    assert rec["loss_sample_neff"] == pytest.approx(neff)
    log.record_micro(loss=1.0, real_tokens=4)
    assert "loss_sample_std" not in log.step(1)  # no micro-batch gave per-sample losses
    log.close()


def test_equal_weights_without_per_sample_tokens() -> None:
    log = StepLogger(None)
    log.record_micro(loss=2.0, real_tokens=10, samples=4, sample_losses=[1.0, 2.0, 3.0, 4.0])
    rec = log.step(0)
    assert rec["loss_sample_std"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert rec["loss_sample_neff"] == pytest.approx(4.0)
    log.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_losses": 2.0}, "1-D"),
        ({"sample_losses": [1.0, 2.0], "real_tokens": [1, 2, 3]}, "one per sample"),
        ({"sample_losses": [1.0], "real_tokens": [1, -2]}, "real_tokens"),
    ],
)
def test_bad_sample_losses_are_refused(kwargs: dict, message: str) -> None:
    log = StepLogger(None)
    with pytest.raises(ValueError, match=message):
        log.record_micro(loss=1.0, **kwargs)
    log.close()


def test_logged_pure_sampling_noise_is_all_sampling(tmp_path) -> None:
    """Steps whose loss is the mean of 32 iid sample losses: the budget says ~100% sampling."""
    rng = np.random.default_rng(0)
    path = tmp_path / "log.jsonl"
    with StepLogger(path) as log:
        for step in range(1500):
            level = 2.0 + 1.5 * np.exp(-step / 300)
            tokens = rng.integers(50, 400, 32)
            losses = level + 0.6 * rng.standard_normal(32)
            log.record_micro(loss=float(np.average(losses, weights=tokens)), real_tokens=tokens,
                             samples=32, sample_losses=losses)
            log.step(step)
    r = diagnose(path)
    assert r.noise.shares["sampling"] == pytest.approx(1.0, abs=0.1)
    assert r.noise.excess == pytest.approx(1.0, abs=0.1)
    assert sum(r.noise.shares.values()) == pytest.approx(1.0)
    assert "sampling noise" in r.noise.summary
    assert json.loads(r.to_json())["noise"]["shares"]["sampling"] > 0.9


@pytest.mark.parametrize(
    ("order", "length_effect", "sample_std"),
    [("bucketed", 0.3, 0.5), ("random", 0.0, 0.5), ("random", 0.3, 0.3), ("bucketed", 0.0, 0.3)],
)
def test_noise_shares_match_the_simulation_within_a_tenth(order, length_effect, sample_std):
    run = simulate_run(order, steps=2500, seed=4, length_effect=length_effect,
                       sample_std=sample_std)
    shares = diagnose(run.records).noise.shares
    for key, truth in run.labels["noise_shares"].items():
        assert shares[key] == pytest.approx(truth, abs=0.1), key


def test_without_sample_std_the_budget_says_what_it_cannot_separate() -> None:
    r = diagnose(simulate_run("bucketed", steps=1500, seed=1).records)
    assert r.noise is not None and r.noise.shares is None and r.noise.excess is None
    assert "cannot be separated" in r.noise.summary
