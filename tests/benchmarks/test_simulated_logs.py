"""The simulated training logs (``benchmarks/simulated_logs``) carry what they claim to carry."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from lengthwise.doctor import read_log

from simulated_logs.runs import ORDERS, labelled_set, population_bands, simulate_run


def test_rows_have_the_step_logger_fields() -> None:
    run = simulate_run("bucketed", steps=300, seed=0, checkpoint_every=100)
    rows = [r for r in run.records if "event" not in r]
    assert [r["step"] for r in rows] == list(range(1, 301))
    for key in ("epoch", "loss", "lr", "grad_norm", "real_tokens", "padded_tokens",
                "tokens_per_second", "samples", "bucket", "corrected_loss"):
        assert key in rows[0]
    events = [r for r in run.records if "event" in r]
    assert [(e["event"], e["step"]) for e in events][:2] == [("checkpoint_begin", 100),
                                                            ("checkpoint_end", 100)]
    assert all(r["padded_tokens"] >= r["real_tokens"] for r in rows)


def test_spikes_and_labels() -> None:
    run = simulate_run("stratified", steps=2000, seed=1, checkpoint_every=200,
                       random_spikes=5)
    spikes = run.labels["cliffs"]
    assert len(spikes) == 5 and run.labels["checkpoint_associated"] is False
    assert all(min(abs(s - c) for c in range(200, 2001, 200)) >= 25 for s in spikes)
    loss = np.array([r["loss"] for r in run.records if "event" not in r])
    for s in spikes:
        assert loss[s - 1] - np.median(loss[s - 30 : s - 5]) > 0.5
    ck = simulate_run("stratified", steps=1000, seed=1, checkpoint_every=100,
                      checkpoint_spikes=True)
    assert ck.labels["cliffs"] == list(range(101, 1001, 100))
    assert ck.labels["checkpoint_associated"] is True


def test_band_labels_follow_the_composition() -> None:
    assert simulate_run("bucketed", steps=200, seed=0).labels["bands"] == 3
    assert simulate_run("bucketed", steps=200, seed=0, length_effect=0.0).labels["bands"] == 1
    for order in ("random", "stratified"):
        assert simulate_run(order, steps=200, seed=0).labels["bands"] == 1
    rng = np.random.default_rng(0)
    two = np.concatenate([rng.normal(0, 0.01, 5000), rng.normal(1, 0.01, 5000)])
    assert population_bands(two, 0.02) == 2 and population_bands(two, 1.0) == 1


def test_write_jsonl_and_gzip_round_trip(tmp_path: Path) -> None:
    run = simulate_run("random", steps=150, seed=2, nan_steps=(20,))
    plain = run.write(tmp_path / "a.jsonl")
    packed = run.write(tmp_path / "a.jsonl.gz")
    assert json.loads(gzip.decompress(packed.read_bytes()).splitlines()[0])["step"] == 1
    a, b = read_log(plain), read_log(packed)
    assert np.array_equal(a.step, b.step) and np.isnan(a.loss[19]) and np.isnan(b.loss[19])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown order"):
        simulate_run("shuffled")
    with pytest.raises(ValueError, match="at least 100"):
        simulate_run("random", steps=10)
    assert set(ORDERS) == {"random", "bucketed", "stratified", "sorted_megabatch"}


def test_labelled_set_covers_every_order() -> None:
    runs = labelled_set(steps=200)
    orders = {run.config["order"] for _, run in runs}
    assert orders == set(ORDERS) and len(runs) == 48
