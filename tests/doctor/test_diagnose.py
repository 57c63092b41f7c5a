"""End to end: the doctor on simulated runs whose answer is known by construction."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lengthwise.doctor import REPORT_KEYS, EmptyLogError, diagnose

from simulated_logs.runs import simulate_run

STEPS = 2500


@pytest.fixture(scope="module")
def reference():
    """The reference run's picture: single-bucket batches in random order, cliffs not at saves."""
    run = simulate_run("bucketed", steps=STEPS, seed=11, checkpoint_every=250, random_spikes=4,
                       spike_height=1.2)
    return run, diagnose(run.records)


def test_reference_run_has_three_bands_from_buckets(reference) -> None:
    run, r = reference
    assert run.labels["bands"] == 3
    assert r.bands.count == 3 and r.bands.p_value < 0.05
    assert sum(r.bands.shares) == pytest.approx(1.0)
    assert r.attribution.bucket_field == "bucket" and r.attribution.bucket_r2 > 0.7
    means = [row["mean_loss"] for row in sorted(r.attribution.per_bucket,
                                                key=lambda row: row["bucket"])]
    assert means == sorted(means, reverse=True)  # longer buckets: lower loss per token
    top = r.verdict.causes[0]
    assert top.name == "single_bucket_batches"
    assert any("--order stratified" in f for f in top.fix)
    assert r.periodicity.period is None


def test_reference_cliffs_are_not_the_checkpoints(reference) -> None:
    run, r = reference
    assert sorted(c.step for c in r.cliffs) == sorted(float(s) for s in run.labels["cliffs"])
    ck = r.checkpoint_association
    assert ck.associated is False and ck.p_value is not None and ck.p_value > 0.5
    assert ck.checkpoints == STEPS // 250 and ck.aligned == 0 and ck.source == "events"
    for c in r.cliffs:
        assert c.height > 0.7 and c.recovery_steps is not None and c.at_checkpoint is False
    assert any(c.name == "loss_spikes" for c in r.verdict.causes)
    line = r.verdict.summary
    assert line.startswith("3 loss bands") and "not explained by checkpoints" in line
    assert f"p={ck.p_value:.2g}" in line


def test_checkpoint_aligned_spikes_are_associated() -> None:
    run = simulate_run("stratified", steps=STEPS, seed=3, checkpoint_every=200,
                       checkpoint_spikes=True)
    r = diagnose(run.records)
    ck = r.checkpoint_association
    assert ck.associated is True and ck.p_value < 1e-6
    assert ck.aligned == len(r.cliffs) >= 8
    assert ck.throughput_ratio is not None and ck.throughput_ratio < 0.5  # saves stall steps
    assert r.verdict.causes[0].name == "checkpoint_disruption"
    assert any("off the training thread" in f for f in r.verdict.causes[0].fix)


def test_same_spikes_without_checkpoint_info_and_with_checkpoint_every() -> None:
    run = simulate_run("stratified", steps=STEPS, seed=3, checkpoint_every=200,
                       checkpoint_spikes=True)
    rows = [r for r in run.records if "event" not in r]
    blind = diagnose(rows)
    assert blind.checkpoint_association.associated is None
    told = diagnose(rows, checkpoint_every=200)
    assert told.checkpoint_association.associated is True
    assert told.checkpoint_association.source == "--checkpoint-every 200"


@pytest.mark.parametrize("megabatch", [12, 50])
def test_sorted_megabatches_give_the_period(megabatch: int) -> None:
    run = simulate_run("sorted_megabatch", steps=STEPS, seed=5, megabatch=megabatch)
    r = diagnose(run.records, world_size=1)
    assert r.periodicity.period == megabatch and r.periodicity.p_value < 1e-6
    assert r.periodicity.runs.z < -5  # long runs of low and of high steps
    # 50 steps is Hugging Face's mega-batch cycle for an epoch of 200+ steps; 12 matches nothing
    # on one process (on 4 it would be 50 / 4 = 12.5 steps, within 5 %)
    names = {c.name for c in r.verdict.causes}
    assert ("sorted_batches_cycle" if megabatch == 50 else "periodic_unknown") in names
    if megabatch == 12:
        cause = next(c for c in r.verdict.causes if c.name == "periodic_unknown")
        assert "unknown cause" in cause.claim and "no known mechanism" in " ".join(cause.evidence)
        told = diagnose(run.records, steps_per_epoch=48)  # min(48 // 4, 50) = 12
        assert any(c.name == "sorted_batches_cycle" for c in told.verdict.causes)


@pytest.mark.parametrize("order", ["random", "stratified"])
def test_clean_runs(order: str) -> None:
    r = diagnose(simulate_run(order, steps=STEPS, seed=21, length_effect=0.0).records)
    assert r.bands.count == 1
    assert r.periodicity.period is None
    assert r.cliffs == []
    assert r.verdict.clean
    assert r.verdict.summary.startswith("clean")


def test_unlogged_bucket_says_what_to_log() -> None:
    run = simulate_run("bucketed", steps=STEPS, seed=8, log_bucket=False)
    rows = [{k: v for k, v in r.items() if k not in ("real_tokens", "samples")}
            for r in run.records]
    r = diagnose(rows)
    assert r.bands.count == 3 and r.attribution.bucket_r2 is None
    assert r.attribution.likely_cause is not None and "composition" in r.attribution.likely_cause
    assert any("bucket" in t for t in r.attribution.to_log)
    assert r.to_dict()["attribution"]["bucket_r2"] is None


def test_nan_loss_is_a_finding_not_a_crash() -> None:
    run = simulate_run("stratified", steps=STEPS, seed=4, nan_steps=(1500, 1501))
    r = diagnose(run.records)
    assert r.stats.nonfinite.count == 2 and r.stats.nonfinite.first_steps == [1500.0, 1501.0]
    assert r.stats.nonfinite.diverged_at is None
    assert r.verdict.causes[0].name == "nonfinite_loss"
    assert np.isfinite(r.stats.loss_roughness)


def test_divergence_to_nan_ends_the_stable_region() -> None:
    run = simulate_run("stratified", steps=STEPS, seed=4, nan_steps=tuple(range(2000, 2501)))
    r = diagnose(run.records)
    assert r.stats.nonfinite.diverged_at == 2000.0
    assert r.phases.end == 1999.0
    assert "diverged" in r.verdict.causes[0].claim


def test_all_nan_is_an_error() -> None:
    with pytest.raises(EmptyLogError, match="NaN"):
        diagnose([{"step": i, "loss": math.nan} for i in range(10)])


def test_json_schema_keys_and_types(reference) -> None:
    _, r = reference
    d = json.loads(r.to_json())
    assert tuple(d) == REPORT_KEYS
    assert isinstance(d["bands"]["count"], int)
    assert d["periodicity"]["period"] is None
    assert all({"step", "height", "recovery_steps"} <= set(c) for c in d["cliffs"])
    assert d["checkpoint_association"]["associated"] is False
    assert isinstance(d["checkpoint_association"]["p_value"], float)
    assert isinstance(d["attribution"]["bucket_r2"], float)
    assert d["stable_region"]["start"] <= d["stable_region"]["end"]
    assert d["verdict"]["causes"][0]["cause"] == "single_bucket_batches"


def test_user_stable_region_and_determinism() -> None:
    run = simulate_run("bucketed", steps=1500, seed=2)
    a = diagnose(run.records, start=600, end=1400)
    assert (a.phases.start, a.phases.end, a.phases.chosen_by) == (600, 1400, "user")
    assert a.stats.points == 801
    b = diagnose(run.records, start=600, end=1400)
    assert a.to_json() == b.to_json()


def test_corrected_loss_is_smoother_when_bands_come_from_composition(reference) -> None:
    _, r = reference
    assert r.stats.corrected_roughness is not None
    assert r.stats.corrected_roughness < 0.5 * r.stats.loss_roughness


def test_length_mix_is_reported_when_it_drives_the_loss() -> None:
    r = diagnose(simulate_run("random", steps=STEPS, seed=21).records)
    assert r.attribution.length_r2 > 0.5
    assert r.verdict.clean is False and r.verdict.causes[0].name == "length_mix"


def test_short_log_is_not_called_clean() -> None:
    r = diagnose([{"step": i, "loss": 2.0 + 0.01 * (i % 3)} for i in range(20)])
    assert r.bands.count is None and "not tested" in r.bands.note
    assert r.periodicity.period is None and r.periodicity.p_value is None
    assert r.verdict.clean is None
    assert r.verdict.summary.startswith("not tested: bands, 20 points in the stable region")
    assert json.loads(r.to_json())["verdict"]["clean"] is None


def test_forty_point_sawtooth_is_found() -> None:
    rng = np.random.default_rng(3)
    loss = 2.0 * np.exp(-np.arange(40) / 30) + 0.05 * (np.arange(40) % 5) / 4
    loss += 0.005 * rng.standard_normal(40)
    r = diagnose([{"step": 10 * (i + 1), "loss": float(v)} for i, v in enumerate(loss)],
                 start=10)
    assert r.periodicity.period == 50 and r.periodicity.acf_at_period > 0.5
    assert r.verdict.clean is False
