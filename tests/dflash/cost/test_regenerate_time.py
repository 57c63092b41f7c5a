"""Regeneration's time before it runs: its batches, the expected longest response, the fit,
the estimate's command line."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from _chat_tiny import conversations, save_target, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthwise.dflash.cost.regenerate_time import (
    GenerateProfile,
    attended_pairs,
    expected_longest,
    fit_generate_profile,
    plan_batches,
    predict_generate,
)
from lengthwise.errors import ConfigError, DataError

torch = pytest.importorskip("torch")


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
    from lengthwise.dflash.cost.train_time import DeviceProfile

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
    from lengthwise.dflash.cost.regenerate_time import regenerate_prompts
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
    from lengthwise.dflash.cost.regenerate_time import (
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
    from lengthwise.dflash.cost.regenerate_time import estimate_regenerate_time
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
