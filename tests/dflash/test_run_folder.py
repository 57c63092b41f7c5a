"""`dflash train` and `prepare` into a folder: its lock, an earlier run there, a resume's flags."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
from _cli import TINY_TRAIN

from lengthwise.cli import main
from lengthwise.dflash.train_config import DFlashTrainConfig
from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")


def _train(target, data, out, *extra):
    return main(["dflash", "train", "--target", str(target), "--data", str(data), "--out",
                 str(out), *TINY_TRAIN, *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _steps(run) -> list[dict]:
    recs = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    return [r for r in recs if "event" not in r]


@pytest.mark.parametrize("clip", [0.0, -1.0, math.nan])
def test_a_clip_that_is_not_positive_is_refused_by_name(clip):
    with pytest.raises(ConfigError, match="clip must be > 0"):
        DFlashTrainConfig(steps=2, clip=clip)
    assert DFlashTrainConfig(steps=2, clip=math.inf).clip == math.inf  # no clipping


def test_an_earlier_run_is_refused_without_resume_and_removed_with_overwrite(
        tiny_prepared, tmp_path, capsys):
    target, data = tiny_prepared
    run = tmp_path / "run"
    assert _train(target, data, run, "--steps", "4") == 0
    old = torch.load(run / "final" / "draft.pt")
    capsys.readouterr()
    assert _train(target, data, run, "--steps", "2", "--seed", "3") == 2
    line = _one_line(capsys)
    assert "holds an earlier run (checkpoints step_2, step_4 and a final draft)" in line
    assert "--resume" in line and "--overwrite" in line
    assert _train(target, data, run, "--steps", "2", "--seed", "3", "--resume",
                  "--overwrite") == 2
    assert "not both" in _one_line(capsys)
    assert _train(target, data, run, "--steps", "2", "--seed", "3", "--overwrite") == 0
    assert "--overwrite: removed the earlier run's checkpoints step_2, step_4" in (
        capsys.readouterr().err)
    # the newest checkpoint is the new run's: export and resume take its draft
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]
    new = torch.load(run / "final" / "draft.pt")
    assert any(not torch.equal(old[k], new[k]) for k in old)
    from lengthwise.dflash.load import load_draft

    loaded = load_draft(run).state_dict()
    assert all(torch.equal(loaded[k], new[k]) for k in new)


def test_a_resume_with_no_checkpoint_is_refused_and_keeps_the_earlier_run(tiny_prepared,
                                                                           tmp_path, capsys):
    target, data = tiny_prepared
    run = tmp_path / "run"
    assert _train(target, data, run, "--steps", "2", "--checkpoint-every", "0") == 0
    (run / "train_log.rolled_back.jsonl").write_text('{"event": "rolled_back", "step": 1}\n')

    def files():
        return {p.relative_to(run): p.read_bytes() for p in run.rglob("*")
                if p.is_file() and p.name != "writer.lock"}

    before = files()
    capsys.readouterr()
    assert _train(target, data, run, "--steps", "4", "--resume") == 2
    line = _one_line(capsys)
    assert f"--resume: no complete checkpoint under {run / 'checkpoints'} to resume from" in line
    assert ("holds an earlier run (a final draft, train_log.jsonl, "
            "train_log.rolled_back.jsonl): give --overwrite") in line
    assert files() == before  # the final draft, the log and its side file as they were
    shutil.rmtree(run / "final")  # a log alone is an earlier run too
    (run / "train_log.rolled_back.jsonl").unlink()
    assert _train(target, data, run, "--steps", "4", "--resume") == 2
    assert "holds an earlier run (train_log.jsonl)" in _one_line(capsys)
    fresh = tmp_path / "fresh"  # nothing there: the resume starts the run
    assert _train(target, data, fresh, "--steps", "2", "--resume") == 0
    assert "resume: no checkpoint under" in capsys.readouterr().err
    assert [r["step"] for r in _steps(fresh)] == [1, 2]


def test_a_run_whose_loss_turns_nan_says_so_and_prints_standard_json(tiny_prepared, tmp_path,
                                                                     capsys):
    target, data = tiny_prepared
    run = tmp_path / "run"
    # a learning rate so large that the first update overflows the draft's weights
    assert _train(target, data, run, "--steps", "3", "--lr", "1e30", "--checkpoint-every",
                  "0") == 0
    out, err = capsys.readouterr()

    def refuse(constant):
        raise AssertionError(f"not standard JSON: {constant}")

    summary = json.loads(out, parse_constant=refuse)
    assert summary["loss"] is None and summary["non_finite"] == {"loss": "nan"}
    assert summary["non_finite_loss_steps"] == 2
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert "the loss was NaN or infinite at 2 of 3 steps (the first: step 2" in warning
    assert "their updates skipped" in warning and "check --lr" in warning
    assert [r["skip_reason"] for r in _steps(run)[1:]] == ["non_finite_loss"] * 2


def test_a_second_train_or_prepare_into_a_held_folder_stops_before_touching_it(
        tiny_prepared, tmp_path, capsys):
    from lengthwise.dflash.out_lock import sole_writer

    target, data = tiny_prepared
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    with sole_writer(run, "dflash train"):
        assert _train(target, data, run, "--steps", "2") == 2
        line = _one_line(capsys)
        assert f"pid {os.getpid()}" in line and str(run) in line
        # nothing deleted or written: the earlier log is there, no target/ nor draft config
        assert (run / "train_log.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'
        assert sorted(p.name for p in run.iterdir()) == ["train_log.jsonl", "writer.lock"]
        chats = data.parent / "chats.jsonl"
        assert main(["dflash", "prepare", str(chats), "--target", str(target), "--out",
                     str(run), "--no-progress"]) == 2
        assert f"pid {os.getpid()}" in _one_line(capsys)
    assert not (run / "writer.lock").exists()  # given back: the next run may start


def _first_run(tiny_prepared, run):
    target, data = tiny_prepared
    assert _train(target, data, run, "--steps", "2") == 0
    return target, data


@pytest.mark.parametrize(("flags", "named"), [
    (["--block-size", "8"], "--block-size 4 -> 8"),
    (["--draft-layers", "2"], "--draft-layers 1 -> 2"),
    (["--eval-samples", "4"], "--eval-samples 2 -> 4"),
    (["--max-tokens", "512", "--seed", "7"], "--max-tokens 256 -> 512, --seed 0 -> 7"),
])
def test_a_resume_refuses_a_changed_shape_or_data_flag_by_name(tiny_prepared, tmp_path, capsys,
                                                               flags, named):
    run = tmp_path / "run"
    target, data = _first_run(tiny_prepared, run)
    config = (run / "draft_config.json").read_text()
    capsys.readouterr()
    assert _train(target, data, run, "--steps", "4", "--resume", *flags) == 2
    line = _one_line(capsys)
    assert named in line and "step_2" in line
    assert (run / "draft_config.json").read_text() == config  # refused before any write


def test_a_checkpoint_without_recorded_settings_is_refused_naming_it(tmp_path):
    from lengthwise.dflash.model import DRAFT_CONFIG, DFlashConfig, draft_config_json
    from lengthwise.dflash.train_config import RunSettings, check_resume

    step = tmp_path / "step_2"  # as an older lengthwise wrote it: no train_settings.json
    step.mkdir()
    old = DFlashConfig(hidden_size=32, num_heads=4, num_kv_heads=2, block_size=4,
                       target_layers=[2], num_target_layers=4, mask_token_id=9)
    (step / DRAFT_CONFIG).write_text(draft_config_json(old))
    same = DFlashTrainConfig(steps=4, block_size=4, draft_layers=1, lr=1e-3)
    with pytest.raises(ConfigError) as err:
        check_resume(step, same, RunSettings(target="t", data="d"), {})
    assert str(err.value) == (f"--resume from {step}: it holds no train_settings.json: it was "
                              "written by an older lengthwise, which this version does not "
                              "resume; start a new run in another --out")


def test_a_resume_applies_a_new_learning_rate_and_says_so(tiny_prepared, tmp_path, capsys):
    run, ref = tmp_path / "run", tmp_path / "ref"
    target, data = _first_run(tiny_prepared, run)
    assert _train(target, data, ref, "--steps", "4") == 0
    capsys.readouterr()
    assert _train(target, data, run, "--steps", "4", "--resume", "--lr", "1e-3",
                  "--clip", "0.5") == 0
    err = capsys.readouterr().err
    assert "resume: applied from step 2 on: --clip 1.0 -> 0.5, --lr 0.01 -> 0.001" in err
    resumed, full = [r for r in _steps(run) if r["step"] > 2], _steps(ref)
    assert [r["step"] for r in resumed] == [3, 4]
    for r, f in zip(resumed, full[2:], strict=True):  # the same schedule, a tenth of the peak
        assert r["lr"] == pytest.approx(f["lr"] / 10, rel=1e-9)
