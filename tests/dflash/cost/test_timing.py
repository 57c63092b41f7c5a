"""The time estimates before a run: a training run's plan, its fitted profile and the CLI;
regeneration's batches, the expected longest response, its fit and command line."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
from _chat_tiny import conversations, save_target, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.cost.timing import (
    DeviceProfile,
    GenerateProfile,
    StepWork,
    attended_pairs,
    duration,
    expected_longest,
    fit_generate_profile,
    fit_profile,
    plan_batches,
    predict,
    predict_generate,
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


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=3),
                                 min_size=1, max_size=3), min_size=1, max_size=6),
       capacity=st.sampled_from([None, 64]), multiple=st.sampled_from([1, 8]))
def test_micro_batches_counted_together_are_each_counted_as_alone(batches, capacity, multiple):
    from lengthwise.dflash.cost.flops import StepFlops
    from lengthwise.dflash.cost.timing import micro_work

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

    from lengthwise.dflash.cost.timing import evaluations, plan_work
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

    from lengthwise.dflash.cost.timing import plan_work, run_samples, train_command
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
    from lengthwise.dflash.cost.timing import plan_work
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

    from lengthwise.dflash.cost.timing import estimate_time
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
    from lengthwise.dflash.cost.timing import MAX_PLANNED

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


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(1, 9), min_size=1, max_size=5),
       rows=st.integers(1, 3), cap=st.integers(1, 9))
def test_the_expected_longest_is_the_mean_over_every_draw(values, rows, cap):
    draws = itertools.product(values, repeat=rows)
    brute = np.mean([min(max(d), cap) for d in draws])
    assert expected_longest(values, [rows], cap)[0] == pytest.approx(brute, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.lists(st.integers(1, 300), min_size=0, max_size=30), min_size=1,
                     max_size=3),
       batch=st.integers(1, 8), shard_rows=st.integers(1, 12))
def test_the_batches_hold_every_prompt_once_within_the_batch_size(lens, batch, shard_rows):
    rounds = [np.array(x, dtype=np.int64) for x in lens]
    shards = [np.arange(x.size) // shard_rows for x in rounds]
    plan = plan_batches(rounds, batch_size=batch, shards=shards)
    assert int(plan.rows.sum()) == sum(x.size for x in rounds)
    assert np.all((plan.rows >= 1) & (plan.rows <= batch))
    for r, (x, s) in enumerate(zip(rounds, shards, strict=True)):
        for k in np.unique(s):
            mine = (plan.round == r) & (plan.shard == k)
            assert plan.rows[mine].sum() == (s == k).sum()
            assert plan.width[mine].max() == x[s == k].max()  # the longest sets a width
    assert np.all(np.diff(plan.shard) >= 0)  # a shard's rounds run before the next shard


def test_the_fit_recovers_exact_costs_and_refuses_what_it_cannot_use():
    rows = np.array([8, 8, 4, 8, 2])
    width = np.array([40, 200, 120, 80, 300])
    steps = np.array([64, 17, 40, 64, 9])
    secs = (2e-4 * rows * width + 0.03 * steps + 0.004 * rows * steps
            + 3e-8 * attended_pairs(rows, width, steps))
    prof = fit_generate_profile(rows, width, steps, secs, device="cpu", responses=[5, 64],
                                max_new_tokens=64)
    assert prof.batch_seconds(rows, width, steps) == pytest.approx(secs, rel=1e-6)
    assert prof.fit["max_relative_error"] < 1e-6
    with pytest.raises(DataError, match="positive time"):
        fit_generate_profile([2], [10], [3], [0.0], device="cpu", responses=[3],
                             max_new_tokens=8)


def test_ranks_take_shards_in_turn_and_a_longer_cap_than_timed_is_refused():
    plan = plan_batches([np.array([10, 10, 10, 10])], batch_size=1,
                        shards=[np.array([0, 1, 2, 2])])
    prof = GenerateProfile("cpu", 0.0, 1.0, 0.0, 0.0, responses=[4], max_new_tokens=8)
    t = predict_generate(plan, prof, world=2)
    assert t.rank_seconds().tolist() == [12.0, 4.0]  # shards 0 and 2 on rank 0
    assert t.generate_seconds == 12.0 and t.cut_share == 0.0
    assert "on each of 2 ranks" in t.render()
    assert predict_generate(plan, prof, max_new_tokens=3).batch_seconds.tolist() == [3.0] * 4
    cut = GenerateProfile("cpu", 0.0, 1.0, 0.0, 0.0, responses=[4, 8], max_new_tokens=8)
    with pytest.raises(ConfigError, match="50 % reached it"):
        predict_generate(plan, cut, max_new_tokens=16)


def test_a_profile_file_round_trips_and_a_training_or_bad_one_is_named(tmp_path):
    prof = GenerateProfile("NVIDIA H200 (CUDA)", 1e-6, 0.01, 1e-4, 1e-9, [12, 40], 64,
                           start_seconds=30.0, fit={"batches": 4})
    prof.save(tmp_path / "g.json")
    assert GenerateProfile.load(tmp_path / "g.json") == prof
    DeviceProfile("cpu", 0.1, 0.02).save(tmp_path / "train.json")
    with pytest.raises(DataError, match="not a regeneration profile"):
        GenerateProfile.load(tmp_path / "train.json")
    good = prof.to_dict()
    for change, why in [({"per_step": True}, "per_step must be a number of seconds"),
                        ({"per_pair": 1e308}, "per_pair must be a number of seconds from 0"),
                        (dict.fromkeys(("per_prefill_token", "per_step", "per_row_step",
                                        "per_pair"), 0.0),
                         "per_prefill_token, per_step, per_row_step and per_pair are all 0"),
                        ({"responses": [True, 12]}, "responses must be a list of lengths"),
                        ({"responses": [12, 65]}, r"from 1 to max_new_tokens \(64\)"),
                        ({"max_new_tokens": True}, "max_new_tokens must be a count"),
                        ({"fit": ["batches", 4]}, "fit must be a JSON object"),
                        ({"fit": {"batches": True}}, "fit.batches must be a count")]:
        (tmp_path / "bad.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(DataError, match=why):
            GenerateProfile.load(tmp_path / "bad.json")


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    root = tmp_path_factory.mktemp("regen_time")
    target = save_target(root / "target")
    rows = [*conversations(14), {"messages": [{"role": "user", "content": "the cat"}]}]
    return target, write_jsonl(root / "c.jsonl", rows), rows


def test_the_planned_batches_are_those_regeneration_runs(chats, tmp_path, monkeypatch):
    """Every generate call of ``dflash prepare --regenerate`` round by round (2 shards, 2
    rounds; the vLLM backend's way) is a planned batch: the same rows in the same order,
    and in the first round the same widths."""
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.cost.timing import regenerate_prompts
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.regenerate import TurnGenerator
    from lengthwise.dflash.target import load_tokenizer

    target, src, rows = chats
    calls = []
    real = TurnGenerator._generate

    def record(self, prompts, seed):
        calls.append((len(prompts), max(p.size for p in prompts)))
        return real(self, prompts, seed)

    monkeypatch.setattr(TurnGenerator, "_generate", record)
    monkeypatch.setattr(TurnGenerator, "_conversations", TurnGenerator._rounds)
    cfg = PrepareConfig(regenerate=True, max_new_tokens=4, min_supervised=2, batch_size=3,
                        max_tokens=120, shard_rows=8, progress=False)
    rec = prepare_chats(src, target, tmp_path / "p", cfg)
    assert rec["shard_seconds"] > 0
    prompts = regenerate_prompts(src, ChatRenderer(load_tokenizer(target)), cfg, show=False)
    plan = prompts.batches(cfg)
    assert 1 in plan.rows and 3 in plan.rows  # cut by the token budget and by the row cap
    assert plan.round.max() == 1 and plan.shard.max() == 1
    assert [c[0] for c in calls] == plan.rows.tolist()
    first = plan.round == 0
    assert [c[1] for c, f in zip(calls, first, strict=True) if f] == plan.width[first].tolist()
    assert plan.rows.sum() == rec["counts"]["regenerated_turns"]


def test_the_estimate_times_batches_and_prints_the_regeneration(chats, tmp_path, capsys):
    from lengthwise.cli import main

    target, src, _ = chats
    common = ["dflash", "estimate", "--stage", "regenerate", "--target", str(target),
              "--device", "cpu", "--batch-size", "3", "--max-new-tokens", "6"]
    assert main([*common, "--data", str(src), "--time", "--profile-steps", "3",
                 "--save-profile", str(tmp_path / "g.json")]) == 0
    out = capsys.readouterr().out
    assert "predicted time of regeneration: about " in out
    assert "fitted on 3 timed batches" in out and "22 responses in" in out
    prof = GenerateProfile.load(tmp_path / "g.json")
    assert prof.fit["batches"] == 3 and len(prof.responses) >= 3
    assert all(1 <= n <= 6 for n in prof.responses)
    assert main([*common, "--data", str(src), "--time", "--json", "--world", "2",
                 "--device-profile", str(tmp_path / "g.json")]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["time"]["world"] == 2 and got["time"]["responses"] == 14 + 7 + 1
    assert got["profile"]["responses"] == prof.responses
    assert got["settings"]["max_len"] > 0  # the longest prompt of --data, rendered
    for argv, why in [(["--time"], "--time needs --data"),
                      (["--max-len", "64", "--world", "2"], "--world goes with --time"),
                      (["--max-len", "64", "--device-profile", str(tmp_path / "g.json")],
                       "goes with --time"),
                      (["--data", str(src), "--time", "--max-new-tokens", "64",
                        "--device-profile", str(tmp_path / "g.json")], "are not known")]:
        assert main([*common, *argv]) == 2
        assert why in capsys.readouterr().err



def test_a_later_rounds_timed_batch_is_no_wider_than_the_targets_answers_allow(chats, tmp_path,
                                                                              monkeypatch):
    """The data's earlier answer (hundreds of tokens) is not what a later round's prompt
    holds: the target's answer, at most --max-new-tokens. The timed batches hold it cut,
    and run in a process whose malloc is set as regeneration's."""
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.cost import resident
    from lengthwise.dflash.cost.timing import (
        measure_generate_profile,
        regenerate_prompts,
    )
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.target import load_tokenizer

    target, _, _ = chats
    long = " ".join(["the dog ran over the hill and"] * 40)
    rows = [{"messages": [{"role": "user", "content": f"question {i}"},
                          {"role": "assistant", "content": long},
                          {"role": "user", "content": "and then?"}]} for i in range(4)]
    src = write_jsonl(tmp_path / "long.jsonl", rows)
    cfg = PrepareConfig(regenerate=True, max_new_tokens=4, batch_size=4, progress=False)
    renderer = ChatRenderer(load_tokenizer(target))
    prompts = regenerate_prompts(src, renderer, cfg, show=False)
    data_width = int(prompts.lengths[1].max())
    bound = int(prompts.with_answers(cfg.max_new_tokens).lengths[1].max())
    assert data_width > bound + 100
    set_as = []
    monkeypatch.setattr(resident, "follow_live_tensors", set_as.append)
    prof = measure_generate_profile(src, target, cfg, prompts=prompts, batches=2,
                                    renderer=renderer)
    assert set_as == ["cpu"]
    assert max(prof.fit["width"]) <= bound + 1  # + 1: a cut may re-tokenise its last piece
    assert min(prof.fit["width"]) == int(prompts.lengths[0].max())  # round 0 as it is

@pytest.mark.slow
def test_the_predicted_regeneration_is_near_its_measured_time(chats, tmp_path):
    """A profile timed on a few of the run's batches predicts ``dflash prepare
    --regenerate``'s work within a factor 2 on any machine load (the real target's table in
    docs/dflash.md holds the tight comparison)."""
    from lengthwise.dflash.cost.timing import estimate_regenerate_time
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    target, _, rows = chats
    src = write_jsonl(tmp_path / "more.jsonl", rows * 6)
    cfg = PrepareConfig(regenerate=True, max_new_tokens=24, min_supervised=2, batch_size=4,
                        progress=False)
    predicted, prof, prompts = estimate_regenerate_time(src, target, cfg, show=False)
    assert prof.fit["batches"] == 5
    rec = prepare_chats(src, target, tmp_path / "p", cfg)
    ratio = (predicted.generate_seconds + prompts.seconds) / rec["shard_seconds"]
    assert 0.5 < ratio < 2.0, (ratio, predicted.to_dict(), prof.fit)
