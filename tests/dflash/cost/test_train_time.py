"""A DFlash run's time before it runs: the plan's work, the fitted profile, the CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.cost.profile import duration
from lengthwise.dflash.cost.train_time import DeviceProfile, StepWork, fit_profile, predict
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


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=3),
                                 min_size=1, max_size=3), min_size=1, max_size=6),
       capacity=st.sampled_from([None, 64]), multiple=st.sampled_from([1, 8]))
def test_micro_batches_counted_together_are_each_counted_as_alone(batches, capacity, multiple):
    from lengthwise.dflash.cost.flops import StepFlops
    from lengthwise.dflash.cost.train_time import micro_work

    f = StepFlops(1.0, 2.0, 0.5, 10.0, 3.0, 7.0, block_size=4)
    lengths = np.array([5, 17, 3, 40, 9, 12, 1, 30])
    anchors = np.array([2, 4, 0, 8, 3, 3, 0, 6])
    work, tokens = micro_work(f, lengths, anchors, batches, pad_multiple=multiple,
                              capacity=capacity)
    alone = [micro_work(f, lengths, anchors, [b], pad_multiple=multiple, capacity=capacity)
             for b in batches]
    assert work.tolist() == [float(w[0]) for w, _ in alone]
    assert tokens.tolist() == [int(t[0]) for _, t in alone]
    for b, t in zip(batches, tokens.tolist(), strict=True):
        ids = [i for row in b for i in row]
        longest = -(-max(lengths[ids]) // multiple) * multiple
        assert t == (len(b) * capacity if capacity else len(ids) * longest)


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
    with pytest.raises(DataError, match="micro_batch must be a number of seconds from 0"):
        DeviceProfile.load(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text("{}")
    with pytest.raises(DataError, match="not a training profile .no device, micro_batch, "
                                        "per_gflop"):
        DeviceProfile.load(tmp_path / "old.json")
    with pytest.raises(ConfigError, match="cannot read"):
        DeviceProfile.load(tmp_path / "none.json")


_GOOD = {"device": "cpu", "micro_batch": 0.01, "per_gflop": 0.5, "eval_seconds": 0.02}


@pytest.mark.parametrize("content, why", [
    (dict(_GOOD, micro_batch=1e308, per_gflop=1e308),
     r"micro_batch must be a number of seconds from 0 to 1e\+06, got 1e\+308"),
    (dict(_GOOD, micro_batch=True, per_gflop=True), "micro_batch must be .*, got True"),
    (dict(_GOOD, eval_seconds=10**400), "eval_seconds must be"),
    (dict(_GOOD, micro_batch=0, per_gflop=0, eval_seconds=0),
     "micro_batch and per_gflop are both 0, which prices the work at 0 s"),
    (dict(_GOOD, fit="garbage"), "fit must be a JSON object .*'garbage'"),
    (dict(_GOOD, fit={"steps": True}), "fit.steps must be a count >= 1, got True"),
    (dict(_GOOD, fit={"steps": 4, "median_relative_error": "x"}),
     "fit.median_relative_error must be a number"),
    (dict(_GOOD, device=["cpu", 1]), "device must be the name of a device"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deep"),
    (b"\xff\xfe\x00garbage", "not a text file .byte 0 is not UTF-8"),
    ('"cpu"', "a JSON object is expected, got a JSON string"),
], ids=["huge", "true", "huge-int", "zero", "fit-text", "fit-steps", "fit-error", "device",
        "nested", "binary", "string"])
def test_a_profile_file_is_checked_as_data_naming_the_field(tmp_path, content, why):
    """A device profile is refused in one line naming the file and the field: numbers of
    seconds are real (not JSON true), finite and plausible, not all 0; ``fit`` is an object;
    nesting and bytes that are not text are named too."""
    f = tmp_path / "p.json"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DataError, match=why) as got:
        DeviceProfile.load(f)
    assert str(got.value).startswith(f"--device-profile {f}: ") and "\n" not in str(got.value)


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

    from lengthwise.dflash.cost.train_time import evaluations, plan_work
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import train_draft

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


def test_a_run_on_a_feature_cache_is_priced_and_timed_without_the_target(run):
    """With --features the planned FLOPs leave out the target's forward, and the timed steps
    read the same cache."""
    import dataclasses

    from lengthwise.dflash.cost.train_time import plan_work, run_samples, train_command
    from lengthwise.dflash.prepared import open_prepared

    cfg, rs, _ = run
    cached = dataclasses.replace(rs, features="cache")
    data = open_prepared(rs.data)
    flops = run_samples(data, cfg, cached)[2]
    assert flops.target_token == flops.target_pair == 0 < flops.slot
    assert run_samples(data, cfg, rs)[2].target_token > 0
    assert np.all(plan_work(data, cfg, cached)[0].gflop < plan_work(data, cfg, rs)[0].gflop)
    argv = train_command(cfg, cached, out="o", steps=6)
    assert argv[argv.index("--features") + 1] == "cache"


def test_more_ranks_plan_each_rank_its_share(run):
    from lengthwise.dflash.cost.train_time import plan_work
    from lengthwise.dflash.prepared import open_prepared

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

    from lengthwise.dflash.cost.train_time import estimate_time
    from lengthwise.dflash.recipe import train_draft

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


def test_the_estimate_refuses_a_run_it_cannot_time_before_timing_it(run, tmp_path, capsys):
    """A folder --save-profile cannot write in, and step counts past what the plan replays
    (or infinite), are refused in one line before any step is timed or counted."""
    from lengthwise.cli import main
    from lengthwise.dflash.cost.train_time import MAX_PLANNED

    cfg, rs, _ = run
    common = ["dflash", "estimate", "--target", rs.target, "--data", rs.data, "--device", "cpu",
              "--max-tokens", "256", "--grad-accum", "2", "--draft-layers", "1",
              "--block-size", "4", "--num-anchors", "4", "--eval-samples", "4", "--time"]
    DeviceProfile("cpu", 0.01, 0.5).save(tmp_path / "p.json")
    priced = ["--device-profile", str(tmp_path / "p.json")]
    missing = tmp_path / "nope" / "p.json"
    for argv, why in [
            (["--steps", "40", "--save-profile", str(missing)],
             f"--save-profile {missing}: no folder {missing.parent} to write it in"),
            ([*priced, "--epochs", "1e12"],
             rf"--epochs 1e\+12: [\d,]+ steps at 1 rank\(s\); .* at most {MAX_PLANNED:,}"),
            ([*priced, "--steps", "1000000000"], "--steps 1000000000: 1,000,000,000 steps"),
            ([*priced, "--epochs", "inf"], "epochs must be a finite number > 0, got inf")]:
        assert main([*common, *argv]) == 2
        err = capsys.readouterr().err
        assert re.search(why, err), err
        assert len(err.strip().splitlines()) == 1 and "timing" not in err
    assert not missing.parent.exists()


def test_the_estimate_names_eval_samples_as_training_does(run, capsys):
    """Holding out as many samples as the data has is refused by the estimate with the words
    of dflash train, not as a max_len that leaves no sample."""
    from lengthwise.cli import main
    from lengthwise.dflash.prepared import open_prepared

    cfg, rs, _ = run
    n = len(open_prepared(rs.data))
    assert main(["dflash", "estimate", "--target", rs.target, "--data", rs.data, "--device",
                 "cpu", "--max-tokens", "256", "--draft-layers", "1", "--block-size", "4",
                 "--eval-samples", str(n), "--steps", "10", "--time"]) == 2
    assert (f"eval_samples ({n}) must be fewer than the {n} prepared samples"
            in capsys.readouterr().err)
