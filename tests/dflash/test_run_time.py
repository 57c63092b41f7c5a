"""A DFlash run's time before it runs: the plan's work, the fitted profile, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.run_time import (
    DeviceProfile,
    StepWork,
    duration,
    fit_profile,
    predict,
)
from lengthwise.errors import ConfigError, DataError

torch = pytest.importorskip("torch")


@settings(max_examples=40, deadline=None)
@given(micro=st.floats(0.0, 0.5), per=st.floats(1e-4, 1.0),
       g=st.lists(st.floats(1.0, 1e4), min_size=3, max_size=12, unique=True))
def test_the_fit_recovers_the_per_unit_costs_of_exact_times(micro, per, g):
    g = np.array(sorted(g))
    if g.max() - g.min() <= 0.05 * g.mean():
        return  # too alike to tell the terms apart: covered below
    m = np.full(g.size, 4)
    prof = fit_profile(m, g, micro * m + per * g, device="cpu")
    assert prof.step_seconds(m, g) == pytest.approx(micro * m + per * g, rel=1e-6)
    assert prof.fit["max_relative_error"] < 1e-6


def test_alike_steps_are_priced_by_their_compute_alone():
    prof = fit_profile([2, 2, 2], [100.0, 101.0, 100.5], [2.0, 2.02, 2.01], device="cpu")
    assert prof.micro_batch == 0 and prof.per_gflop == pytest.approx(0.02, rel=1e-3)
    with pytest.raises(DataError, match="positive time"):
        fit_profile([2], [10.0], [0.0], device="cpu")


def test_the_slowest_rank_sets_each_step_and_epochs_and_evals_add_up():
    work = StepWork(micro=np.full((4, 2), 2), gflop=np.array([[10.0, 30.0], [20.0, 10.0],
                                                              [10.0, 10.0], [40.0, 0.5]]),
                    epoch=np.array([0, 0, 1, 1]))
    prof = DeviceProfile("cpu", micro_batch=0.5, per_gflop=0.1, eval_seconds=3.0,
                         start_seconds=7.0)
    t = predict(work, prof, evals=2)
    assert t.step_seconds.tolist() == [4.0, 3.0, 2.0, 5.0]
    assert t.epoch_seconds() == [4.0 + 3.0 + 3.0, 2.0 + 5.0 + 3.0]
    assert t.total_seconds == 14.0 + 6.0 + 7.0
    text = t.render()
    assert text.startswith("about 27 s for 2 epochs (4 steps: 3.5 s a step, 10 s an epoch")
    assert "2 held-out evaluations of 3.0 s" in text and "7.0 s to start" in text


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (11400, 7200, 3000, 90, 60, 12.4)] == [
        "3 h 10 min", "2 h", "50 min", "1 min 30 s", "1 min", "12 s"]


def test_a_profile_file_round_trips_and_a_bad_one_is_named(tmp_path):
    f = tmp_path / "gpu.json"
    prof = DeviceProfile("NVIDIA H200 (CUDA)", 0.01, 0.0004, eval_seconds=2.0,
                         fit={"steps": 4})
    prof.save(f)
    assert DeviceProfile.load(f) == prof
    (tmp_path / "bad.json").write_text(json.dumps({"device": "x", "micro_batch": -1,
                                                   "per_gflop": 1}))
    with pytest.raises(DataError, match="micro_batch must be a number >= 0"):
        DeviceProfile.load(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text("{}")
    with pytest.raises(DataError, match="no device, micro_batch, per_gflop"):
        DeviceProfile.load(tmp_path / "old.json")
    with pytest.raises(ConfigError, match="cannot read"):
        DeviceProfile.load(tmp_path / "none.json")


@pytest.fixture(scope="module")
def run(tiny_prepared):
    from lengthwise.cli.dflash._settings import settings as run_settings

    target, data = tiny_prepared
    return run_settings({"target": str(target), "data": str(data), "max_tokens": 256,
                         "grad_accum": 2, "draft_layers": 1, "block_size": 4,
                         "num_anchors": 4, "steps": 12, "eval_samples": 4, "eval_every": 5,
                         "device": "cpu"})


def test_the_planned_work_is_what_training_runs(run, tmp_path):
    """Each step's padded tokens in the replayed plan equal those of the real run's log,
    epochs re-planned; the FLOPs grow with them."""
    import dataclasses

    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.time_profile import evaluations, plan_work

    cfg, rs, _ = run
    rs = dataclasses.replace(rs, out=str(tmp_path / "run"))
    work, trained = plan_work(open_prepared(rs.data), cfg, rs)
    assert trained.steps == 12 and work.steps == 12 and evaluations(trained, rs) == 2
    train_draft(cfg, rs, progress=False)
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "seconds" in r and "event" not in r]
    assert [r["padded_tokens"] for r in steps] == work.tokens[:, 0].tolist()
    assert [r["epoch"] for r in steps] == work.epoch.tolist()
    assert len(set(work.epoch.tolist())) > 1  # the run spans epochs, each planned anew
    assert np.all(work.gflop > 0) and np.all(work.micro == cfg.grad_accum)


def test_more_ranks_plan_each_rank_its_share(run):
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.time_profile import plan_work

    cfg, rs, _ = run
    one, _ = plan_work(open_prepared(rs.data), cfg, rs)
    two, _ = plan_work(open_prepared(rs.data), cfg, rs, world=2)
    assert two.gflop.shape == (12, 2) and np.all(two.micro == cfg.grad_accum)
    # two ranks share an epoch's micro-batches: it takes fewer steps
    assert (two.epoch == 0).sum() < (one.epoch == 0).sum()


@pytest.mark.slow
def test_the_predicted_time_of_a_run_is_near_its_measured_time(run, tmp_path):
    """A profile timed on the run's first steps predicts the run's own steps: predicted /
    measured seconds of the steps (evaluations included) within a factor 2 on any machine
    load (the real target's table in docs/dflash.md holds the tight comparison)."""
    import dataclasses

    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.time_profile import estimate_time

    cfg, rs, _ = run
    cfg = dataclasses.replace(cfg, steps=40)
    predicted, prof = estimate_time(cfg, rs)
    assert prof.fit["steps"] == 4 and prof.per_gflop > 0
    rs = dataclasses.replace(rs, out=str(tmp_path / "run"))
    train_draft(cfg, rs, progress=False)
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    measured = sum(r["seconds"] for r in log if "seconds" in r and "event" not in r)
    ratio = (predicted.total_seconds - predicted.start_seconds) / measured
    assert 0.5 < ratio < 2.0, (ratio, predicted.to_dict(), prof.fit)


def test_the_estimate_prints_the_time_and_saves_and_reads_a_profile(run, tmp_path, capsys):
    from lengthwise.cli import main

    cfg, rs, _ = run
    common = ["dflash", "estimate", "--target", rs.target, "--data", rs.data, "--device", "cpu",
              "--max-tokens", "256", "--grad-accum", "2", "--draft-layers", "1",
              "--block-size", "4", "--num-anchors", "4", "--eval-samples", "4"]
    prof = DeviceProfile("a GPU measured elsewhere", 0.01, 0.5, eval_seconds=1.0)
    prof.save(tmp_path / "gpu.json")
    assert main([*common, "--steps", "30", "--eval-every", "10", "--time",
                 "--device-profile", str(tmp_path / "gpu.json")]) == 0
    text = capsys.readouterr().out
    assert "predicted time: about " in text and "on a GPU measured elsewhere" in text
    assert "30 steps" in text and "3 held-out evaluations of 1.0 s" in text
    assert main([*common, "--epochs", "1", "--time", "--json", "--device-profile",
                 str(tmp_path / "gpu.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["time"]["epochs"] == 1 and out["profile"]["per_gflop"] == 0.5
    assert main(["dflash", "estimate", "--target", rs.target, "--device", "cpu",
                 "--draft-layers", "1", "--max-tokens", "256", "--time"]) == 2
    assert "--time needs --data" in capsys.readouterr().err
    assert main(["dflash", "estimate", "--stage", "eval", "--target", rs.target, "--device",
                 "cpu", "--max-len", "64", "--draft-layers", "1", "--time"]) == 2
    assert "not of eval" in capsys.readouterr().err
