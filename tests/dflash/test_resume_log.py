"""`dflash train --resume` after a stop: the step log reads as if the run had never stopped."""

from __future__ import annotations

import json

import pytest
from _cli import TINY_TRAIN

from lengthwise.cli import main

torch = pytest.importorskip("torch")

#: fields that hold wall-clock time, different in every run
WALL_CLOCK = {"time", "seconds", "tokens_per_second", "blocking_seconds", "path"}


def _train(target, data, out, *extra):
    return main(["dflash", "train", "--target", str(target), "--data", str(data), "--out",
                 str(out), *TINY_TRAIN, "--steps", "6", "--eval-every", "2", *extra])


def _records(run) -> list[dict]:
    rows = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows
            if "event" not in r]


def test_a_stopped_and_resumed_run_logs_what_an_uninterrupted_run_logs(tiny_prepared, tmp_path,
                                                                      monkeypatch, capsys):
    from lengthwise.train.loop import TrainLoop

    target, data = tiny_prepared
    assert _train(target, data, tmp_path / "full") == 0
    step = TrainLoop.step

    def stop_after_three(self):
        if self.step_count == 3:
            raise KeyboardInterrupt  # stopped one step after the checkpoint of step 2
        return step(self)

    with monkeypatch.context() as patch:
        patch.setattr(TrainLoop, "step", stop_after_three)
        assert _train(target, data, tmp_path / "cut") == 130  # as after Ctrl-C
    assert [r["step"] for r in _records(tmp_path / "cut")] == [1, 2, 3]
    capsys.readouterr()
    assert _train(target, data, tmp_path / "cut", "--resume") == 0
    resumed, full = _records(tmp_path / "cut"), _records(tmp_path / "full")
    assert [r["step"] for r in resumed] == list(range(1, 7))
    assert resumed == full  # losses, held-out figures and the running fields alike
    assert any(r.get("eval_loss") is not None for r in resumed)
    assert all(r["bucket_loss"] for r in resumed)
    side = (tmp_path / "cut" / "train_log.rolled_back.jsonl").read_text().splitlines()
    assert [json.loads(x).get("step") for x in side] == [2, 3]  # the rolled_back line, step 3
