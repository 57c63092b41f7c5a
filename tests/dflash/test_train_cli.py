"""``lengthwise dflash train``: settings from YAML and flags, and a real 2-process torchrun run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from _chat_tiny import save_target
from _cli import TINY_TRAIN, lengthwise

from lengthwise.cli.dflash.train import settings
from lengthwise.errors import ConfigError

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def prepared(tiny_prepared):
    return tiny_prepared


def test_flags_override_yaml_over_the_reference_defaults(prepared, tmp_path):
    target, data = prepared
    (tmp_path / "run.yaml").write_text(
        f"target: {target}\ndata: {data}\nlr: 6e-4\nblock-size: 8\nsteps: 50\n")
    cfg, run, progress = settings({"config": str(tmp_path / "run.yaml"), "steps": 20})
    assert (cfg.lr, cfg.block_size, cfg.steps) == (6e-4, 8, 20)
    assert (cfg.draft_layers, cfg.num_anchors, cfg.warmup_ratio, cfg.schedule, cfg.max_slots,
            cfg.max_tokens) == (5, 512, 0.04, "cosine", 32768, 16384)
    from lengthwise.dflash.prepared import open_prepared

    assert cfg.max_len == int(open_prepared(data).lengths.max())
    assert run.target == str(target) and progress


def test_epochs_set_the_steps_from_the_plan(prepared):
    import dataclasses

    import numpy as np

    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import _with_epochs
    from lengthwise.dflash.train_config import RunSettings
    from lengthwise.train.loop import make_sampler

    target, data = prepared
    cfg, run, _ = settings({"target": str(target), "data": str(data), "epochs": 2.0,
                            "max_tokens": 256, "grad_accum": 2})
    lengths = np.minimum(open_prepared(data).lengths, cfg.max_len)
    batches = sum(1 for _ in make_sampler("stratified", lengths, cfg))
    assert _with_epochs(cfg, run, lengths, 0, 1).steps == 2 * (batches // 2)
    with pytest.raises(ConfigError, match="not both"):
        settings({"target": str(target), "data": str(data), "epochs": 2.0, "steps": 3})
    with pytest.raises(ConfigError, match="epochs must be a finite number > 0"):
        RunSettings(target="t", data="d", epochs=0)
    many = dataclasses.replace(run, epochs=1e308)
    with pytest.raises(ConfigError, match="more steps than can be counted"):
        _with_epochs(cfg, many, lengths, 0, 1)


def test_bad_settings_are_named(prepared, tmp_path):
    target, data = prepared
    (tmp_path / "bad.yaml").write_text(f"target: {target}\ndata: {data}\nblok_size: 8\n")
    with pytest.raises(ConfigError, match="unknown key.*blok_size"):
        settings({"config": str(tmp_path / "bad.yaml")})
    with pytest.raises(ConfigError, match="--target is required"):
        settings({"data": str(data)})
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        settings({"config": str(tmp_path / "list.yaml")})
    with pytest.raises(ConfigError, match="order must be one of"):
        settings({"target": str(target), "data": str(data), "order": "shuffled"})
    with pytest.raises(ConfigError, match="lr must be a number"):
        settings({"target": str(target), "data": str(data), "lr": "fast"})


@pytest.mark.parametrize(("line", "message"), [
    ("resume: 'false'", "resume must be true or false, got 'false'"),
    ("wandb: 1", "wandb must be true or false, got 1"),
    ("max_tokens: [1, 2]", "max_tokens must be an integer, got [1, 2]"),
    ("steps: 2.5", "steps must be an integer, got 2.5"),
    ("lr: [0.1]", "lr must be a number, got [0.1]"),
    ("order: 3", "order must be text, got 3"),
])
def test_a_yaml_value_of_the_wrong_type_is_named(prepared, tmp_path, line, message):
    target, data = prepared
    (tmp_path / "run.yaml").write_text(f"target: {target}\ndata: {data}\n{line}\n")
    with pytest.raises(ConfigError, match=r"--config .*run\.yaml: " + re.escape(message)):
        settings({"config": str(tmp_path / "run.yaml")})


@pytest.mark.parametrize(("given", "yaml", "message"), [
    ({"lr": float("inf")}, "", "lr must be a finite number > 0, got inf"),
    ({}, "lr: .inf", "lr must be a finite number > 0, got inf"),
    ({"lr": float("nan")}, "", "lr must be a finite number > 0, got nan"),
    ({"weight_decay": float("inf")}, "", "weight_decay must be a finite number >= 0, got inf"),
    ({}, "weight_decay: -.inf", "weight_decay must be a finite number >= 0, got -inf"),
    ({"weight_decay": -0.1}, "", "weight_decay must be a finite number >= 0, got -0.1"),
    ({}, "epochs: .inf", "epochs must be a finite number > 0, got inf"),
    ({"gamma": float("inf")}, "", "gamma must be a finite number > 0"),
    ({}, "warmup_ratio: .inf", "warmup_ratio must lie in [0, 1), got inf"),
    ({"clip": float("nan")}, "", "clip must be > 0"),
])
def test_a_float_setting_that_is_not_finite_is_named_from_flags_and_yaml(prepared, tmp_path,
                                                                        given, yaml, message):
    target, data = prepared
    (tmp_path / "run.yaml").write_text(f"target: {target}\ndata: {data}\n{yaml}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings({"config": str(tmp_path / "run.yaml"), **given})


def test_an_infinite_learning_rate_on_the_command_line_stops_before_training(prepared, tmp_path,
                                                                             capsys):
    from lengthwise.cli import main

    target, data = prepared
    out = tmp_path / "run"
    assert main(["dflash", "train", "--target", str(target), "--data", str(data), "--out",
                 str(out), *TINY_TRAIN, "--steps", "2", "--lr", "inf"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "lr must be a finite number > 0, got inf" in line
    assert not out.exists()


def test_yaml_switches_take_true_or_false(prepared, tmp_path):
    target, data = prepared
    (tmp_path / "run.yaml").write_text(f"target: {target}\ndata: {data}\nresume: false\n"
                                       "progress: false\n")
    _, _, progress = settings({"config": str(tmp_path / "run.yaml")})
    assert progress is False


@pytest.mark.parametrize("flags, option", [(["--max-tokens", "2"], "--max-tokens 2"),
                                           (["--max-len", "3"], "--max-len 3")])
def test_a_budget_too_small_for_two_supervised_tokens_names_the_option(prepared, tmp_path,
                                                                       capsys, flags, option):
    from _cli import tiny_train_args

    from lengthwise.cli import main

    target, data = prepared
    out = tmp_path / "run"
    assert main([*tiny_train_args(target, data, out, "--steps", "1"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    found = re.search(rf"error: {option} is too small for two supervised tokens: every sample "
                      r"is cut to \d+ tokens .* needs (\d+) tokens: give " + option.split()[0]
                      + r" (\d+) or more$", err[0])
    assert found and found[1] == found[2], err[0]
    assert not out.exists() or not any(out.iterdir())  # refused before anything is written


def test_a_target_that_is_not_a_causal_lm_is_refused(prepared, tmp_path):
    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.train_config import RunSettings

    _, data = prepared
    bare = save_target(tmp_path / "bare", causal_lm=False)
    cfg, _, _ = settings({"target": str(bare), "data": str(data), "steps": 2})
    with pytest.raises(ConfigError, match="not a causal language model"):
        train_draft(cfg, RunSettings(target=str(bare), data=str(data)))


def test_data_from_another_tokenizer_is_refused(prepared, tmp_path):
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import train_draft
    from lengthwise.dflash.train_config import RunSettings
    from lengthwise.errors import DataError

    _, data = prepared
    top = open_prepared(data).max_token_id()
    small = tmp_path / "small"
    save_target(small)
    cfg_file = small / "config.json"
    config = json.loads(cfg_file.read_text())
    config["vocab_size"] = top  # one short of holding the largest id
    cfg_file.write_text(json.dumps(config))
    cfg, _, _ = settings({"target": str(small), "data": str(data), "steps": 2})
    with pytest.raises(DataError, match=f"token id {top} is outside the vocabulary"):
        train_draft(cfg, RunSettings(target=str(small), data=str(data)))


def _torchrun(args: list[str]) -> None:
    lengthwise("dflash", "train", *args, nproc=2)


def _steps(log: Path) -> dict[int, dict]:
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    return {r["step"]: r for r in recs if "event" not in r}


@pytest.mark.slow
def test_torchrun_two_gloo_processes_train_and_resume_exactly(prepared, tmp_path):
    target, data = prepared
    common = ["--target", str(target), "--data", str(data), "--steps", "4", "--max-tokens",
              "256", "--grad-accum", "2", "--draft-layers", "1", "--block-size", "4",
              "--num-anchors", "6", "--eval-samples", "4", "--eval-every", "2",
              "--checkpoint-every", "2", "--keep-checkpoints", "3", "--lr", "1e-2",
              "--no-progress"]
    _torchrun([*common, "--out", str(tmp_path / "full")])
    full = _steps(tmp_path / "full" / "train_log.jsonl")
    assert sorted(full) == [1, 2, 3, 4]
    assert all(full[s]["eval_accuracy"] is not None for s in (2, 4))
    assert "eval_accuracy" not in full[1] and "eval_accuracy" not in full[3]
    assert full[4]["loss"] < full[1]["loss"]
    assert (tmp_path / "full" / "final" / "draft.pt").is_file()
    # a run stopped after step 2 (only that checkpoint) and resumed gives the same steps 3-4
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_2",
                    tmp_path / "resumed" / "checkpoints" / "step_2")
    _torchrun([*common, "--out", str(tmp_path / "resumed"), "--resume"])
    resumed = _steps(tmp_path / "resumed" / "train_log.jsonl")
    assert sorted(resumed) == [3, 4]
    for s in (3, 4):
        assert resumed[s]["loss"] == full[s]["loss"]
        assert resumed[s]["accuracy"] == full[s]["accuracy"]
    assert resumed[4]["eval_loss"] == full[4]["eval_loss"]
    a = torch.load(tmp_path / "full" / "final" / "draft.pt")
    b = torch.load(tmp_path / "resumed" / "final" / "draft.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_process_truncates_long_samples_and_logs_eval_to_tensorboard(prepared, tmp_path,
                                                                        capsys):
    pytest.importorskip("tensorboard")
    from lengthwise.cli import main
    from lengthwise.dflash.prepared import open_prepared

    target, data = prepared
    longest = int(open_prepared(data).lengths.max())
    args = ["dflash", "train", "--target", str(target), "--data", str(data), "--out",
            str(tmp_path / "run"), "--steps", "2", "--max-tokens", "256", "--max-len", "48",
            "--draft-layers", "1", "--block-size", "4", "--num-anchors", "4", "--eval-samples",
            "3", "--eval-every", "2", "--checkpoint-every", "0", "--tensorboard",
            str(tmp_path / "tb"), "--no-progress"]
    assert longest > 48 and main(args) == 0
    said = capsys.readouterr()
    summary = json.loads(said.out)
    assert summary["truncated_samples"] > 0 and summary["eval"]["step"] == 2
    # the expected acceptance at T = 1 (1 - TV per block slot) lies in [1, block_size]
    assert 1.0 <= summary["eval"]["eval_expected_acceptance"] <= 4.0
    # the tokenizer had no mask token and the embedding no spare row: the grown target is saved
    grown = json.loads((tmp_path / "run" / "target" / "config.json").read_text())
    mask = summary["mask_token_id"]
    assert summary["target"] == str(tmp_path / "run" / "target")
    assert grown["vocab_size"] == mask + 1
    assert (f"mask token <|MASK|> id {mask} (added to the tokenizer); the target's embedding "
            f"and LM head grew from {mask} to {mask + 1} rows") in said.err
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/eval_accuracy" in tags and "train/loss" in tags
    assert main(["dflash", "train", "--target", str(target), "--data", str(tmp_path),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no prepare.json there" in err[0]


def test_a_target_with_spare_rows_keeps_its_size_and_serves_as_it_is(prepared, tmp_path, capsys):
    import transformers

    from lengthwise.cli import main

    _, data = prepared
    padded = save_target(tmp_path / "padded")  # then 8 spare rows, as Qwen3's 151,936 has
    model = transformers.AutoModelForCausalLM.from_pretrained(str(padded))
    rows = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(rows + 8, mean_resizing=False)
    model.save_pretrained(str(padded))
    assert main(["dflash", "train", "--target", str(padded), "--data", str(data), "--out",
                 str(tmp_path / "run"), "--steps", "1", "--max-tokens", "256",
                 "--draft-layers", "1", "--block-size", "4", "--num-anchors", "4",
                 "--eval-samples", "2", "--checkpoint-every", "0", "--no-progress"]) == 0
    said = capsys.readouterr()
    summary = json.loads(said.out)
    assert summary["mask_token_id"] == rows and summary["target"] == str(padded)
    assert not (tmp_path / "run" / "target").exists() and "grew" not in said.err
    config = json.loads((tmp_path / "run" / "draft_config.json").read_text())
    assert config["mask_token_id"] == rows and config["target_vocab_size"] == rows + 8


@pytest.mark.parametrize("stage", ["train", "estimate", "prepare", "features"])
def test_every_flag_of_a_setting_shows_its_default(stage):
    """The flags made from the settings classes: each help ends with the command's default."""
    import dataclasses

    from lengthwise.cli import build_parser
    from lengthwise.dflash.features import FeaturesConfig
    from lengthwise.dflash.prepare_config import PrepareConfig
    from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings

    classes = {"train": (DFlashTrainConfig, RunSettings), "prepare": (PrepareConfig,),
               "estimate": (DFlashTrainConfig, RunSettings, FeaturesConfig),
               "features": (FeaturesConfig,)}[stage]
    settings_with_default = {f.name for cls in classes for f in dataclasses.fields(cls)
                             if "help" in f.metadata and f.default is not dataclasses.MISSING}
    dflash = build_parser("dflash")._subparsers._group_actions[0].choices["dflash"]
    parser = dflash._subparsers._group_actions[0].choices[stage]
    helps = {a.dest: a.help for a in parser._actions if a.dest in settings_with_default}
    assert len(helps) >= 8
    for dest, text in helps.items():
        assert re.search(r"\(default: [^)]+\)$", text), (dest, text)
    if stage in ("train", "estimate"):  # the command's own defaults, not the class's
        assert helps["max_tokens"].endswith("(default: 16384)")
        assert helps["device"].endswith("(default: cpu)" if stage == "train"
                                        else "(default: cuda)")
    if stage == "train":
        assert helps["max_len"].endswith("(default: the data's longest, at most max_tokens)")
