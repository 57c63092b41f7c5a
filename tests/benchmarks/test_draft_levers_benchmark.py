"""benchmarks/draft_levers.py: paired intervals, the combination it picks, its Markdown."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import draft_levers  # noqa: E402


def _run(loss, acc):
    per = {"chat": [0, 1, 2], "loss": loss, "accuracy": acc,
           "simulated_acceptance_length": [1 + a for a in acc],
           "expected_acceptance": [1 + a for a in acc],
           "slot_accuracy": [[a] * 3 for a in acc], "alpha": [[a] * 3 for a in acc]}
    return {"seconds": 1.0, "first_loss": 50.0, "first_grad_norm": 500.0, "last_loss": 7.0,
            "settings": {}, "per_chat": per}


def test_levers_are_paired_per_chat_and_the_helpful_ones_combined():
    res = {"setup": {"prepared": "p", "features": "f", "steps": 2, "eval_samples": 3,
                     "split_seed": 0, "eval_anchors": 4,
                     "shape": {"draft_layers": 2, "block_size": 4, "num_features": 2,
                               "max_tokens": 64}},
           "runs": {"baseline": {"0": _run([7.0, 6.0, 8.0], [0.1, 0.2, 0.1]),
                                 "1": _run([7.2, 6.1, 8.1], [0.1, 0.2, 0.1])},
                    "init_target": {"0": _run([6.0, 5.1, 7.0], [0.2, 0.2, 0.1]),
                                    "1": _run([6.1, 5.0, 7.2], [0.1, 0.3, 0.1])},
                    "zero_init_output": {"0": _run([7.5, 5.5, 8.1], [0.1, 0.2, 0.1])},
                    "standardize_features": {"0": _run([6.5, 5.5, 7.5], [0.1, 0.2, 0.1])}}}
    iv = draft_levers._paired(res, "init_target", "loss")
    assert iv["n"] == 3 and iv["seeds"] == 2 and iv["hi"] < 0
    assert abs(iv["mean"] - (-1.0 - 0.9 - 1.0 - 1.1 - 1.1 - 0.9) / 6) < 1e-9
    assert draft_levers._paired(res, "zero_init_output", "loss")["seeds"] == 1
    assert draft_levers.combined(res) == {"init": "target", "standardize_features": True}
    text = draft_levers.render_md(res)
    assert "| zero_init_output | +0.000 [+0.000, +0.000]" in text  # the same accuracies
    assert "no difference detected at this size" in text
    assert "`init=target`, `standardize_features=True`" in text


def test_data_amount_arms_train_on_nested_draws_and_a_held_out_set_is_measured_whole(
        tiny_prepared, tmp_path, monkeypatch):
    import argparse

    from lengthwise.dflash.features import FeaturesConfig, write_features
    from lengthwise.dflash.prepared import open_prepared

    target, prepared = tiny_prepared
    cache = tmp_path / "cache"
    write_features(prepared, target, cache, FeaturesConfig(num_features=2, shard_mib=1,
                                                           progress=False))
    monkeypatch.setattr(draft_levers, "SHAPE", {**draft_levers.SHAPE, "max_tokens": 256,
                                                "max_len": 200, "block_size": 4,
                                                "threads": 1})
    monkeypatch.setattr(draft_levers, "EVAL_ANCHORS", 4)
    a = argparse.Namespace(prepared=str(prepared), target=str(target), features=str(cache),
                           work=str(tmp_path / "runs"), steps=1, seeds=[0], eval_samples=2,
                           split_seed=0, arms=["baseline"], train_samples=[5],
                           heldout_prepared=str(prepared), heldout_features=str(cache),
                           json=str(tmp_path / "levers.json"))
    res = draft_levers.run(a)
    assert sorted(res["runs"]) == ["baseline", "train_samples=5"]
    every = len(open_prepared(prepared))
    for arm in res["runs"].values():  # the held-out set is measured whole, in order
        assert arm["0"]["per_chat"]["chat"] == list(range(every))
    assert res["runs"]["train_samples=5"]["0"]["train_samples"] == 5
    assert res["runs"]["baseline"]["0"]["train_samples"] == every - 2
    text = draft_levers.render_md(res)
    assert "| train_samples=5 | 1 |" in text and "measured (chats of data sets" in text
