"""`lengthwise dflash export` and `eval` on a local Qwen3-shaped target with a chat tokenizer."""

from __future__ import annotations

import json

import pytest

from lengthwise.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CHATML = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)


def _tokenizer():
    """A byte-level BPE trained here on the bundled prompts, with ChatML tokens, no mask token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from lengthwise.dflash.chat import bundled_prompts

    lines = bundled_prompts().read_text().splitlines()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines * 3, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A target folder (the mask token added to its tokenizer and embedding) and a draft."""
    from lengthwise.dflash import DFlashConfig, DFlashDraft
    from lengthwise.dflash.export import export_draft
    from lengthwise.dflash.mask_token import ensure_mask_token

    root = tmp_path_factory.mktemp("local")
    tok = _tokenizer()
    cfg = transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=512,
        eos_token_id=tok.eos_token_id, rope_theta=1e6, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg)
    vocab = len(tok)
    mask = ensure_mask_token(tok, model)
    assert (mask.id, mask.token, mask.added, mask.resized) == (vocab, "<|MASK|>", True, True)
    assert model.get_input_embeddings().weight.shape[0] == vocab + 1
    assert tok.convert_ids_to_tokens(mask.id) == "<|MASK|>"
    assert ensure_mask_token(tok, model) == mask.__class__(mask.id, "<|MASK|>", False, False)
    model.save_pretrained(str(root / "target"))
    tok.save_pretrained(str(root / "target"))
    dcfg = DFlashConfig.from_target(model.config, num_layers=1, block_size=4, num_features=2,
                                    mask_token_id=mask.id)
    torch.manual_seed(1)
    export_draft(DFlashDraft(dcfg), root / "draft")
    return root


def test_eval_reports_each_set_and_temperature_and_is_lossless(local, tmp_path, capsys):
    from lengthwise.dflash.chat import bundled_prompts

    other = tmp_path / "math.jsonl"
    other.write_text('{"prompt": "What is 7 times 8?"}\n{"prompt": "Is 91 a prime number?"}\n')
    code = main(["dflash", "eval", "--target", str(local / "target"), "--draft",
                 str(local / "draft"), "--prompts", str(bundled_prompts()), str(other),
                 "--max-new-tokens", "10", "--batch-size", "3", "--limit", "4", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["set"], r["temperature"], r["prompts"]) for r in rows] == [
        ("dflash_prompts", 0.0, 4), ("dflash_prompts", 1.0, 4), ("math", 0.0, 2),
        ("math", 1.0, 2)]
    for r in rows:
        assert 1.0 <= r["acceptance_length"] <= 4.0 and r["verify_forwards"] >= 1
        lo, hi = r["acceptance_interval"]
        assert lo <= r["acceptance_length"] <= hi and r["interval"] == "95% Student-t over prompts"
        assert len(r["conditional_acceptance"]) == 3 and len(r["alpha"]) == 3
        assert 1.0 <= r["expected_acceptance"] <= 4.0
        assert r["baseline"] == "prompt lookup, 3 tokens from 2-grams (transformers generate)"
        assert 1.0 <= r["baseline_acceptance_length"] <= 4.0
        assert (r["block_size"], r["dtype"], r["thinking"]) == (4, "float32", "off")
        assert r["template"].startswith(f"chat template of {local / 'target'} (sha256 ")
        assert r["engine"].startswith("lengthwise speculative_batch (transformers ")
        if r["temperature"] == 0:
            assert r["mismatches"] == 0 == r["baseline_mismatches"]  # the greedy output
            assert 0.0 <= r["draft_accuracy"] <= 1.0 and len(r["slot_accuracy"]) == 3
        else:
            assert "mismatches" not in r and "baseline_mismatches" not in r


def test_prompts_past_the_target_s_positions_are_counted_in_a_warning(local, tmp_path, capsys):
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 7 times 8?"}) + "\n"
                       + json.dumps({"prompt": " ".join(["seven times eight"] * 200)}) + "\n")
    base = ["dflash", "eval", "--target", str(local / "target"), "--draft",
            str(local / "draft"), "--prompts", str(prompts), "--temperatures", "0",
            "--no-check", "--no-accuracy", "--no-progress", "--json"]
    assert main([*base, "--max-new-tokens", "4"]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)[0]["prompts"] == 2
    warnings = [line for line in said.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith(
        "lengthwise dflash eval: warning: 1 of 2 prompts of long with their --max-new-tokens 4 "
        "are longer than the target's 512 positions (max_position_embeddings; the longest has ")
    assert main([*base, "--max-new-tokens", "4", "--limit", "1"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_eval_skips_the_check_and_the_accuracy_pass_on_request(local, capsys):
    base = ["dflash", "eval", "--target", str(local / "target"), "--draft",
            str(local / "draft"), "--max-new-tokens", "6", "--limit", "3", "--temperatures",
            "0", "--json"]
    assert main([*base, "--no-check"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert "mismatches" not in row and 0.0 <= row["draft_accuracy"] <= 1.0
    assert main([*base, "--no-check", "--no-accuracy", "--no-progress", "--no-baseline"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert "mismatches" not in row and "draft_accuracy" not in row
    assert "expected_acceptance" not in row and "baseline" not in row
    assert row["acceptance_length"] >= 1.0 and row["prompts"] == 3
    assert main([*base, "--no-accuracy"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["mismatches"] == 0 and "slot_accuracy" not in row


def test_prompt_files_of_one_name_are_two_sets_named_by_their_folders(local, tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello there"}\n{"prompt": "name a colour"}\n'
                                      '{"prompt": "what is two plus two"}\n')
    (tmp_path / "sub" / "p.jsonl").write_text('{"prompt": "and cats"}\n')
    base = ["dflash", "eval", "--target", str(local / "target"), "--draft",
            str(local / "draft"), "--temperatures", "0", "--max-new-tokens", "2", "--no-check",
            "--no-accuracy", "--no-baseline", "--no-progress", "--json", "--prompts"]
    assert main([*base, str(tmp_path / "p.jsonl"), str(tmp_path / "sub" / "p.jsonl")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["set"], r["prompts"]) for r in rows] == [(f"{tmp_path.name}/p", 3), ("sub/p", 1)]
    assert main([*base, str(tmp_path / "p.jsonl"), str(tmp_path / "sub" / ".." / "p.jsonl")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"lengthwise dflash: error: --prompts: {tmp_path / 'p.jsonl'} and "
        f"{tmp_path / 'sub' / '..' / 'p.jsonl'} are the same file; give each prompt set once"]


def test_eval_shows_progress_of_each_pass(local, capsys):
    base = ["dflash", "eval", "--target", str(local / "target"), "--draft",
            str(local / "draft"), "--max-new-tokens", "4", "--limit", "2", "--temperatures",
            "0"]
    assert main(base) == 0
    err = capsys.readouterr().err
    assert all(what in err for what in ("decoding", "lossless check", "draft accuracy"))
    assert "Loading weights" not in err  # the command's own bars only, not transformers'
    assert main([*base, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "decoding" not in err and "Loading weights" not in err


def test_eval_json_is_strict_json_when_a_figure_is_undefined(local, capsys):
    """One new token a prompt: no verification, so no acceptance length: null, never NaN."""
    def refuse(name):
        raise AssertionError(f"{name} in the JSON output")

    assert main(["dflash", "eval", "--target", str(local / "target"), "--draft",
                 str(local / "draft"), "--max-new-tokens", "1", "--limit", "2", "--json",
                 "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out, parse_constant=refuse)
    for r in rows:
        assert r["acceptance_length"] is None and r["verify_forwards"] == 0
        assert r["acceptance_prompts"] == 0 and r["conditional_acceptance"] == [None] * 3
        assert r["expected_acceptance"] == 1.0 and r["alpha"] == [None] * 3


def test_eval_table_names_what_the_figures_depend_on(local, capsys):
    assert main(["dflash", "eval", "--target", str(local / "target"), "--draft",
                 str(local / "draft"), "--max-new-tokens", "6", "--limit", "3",
                 "--temperatures", "0", "--no-progress", "--lookup-tokens", "2",
                 "--thinking", "on"]) == 0
    first, head, row = capsys.readouterr().out.strip().splitlines()
    assert first.startswith(f"template: chat template of {local / 'target'} (sha256 ")
    assert " | thinking: on | block_size: 4 | engine: lengthwise speculative_batch " in first
    assert first.endswith(" | dtype: float32")
    assert head.split(" | ")[4:7] == ["acceptance length", "expected", "prompt lookup"]
    cells = row.split(" | ")
    assert cells[4].count("[") == 1 and cells[6].count("[") == 1  # each with its interval
    assert len(cells[-1].split()) == 3  # conditional acceptance of block positions 1-3


def test_eval_help_describes_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["dflash", "eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--max-new-tokens N tokens generated per prompt at most" in out
    assert "--no-accuracy skip the draft's teacher-forced accuracy" in out
    assert "--max-tokens N token budget of a batch of the accuracy pass, as in training" in out
    assert "--max-slots N draft slots (anchors x block size) per draft forward" in out


def test_eval_and_export_refuse_bad_input_in_one_line(local, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"messages": [{"role": "robot", "content": "x"}]}\n')
    base = ["dflash", "eval", "--target", str(local / "target"), "--draft", str(local / "draft")]
    assert main([*base, "--prompts", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("bad.jsonl, line 2: messages[0].role must be one of system, user, "
                        "assistant, tool, got 'robot'") and "\n" not in err
    assert main([*base, "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens must be >= 1" in capsys.readouterr().err
    assert main([*base, "--max-slots", "3", "--no-progress"]) == 2  # the draft's block is 4
    assert "max_slots=3 holds no block of block_size=4" in capsys.readouterr().err
    assert main(["dflash", "eval", "--target", str(tmp_path), "--draft",
                 str(local / "draft")]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["dflash", "export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "no such run or checkpoint folder" in capsys.readouterr().err


@pytest.mark.parametrize("gone", ["model.safetensors", "config.json"])
def test_eval_names_the_file_a_draft_folder_lacks(local, tmp_path, capsys, gone):
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(local / "draft", draft)
    (draft / gone).unlink()
    assert main(["dflash", "eval", "--target", str(local / "target"), "--draft", str(draft),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"lengthwise dflash: error: {draft}: not a draft: missing {gone} (a draft folder holds "
        "config.json and model.safetensors, as `dflash export` writes, or config.json and "
        "draft.pt, as `dflash train` writes under final/)"]


def test_export_command_writes_the_reference_layout(local, tmp_path, capsys):
    from _dflash_run import config, train

    from lengthwise.dflash.load import load_exported

    train(config(steps=2, checkpoint_every=2), tmp_path / "run")
    assert main(["dflash", "export", str(tmp_path / "run"), str(tmp_path / "out"),
                 "--dtype", "bfloat16"]) == 0
    said = capsys.readouterr().out
    assert "block 4, mask token 39, target layers [1, 2] of 4" in said and "bfloat16" in said
    draft = load_exported(tmp_path / "out")
    assert draft.fc.weight.dtype == torch.bfloat16 and draft.config.target_vocab_size == 40
    # the run's target is a 40-token Llama; the local Qwen3 target is another model
    assert main(["dflash", "export", str(tmp_path / "run"), str(tmp_path / "x"), "--target",
                 str(local / "target")]) == 2
    assert "the draft was trained with target_vocab_size 40, the target has" in (
        capsys.readouterr().err)


def test_speculators_format_from_its_own_converter(local, tmp_path):
    pytest.importorskip("speculators.convert.dflash.converter")
    from lengthwise.dflash.export import to_speculators

    out = to_speculators(local / "draft", tmp_path / "spec", local / "target")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash" and cfg["block_size"] == 4
    assert cfg["mask_token_id"] == json.loads(
        (local / "draft" / "config.json").read_text())["dflash_config"]["mask_token_id"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from _dflash_run import config, train

    run = tmp_path_factory.mktemp("trained") / "run"
    train(config(steps=2, checkpoint_every=2), run)
    return run


def test_export_refuses_to_replace_an_export_without_overwrite(trained, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["dflash", "export", str(trained), str(out)]) == 0
    before = (out / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["dflash", "export", str(trained), str(out), "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "already exists and is not empty" in err and "--overwrite" in err and "\n" not in err
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    assert main(["dflash", "export", str(trained), str(out), "--dtype", "bfloat16",
                 "--overwrite"]) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    (tmp_path / "empty").mkdir()  # an empty folder is no export
    assert main(["dflash", "export", str(trained), str(tmp_path / "empty")]) == 0


@pytest.mark.parametrize("absent", [
    ("speculators", "loguru", "pydantic_settings", "openai", "hs_connectors"),
    ("openai", "hs_connectors"),
])
def test_speculators_export_names_every_missing_package_and_writes_nothing(
        trained, local, tmp_path, capsys, monkeypatch, absent):
    import importlib.util

    from lengthwise.dflash.export import SPECULATORS_IMPORTS

    find = importlib.util.find_spec
    # the converter's imports: those in ``absent`` missing, the others there
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name in absent else object() if name in SPECULATORS_IMPORTS
        else find(name, *a)))
    out = tmp_path / "out"
    assert main(["dflash", "export", str(trained), str(out), "--target", str(local / "target"),
                 "--speculators", str(tmp_path / "spec")]) == 2
    err = capsys.readouterr().err.strip()
    named = ", ".join(SPECULATORS_IMPORTS[m] for m in absent)
    assert err.startswith("lengthwise dflash: error: the speculators format needs packages "
                          f"that are not installed: {named} (pip install ") and "\n" not in err
    assert not out.exists() and not (tmp_path / "spec").exists()


def test_dflash_help_lists_the_stages_in_pipeline_order(capsys):
    with pytest.raises(SystemExit):
        main(["dflash", "--help"])
    out = capsys.readouterr().out
    at = [out.index(f"\n    {stage} ") for stage in ("prepare", "train", "export", "eval")]
    assert at == sorted(at)
