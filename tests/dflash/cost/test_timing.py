"""The time estimates before a run: a training run's plan, its fitted profile and the CLI;
regeneration's continuous batch replayed against the decoder's own, its fit and command line."""

from __future__ import annotations

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
    RegeneratePrompts,
    StepWork,
    decode_schedule,
    duration,
    fit_generate_profile,
    fit_profile,
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


def _tiny_lm(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=24, hidden_size=16, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=32)
    return transformers.LlamaForCausalLM(cfg).eval()


@settings(max_examples=25, deadline=None)
@given(turns=st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=3), min_size=1,
                      max_size=7),
       rows=st.integers(1, 4), cap=st.integers(1, 6), budget=st.sampled_from([None, 40, 80]),
       stops=st.sampled_from([[3], [3, 7, 11], [5, 9, 13, 17, 21]]))
def test_the_replayed_batch_runs_the_forwards_the_decoder_runs(turns, rows, cap, budget, stops):
    """The decoder's own forwards, traced, are those :func:`decode_schedule` replays from the
    prompts' lengths and the answers' lengths alone: every decode step's rows and width in
    order, and every prefill's tokens run and tokens found in the cache."""
    from lengthwise.dflash.generate import decode_conversations

    model = _tiny_lm()
    prompts: dict[int, list[list[int]]] = {c: [] for c in range(len(turns))}
    written: dict[int, list[int]] = {c: [] for c in range(len(turns))}

    def prompt(c: int, ids: list[int] | None) -> list[int] | None:
        if ids is not None:
            written[c].append(len(ids))
        t = len(prompts[c])
        if t == len(turns[c]):
            return None
        before = [] if not t else prompts[c][-1] + (ids or [])
        new = before + [(c * 5 + t * 3 + k) % 24 for k in range(turns[c][t])]
        prompts[c].append(new)
        return new

    trace: list[tuple[int, int, int, float]] = []
    list(decode_conversations(model, list(range(len(turns))), prompt, max_new_tokens=cap,
                              stops=stops, rows=rows, max_tokens=budget, trace=trace))
    work = decode_schedule([np.array([len(p) for p in prompts[c]]) for c in range(len(turns))],
                           [np.array(written[c]) for c in range(len(turns))], rows=rows,
                           max_new_tokens=cap, max_tokens=budget)
    steps = [(r, w) for kind, r, w, _ in trace if kind == 1]
    assert list(zip(work.rows.tolist(), work.width.tolist(), strict=True)) == steps
    assert sorted(zip(work.feed.tolist(), work.have.tolist(), strict=True)) == sorted(
        (f, h) for kind, f, h, _ in trace if kind == 0)
    assert all(r <= rows for r, _ in steps)


def test_the_fit_recovers_exact_costs_and_refuses_what_it_cannot_use():
    pre = [(f, h) for f, h in [(40, 0), (12, 50), (200, 0), (7, 300), (90, 20)]]
    steps = [(r, w) for r, w in [(8, 60), (8, 200), (4, 120), (2, 300), (1, 40), (6, 90)]]
    trace = [(0, f, h, 0.02 + 2e-4 * f + 3e-7 * f * (h + (f + 1) / 2)) for f, h in pre]
    trace += [(1, r, w, 0.03 + 0.004 * r + 2e-6 * r * w) for r, w in steps]
    prof = fit_generate_profile(trace, device="cpu", responses=[5, 64], max_new_tokens=64)
    assert [prof.per_prefill, prof.per_prefill_token, prof.per_prefill_pair] == pytest.approx(
        [0.02, 2e-4, 3e-7], rel=1e-6)
    assert [prof.per_step, prof.per_row, prof.per_row_width] == pytest.approx(
        [0.03, 0.004, 2e-6], rel=1e-6)
    assert prof.fit["forwards"] == 11 and prof.fit["steps_max_relative_error"] < 1e-6
    with pytest.raises(DataError, match="positive time"):
        fit_generate_profile([(1, 2, 10, 0.0)], device="cpu", responses=[3], max_new_tokens=8)
    with pytest.raises(DataError, match="kind 0 or 1"):
        fit_generate_profile([(2, 2, 10, 1.0)], device="cpu", responses=[3], max_new_tokens=8)


def _prompts(lengths: list[list[int]], shard_rows: int) -> RegeneratePrompts:
    return RegeneratePrompts([np.array(x) for x in lengths],
                             [np.zeros(len(x), dtype=np.int64) for x in lengths],
                             np.arange(len(lengths)) // shard_rows, 0.0)


def test_ranks_take_shards_in_turn_and_a_longer_cap_than_timed_is_refused():
    prompts = _prompts([[10], [10], [10], [10]], shard_rows=1)  # four shards of one turn
    prof = GenerateProfile("cpu", 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, responses=[4], max_new_tokens=8)
    t = predict_generate(prompts, prof, rows=2, world=3)
    assert t.shard_seconds.tolist() == [3.0] * 4  # 4 tokens: 3 steps after the prefill
    assert t.rank_seconds().tolist() == [6.0, 3.0, 3.0]  # shards 0 and 3 on rank 0
    assert t.generate_seconds == 6.0 and t.cut_share == 0.0 and t.responses == 4
    # the parts are the slowest rank's: two shards of one prefill and 3 decode steps each
    assert "on each of 3 ranks (the slowest rank: 2 prefills" in t.render()
    assert (t.steps, t.decode_seconds) == (6, 6.0)
    assert predict_generate(prompts, prof, rows=2, max_new_tokens=3).steps == 4 * 2
    cut = GenerateProfile("cpu", 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, responses=[4, 8],
                          max_new_tokens=8)
    with pytest.raises(ConfigError, match="50 % reached it"):
        predict_generate(prompts, cut, rows=2, max_new_tokens=16)


def test_later_prompts_hold_the_targets_answers_not_the_datas():
    """A later turn's prompt holds the drawn answer of the turn before, not the data's; and a
    row prefills only what its cache lacks."""
    prompts = RegeneratePrompts([np.array([9, 500])], [np.array([0, 480])], np.array([0]), 0.0)
    prof = GenerateProfile("cpu", 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, responses=[6], max_new_tokens=8)
    t = predict_generate(prompts, prof, rows=1)
    assert t.longest_prompt == 500 - 480 + 5  # the answer without its stop token
    # 9 prompt tokens, then the second prompt past the 9 + 6 - 1 tokens its row holds
    assert t.prefill_seconds == 9 + (25 - 14) and t.steps == 2 * 5


def test_a_profile_file_round_trips_and_a_training_or_bad_one_is_named(tmp_path):
    prof = GenerateProfile("NVIDIA H200 (CUDA)", 1e-3, 1e-6, 1e-10, 0.01, 1e-4, 1e-9,
                           [12, 40], 64, start_seconds=30.0, fit={"forwards": 4})
    prof.save(tmp_path / "g.json")
    assert GenerateProfile.load(tmp_path / "g.json") == prof
    DeviceProfile("cpu", 0.1, 0.02).save(tmp_path / "train.json")
    with pytest.raises(DataError, match="not a regeneration profile"):
        GenerateProfile.load(tmp_path / "train.json")
    good = prof.to_dict()
    for change, why in [({"per_step": True}, "per_step must be a number of seconds"),
                        ({"per_row_width": 1e308}, "per_row_width must be a number of seconds"),
                        (dict.fromkeys(GenerateProfile.priced, 0.0), "are all 0"),
                        ({"responses": [True, 12]}, "responses must be a list of lengths"),
                        ({"responses": [12, 65]}, r"from 1 to max_new_tokens \(64\)"),
                        ({"max_new_tokens": True}, "max_new_tokens must be a count"),
                        ({"fit": ["forwards", 4]}, "fit must be a JSON object"),
                        ({"fit": {"forwards": True}}, "fit.forwards must be a count")]:
        (tmp_path / "bad.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(DataError, match=why):
            GenerateProfile.load(tmp_path / "bad.json")


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    root = tmp_path_factory.mktemp("regen_time")
    target = save_target(root / "target")
    rows = [*conversations(14), {"messages": [{"role": "user", "content": "the cat"}]}]
    return target, write_jsonl(root / "c.jsonl", rows), rows


def test_the_prompts_priced_are_those_regeneration_renders(chats):
    """Each conversation's first prompt as the decoder receives it, its later ones with the
    data's answers (what the prediction replaces), and its shard."""
    from lengthwise.dflash.chat import ChatRenderer
    from lengthwise.dflash.cost.timing import regenerate_prompts
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.target import load_tokenizer

    target, src, rows = chats
    renderer = ChatRenderer(load_tokenizer(target))
    cfg = PrepareConfig(regenerate=True, shard_rows=8, progress=False)
    prompts = regenerate_prompts(src, renderer, cfg, show=False)
    assert prompts.shard.tolist() == [0] * 8 + [1] * 7
    for row, lens, answered in zip(rows, prompts.lengths, prompts.answered, strict=True):
        msgs = row["messages"]
        turns = [j for j, m in enumerate(msgs) if m["role"] == "assistant"] or [len(msgs)]
        assert lens.size == len(turns) and answered[0] == 0
        assert lens[0] == len(renderer.prompt_ids(msgs[:turns[0]]))


def test_the_estimate_times_a_regeneration_and_prints_it(chats, tmp_path, capsys, monkeypatch):
    from lengthwise.cli import main
    from lengthwise.dflash.cost import resident

    target, src, _ = chats
    set_as = []
    monkeypatch.setattr(resident, "follow_live_tensors", set_as.append)
    common = ["dflash", "estimate", "--stage", "regenerate", "--target", str(target),
              "--device", "cpu", "--batch-size", "3", "--max-new-tokens", "6"]
    assert main([*common, "--data", str(src), "--time", "--profile-steps", "4",
                 "--save-profile", str(tmp_path / "g.json")]) == 0
    out = capsys.readouterr().out
    assert set_as == ["cpu"]  # the malloc set as regeneration's
    assert "predicted time of regeneration: about " in out and "22 responses" in out
    assert "fitted on the regeneration of 4 conversations" in out
    prof = GenerateProfile.load(tmp_path / "g.json")
    assert prof.fit["conversations"] == 4 and prof.fit["steps"] >= 5
    assert len(prof.responses) >= 4 and all(1 <= n <= 6 for n in prof.responses)
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


@pytest.mark.slow
def test_the_predicted_regeneration_is_near_its_measured_time(chats, tmp_path):
    """A profile timed on a few of the run's conversations predicts ``dflash prepare
    --regenerate``'s work within a factor 2 on any machine load (the real target's table in
    docs/dflash.md holds the tight comparison)."""
    from lengthwise.dflash.cost.timing import PROFILE_CONVERSATIONS, estimate_regenerate_time
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    target, _, rows = chats
    src = write_jsonl(tmp_path / "more.jsonl", rows * 6)
    cfg = PrepareConfig(regenerate=True, max_new_tokens=24, min_supervised=2, batch_size=4,
                        progress=False)
    predicted, prof, prompts = estimate_regenerate_time(src, target, cfg, show=False)
    assert prof.fit["conversations"] == PROFILE_CONVERSATIONS
    rec = prepare_chats(src, target, tmp_path / "p", cfg)
    ratio = (predicted.generate_seconds + prompts.seconds) / rec["shard_seconds"]
    assert 0.5 < ratio < 2.0, (ratio, predicted.to_dict(), prof.fit)
