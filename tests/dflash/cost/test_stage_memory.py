"""The whole-process memory estimate of each DFlash stage against the real command's peak."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _chat_tiny import WORDS, chat_tokenizer, write_jsonl  # noqa: E402
from _cli import launcher  # noqa: E402

from lengthwise.dflash.cost.resident import command_peak  # noqa: E402
from lengthwise.errors import ConfigError  # noqa: E402

#: predicted / measured peak resident memory of a stage's process, at most this far from 1:
#: the real target's table (docs/dflash.md, dflash-stage-memory) is within 15 %; these
#: small targets have more of their peak in the process itself, measured apart
TOLERANCE = 0.15


def _small_target(folder: Path) -> Path:
    """A Qwen3-shaped target (hidden 256, 4 layers) with the tests' chat tokenizer."""
    tok = chat_tokenizer()
    cfg = transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, intermediate_size=1024,
        max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def _words(n: int, seed: int) -> str:
    import numpy as np

    return " ".join(np.random.default_rng(seed).choice(WORDS, n))


def _prompts(tok: object, n: int, tokens: int) -> tuple[list[str], int]:
    """``n`` user texts whose prompts are about ``tokens`` long, and the longest prompt."""
    out, longest = [], 0
    for i in range(n):
        words = tokens
        for _ in range(6):
            text = _words(words, i)
            got = len(tok.apply_chat_template([{"role": "user", "content": text}],
                                              tokenize=True, add_generation_prompt=True,
                                              return_dict=True)["input_ids"])
            if got <= tokens:
                break
            words -= got - tokens
        out.append(text)
        longest = max(longest, got)
    return out, longest


def _peak(args: list[str]) -> int:
    """Peak resident bytes of ``lengthwise ARGS`` in its own process, not this runner's."""
    launch, env = launcher()
    with tempfile.TemporaryFile() as err:
        code, peak = command_peak([*launch, "-m", "lengthwise", *args], env=env, stderr=err)
        err.seek(0)
        assert code == 0, err.read().decode()[-3000:]
    return peak


def _predicted(args: list[str]) -> dict:
    launch, env = launcher()
    proc = subprocess.run([*launch, "-m", "lengthwise", "dflash", "estimate", *args, "--json"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """``(target, prepared data, tokenizer, root)``: samples longer than a micro-batch."""
    from lengthwise.dflash.prepare import prepare_chats
    from lengthwise.dflash.prepare_config import PrepareConfig

    root = tmp_path_factory.mktemp("stage_memory")
    target = _small_target(root / "target")
    chats = [{"messages": [{"role": "user", "content": _words(12, i)},
                           {"role": "assistant", "content": _words(1400, 100 + i)}]}
             for i in range(8)]
    write_jsonl(root / "chats.jsonl", chats)
    prepare_chats(root / "chats.jsonl", target, root / "prepared",
                  PrepareConfig(min_supervised=1, progress=False))
    tok = transformers.AutoTokenizer.from_pretrained(str(target))
    return target, root / "prepared", tok, root


def _close(pred: dict, measured: int) -> None:
    ratio = pred["peak_bytes"] / measured
    assert abs(ratio - 1) <= TOLERANCE, (ratio, pred["phase"], pred["parts_gib"], measured)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="wait4's peak: Linux")
def test_each_stage_predicts_its_process_peak_on_cpu(small):
    """train (grows and saves the target: the tokenizer has no mask token), regenerate and
    eval: predicted from config.json against the peak resident memory of the real command."""
    target, data, tok, root = small
    shape = ["--max-tokens", "1024", "--block-size", "8", "--draft-layers", "1",
             "--num-anchors", "512", "--max-slots", "4096", "--head-chunk", "512"]
    common = ["--target", str(target), "--device", "cpu"]
    pred = _predicted([*common, *shape])
    assert pred["settings"]["grown_rows"] == len(tok) + 1  # <|MASK|> added
    measured = _peak(["dflash", "train", *common, *shape, "--data", str(data), "--out",
                      str(root / "run"), "--steps", "2", "--checkpoint-every", "1",
                      "--eval-every", "0", "--eval-samples", "1", "--no-progress"])
    assert (root / "run" / "target").is_dir()  # the grown target was saved into the run
    _close(pred, measured)

    sizes = ["--max-tokens", "2048", "--num-features", "2"]
    pred = _predicted(["--stage", "features", *common, *sizes, "--data", str(data)])
    measured = _peak(["dflash", "features", str(data), *common, *sizes, "--out",
                      str(root / "features"), "--no-progress"])
    _close(pred, measured)

    users, longest = _prompts(tok, 8, 512)
    chats = write_jsonl(root / "prompts.jsonl",
                        [{"messages": [{"role": "user", "content": u}]} for u in users])
    sizes = ["--batch-size", "8", "--max-new-tokens", "32"]
    pred = _predicted(["--stage", "regenerate", *common, *sizes, "--max-len", str(longest)])
    measured = _peak(["dflash", "prepare", str(chats), "--target", str(target), "--device",
                      "cpu", "--out", str(root / "regen"), "--regenerate", "--min-supervised",
                      "1", *sizes, "--no-progress"])
    _close(pred, measured)

    sizes = ["--batch-size", "4", "--max-new-tokens", "32"]
    grown = root / "run" / "target"  # the draft is evaluated with the target it trained on
    pred = _predicted(["--stage", "eval", "--target", str(grown), "--device", "cpu", *sizes,
                       "--max-len", str(longest), "--block-size", "8", "--draft-layers", "1"])
    measured = _peak(["dflash", "eval", "--target", str(grown), "--draft", str(root / "run"),
                      "--prompts", str(chats), "--temperatures", "0", *sizes, "--no-progress",
                      "--json"])
    _close(pred, measured)


def test_on_cpu_the_figure_is_the_process_not_a_gpu(tmp_path, capsys):
    """Every stage says what it predicts and covers; nothing on CPU is "per GPU"."""
    from lengthwise.cli import main

    transformers.Qwen3Config(vocab_size=512, hidden_size=32, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             intermediate_size=64).save_pretrained(tmp_path)
    common = ["--target", str(tmp_path), "--device", "cpu"]
    runs = [["dflash", "estimate", *common, "--max-tokens", "256", "--block-size", "4",
             "--draft-layers", "1"],
            ["dflash", "train", *common, "--max-tokens", "256", "--block-size", "4",
             "--draft-layers", "1", "--estimate"],
            ["dflash", "estimate", "--stage", "regenerate", *common, "--max-len", "64",
             "--batch-size", "2", "--max-new-tokens", "8"],
            ["dflash", "estimate", "--stage", "eval", *common, "--max-len", "64",
             "--batch-size", "2", "--max-new-tokens", "8", "--block-size", "4",
             "--draft-layers", "1"],
            ["dflash", "estimate", "--stage", "features", *common, "--max-tokens", "64",
             "--num-features", "2"]]
    for argv in runs:
        assert main(argv) == 0
        text = capsys.readouterr().out
        assert text.startswith("predicted peak resident memory of the process (CPU): ")
        assert "per GPU" not in text
        assert "process " in text and "weights " in text
    assert main([*runs[2], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["measure"].startswith("predicted peak resident memory of the process")
    assert data["peak_bytes"] == round(sum(data["parts_gib"].values()) * 2**30)
    assert data["phase"] in ("prefill", "last decoding step")


def test_on_cuda_the_figure_is_allocated_per_gpu_and_says_what_is_outside(tmp_path, capsys):
    from lengthwise.cli import main

    transformers.Qwen3Config(vocab_size=512, hidden_size=32, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             intermediate_size=64).save_pretrained(tmp_path)
    assert main(["dflash", "estimate", "--stage", "eval", "--target", str(tmp_path),
                 "--device", "cuda", "--max-len", "64", "--batch-size", "2",
                 "--block-size", "4", "--draft-layers", "1", "--device-memory", "4GiB"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("predicted peak allocated memory per GPU (CUDA; outside it: the "
                           "CUDA context")
    assert "process " not in text and "fits in 4.0 GiB" in text


def test_the_phases_grow_with_their_own_settings():
    from lengthwise.dflash.cost.stage_memory import estimate_eval, estimate_regenerate

    t = transformers.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=4,
                                 num_attention_heads=4, intermediate_size=128)
    small = estimate_regenerate(t, batch_size=2, max_len=64, max_new_tokens=8)
    wide = estimate_regenerate(t, batch_size=8, max_len=64, max_new_tokens=8)
    long = estimate_regenerate(t, batch_size=2, max_len=64, max_new_tokens=512)
    assert wide.phases["prefill"] > small.phases["prefill"]
    assert long.phases["last decoding step"] > small.phases["last decoding step"]
    assert small.parts["weights"] == wide.parts["weights"] > 0
    assert "process" not in small.parts or small.parts["process"] == 0
    ev = estimate_eval(t, block_size=4, draft_layers=1, batch_size=2, max_len=64,
                       max_new_tokens=8)
    assert ev.parts["draft"] > 0 and ev.peak == sum(ev.parts.values())


def test_depth_is_extrapolated_exactly_from_two_shallow_traces():
    """The per-layer extrapolation gives what a trace at full depth gives."""
    from lengthwise.dflash.cost import stage_memory as sm
    from lengthwise.dflash.cost.trace import per_layer

    t = transformers.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=6,
                                 num_attention_heads=4, intermediate_size=128)

    def trace(n: int) -> dict[str, int]:
        return sm._generate_trace(t, n, torch.float32, 3, 40, 8, "cpu")

    assert per_layer(trace, 6, 0) == trace(6)
    assert per_layer(trace, 9, 0) == trace(9)

    def trace_eval(n: int) -> dict[str, int]:  # 2 prompts of 30 tokens, 2 features
        return sm._eval_target_trace(t, n, torch.float32, 2, 30, 80, 4, 3, 40, 2, "cpu")

    assert per_layer(trace_eval, 7, 2) == trace_eval(7)


@pytest.mark.parametrize("kw", [
    {"max_tokens": 2048, "block_size": 4, "max_slots": 16},  # the target's forward peaks
    {"max_tokens": 512, "block_size": 8, "max_slots": 1024, "grad_accum": 2},  # the draft's
    {"max_tokens": 1024, "block_size": 4, "max_slots": 16, "device": "cuda"},
], ids=["target-peak", "draft-peak-accum2", "cuda"])
def test_the_step_traced_on_a_shallow_target_equals_the_full_trace(monkeypatch, kw):
    import lengthwise.dflash.cost.step_memory as memory
    from lengthwise.dflash.train_config import DFlashTrainConfig

    deep = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=24,
                                    num_attention_heads=4, intermediate_size=128)
    cfg = DFlashTrainConfig(**{"steps": 1, "max_len": kw["max_tokens"], "draft_layers": 1,
                               "head_chunk": 64, "device": "cpu", "progress": False, **kw})
    fast = memory.estimate_step(deep, cfg)
    monkeypatch.setattr(memory, "SHALLOW_TARGET", False)
    full = memory.estimate_step(deep, cfg)
    assert (fast.peak, fast.parts, fast.logits_high) == (full.peak, full.parts, full.logits_high)


@pytest.mark.parametrize(("argv", "message"), [
    (["--stage", "regenerate"], "--stage regenerate: give --max-len"),
    (["--stage", "eval", "--max-len", "0"], "--max-len must be an integer >= 1, got 0"),
    (["--stage", "regenerate", "--max-len", "8", "--batch-size", "0"],
     "--batch-size must be an integer >= 1, got 0"),
    (["--stage", "eval", "--max-len", "8", "--max-slots", "2", "--block-size", "4"],
     "--max-slots 2 holds no block of --block-size 4"),
    (["--stage", "regenerate", "--max-len", "8", "--world", "2"],
     "--world: not a setting of the regenerate stage's estimate"),
    (["--stage", "regenerate", "--max-len", "8", "--block-size", "4"],
     "--block-size: not a setting of the regenerate stage's estimate"),
    (["--stage", "eval", "--max-len", "8", "--device", "mps"],
     "--device mps: the estimate knows cpu and cuda"),
    (["--stage", "eval", "--max-len", "8", "--dtype", "int8"], "--dtype must be one of"),
    (["--stage", "features", "--time"], "--time: the time of the train and regenerate stages, "
                                        "not of features"),
    (["--stage", "features", "--dtype", "int8"], "dtype must be one of float16, bfloat16"),
    (["--stage", "features", "--layers", "0,9"], "--layers 0,9: the target has layers 0 to 1"),
    (["--stage", "features", "--block-size", "4"],
     "--block-size: not a setting of the features stage's estimate"),
    (["--stage", "eval", "--max-len", "8", "--out", "c"],
     "--out: not a setting of the eval stage's estimate"),
    (["--layers", "1", "--no-last-hidden"],
     "--layers, --last-hidden: not a setting of the train stage's estimate"),
    (["--features", "nowhere"], "--features nowhere: not a feature cache (no features.json"),
], ids=["no-max-len", "max-len-0", "batch-0", "slots", "world", "block-in-regen", "mps",
        "dtype", "features-time", "features-dtype", "features-layers", "block-in-features",
        "out-in-eval", "features-flags-in-train", "not-a-cache"])
def test_bad_stage_settings_are_one_line_errors(tmp_path, capsys, argv, message):
    from lengthwise.cli import main

    transformers.Qwen3Config(vocab_size=512, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             intermediate_size=64).save_pretrained(tmp_path)
    assert main(["dflash", "estimate", "--target", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_grown_rows_follow_the_mask_token_choice():
    from lengthwise.dflash.cost.stage_memory import grown_rows

    tok = chat_tokenizer()  # no mask token, no spare special token: <|MASK|> is added
    cfg = transformers.Qwen3Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   intermediate_size=64, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id)
    rows = len(tok)
    assert grown_rows(tok, cfg) == rows + 1
    assert tok.get_vocab()["<|MASK|>"] == rows  # added, as dflash train adds it
    cfg.vocab_size = rows + 8  # padding rows: the id fits, nothing grows
    assert grown_rows(chat_tokenizer(), cfg) == rows + 8
    with pytest.raises(ConfigError):
        from lengthwise.dflash.cost.stage_memory import estimate_regenerate

        estimate_regenerate(cfg, max_len=0)


@pytest.fixture(scope="module")
def cache(tiny_prepared, tmp_path_factory):
    """``(target, prepared, cache folder)``: a feature cache of two layers, in one shard."""
    from lengthwise.dflash.features import FeaturesConfig, write_features

    target, prepared = tiny_prepared
    out = tmp_path_factory.mktemp("features") / "cache"
    write_features(prepared, target, out, FeaturesConfig(num_features=2, shard_mib=1,
                                                         progress=False))
    return target, prepared, out


def test_the_features_stage_predicts_the_bytes_of_the_cache_written(cache, tmp_path, capsys):
    """The disk figure is the shards' data; the files add only their .npy headers."""
    import numpy as np

    from lengthwise.cli import main

    target, prepared, folder = cache
    assert main(["dflash", "estimate", "--stage", "features", "--target", str(target),
                 "--data", str(prepared), "--num-features", "2", "--device", "cpu",
                 "--out", str(tmp_path / "new" / "cache"), "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    shards = sorted(folder.glob("*_0*.npy"))
    data = sum(np.load(f, mmap_mode="r").nbytes for f in shards)
    written = sum(f.stat().st_size for f in shards)
    assert settings["cache_bytes"] == data > 0
    assert 0 < written - settings["cache_bytes"] <= 128 * len(shards)  # one header a file
    assert settings["disk"] == str(tmp_path) and settings["disk_fits"] is True
    assert settings["target_layers"] == json.loads(
        (folder / "features.json").read_text())["settings"]["layers"]


def test_the_features_stage_says_when_the_disk_has_no_room(cache, monkeypatch, capsys):
    import shutil
    from types import SimpleNamespace

    from lengthwise.cli import main

    target, prepared, _ = cache
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    assert main(["dflash", "estimate", "--stage", "features", "--target", str(target),
                 "--data", str(prepared), "--num-features", "2", "--device", "cpu"]) == 1
    text = capsys.readouterr().out
    assert "disk: the cache needs 561.6 KiB (2,995 tokens x 192 bytes: 2 layers + the last " \
           "hidden state x 32 x 2 bytes);" in text
    assert text.rstrip().endswith("has 1000 bytes free: does NOT fit")


def test_a_cached_train_step_holds_no_target_forward(cache, capsys):
    """`dflash train --estimate --features` is the step without the target's forward: a
    lower peak, the same weights, and it says so."""
    from lengthwise.cli import main

    target, prepared, folder = cache
    argv = ["dflash", "train", "--target", str(target), "--data", str(prepared), "--device",
            "cpu", "--max-tokens", "512", "--max-slots", "64", "--block-size", "4",
            "--draft-layers", "2", "--estimate", "--json"]
    assert main(argv) == 0
    online = json.loads(capsys.readouterr().out)
    assert main([*argv, "--features", str(folder)]) == 0
    cached = json.loads(capsys.readouterr().out)
    # the step's peak (the process's own bytes, measured here, vary from call to call)
    assert cached["step"]["peak_bytes"] < online["step"]["peak_bytes"]
    assert cached["parts_gib"]["weights"] == online["parts_gib"]["weights"]
    assert cached["step"]["settings"]["features_cached"] == 512 * 2 * 32 * 4  # fp32 on CPU
    assert main(argv[:-1] + ["--features", str(folder)]) == 0
    assert "no target forward: the features are read from the cache" in capsys.readouterr().out
