"""The memory estimates: a device's memory, the target's config.json, a training step against
measured peaks and its parts, and each stage's whole process against the real command's peak."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _chat_tiny import WORDS, chat_tokenizer, write_jsonl  # noqa: E402
from _cli import launcher  # noqa: E402
from _dflash_tiny import config_json, tiny_qwen3_config  # noqa: E402

from lengthwise.dflash.cost.memory import (  # noqa: E402
    DEVICE_MEMORY,
    estimate_step,
    fits_line,
    memory_size,
    read_target_config,
)
from lengthwise.dflash.cost.resident import command_peak  # noqa: E402
from lengthwise.dflash.train_config import DFlashTrainConfig  # noqa: E402
from lengthwise.errors import ConfigError  # noqa: E402


def test_memory_size_reads_sizes_and_device_names():
    assert memory_size("141GiB") == 141 * 2**30
    assert memory_size("80 GB") == 80 * 10**9
    assert memory_size("1.5TiB") == int(1.5 * 2**40)
    assert memory_size("H200") == DEVICE_MEMORY["h200"]
    for bad in ("", "12zz", "-3GiB", "0GB", "h300"):
        with pytest.raises(ConfigError, match="device memory"):
            memory_size(bad)


def test_the_fit_line_sets_the_reserve_aside():
    assert fits_line(3 * 2**30, 4 * 2**30).startswith("fits in 4.0 GiB (with 1.0 GiB")
    assert fits_line(3 * 2**30, 4 * 2**30, reserve=2**31).startswith("does NOT fit")


def test_read_target_config_needs_only_config_json(tmp_path):
    tiny_qwen3_config().save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    for path in (tmp_path, tmp_path / "config.json"):
        cfg = read_target_config(path)
        assert cfg.model_type == "qwen3" and cfg.hidden_size == 32
    with pytest.raises(ConfigError, match="no config.json"):
        read_target_config(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json: not readable"):
        read_target_config(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"hidden_size": 3}')
    with pytest.raises(ConfigError, match="no model_type"):
        read_target_config(tmp_path / "other.json")


@pytest.mark.parametrize(("changes", "message"), [
    ({"hidden_size": ...}, "no hidden_size: the estimate needs the target's own value"),
    ({"vocab_size": ...}, "no vocab_size"),
    ({"hidden_size": "abc"}, "hidden_size must be an integer >= 1, got 'abc'"),
    ({"hidden_size": 30.5}, "hidden_size must be an integer >= 1, got 30.5"),
    ({"hidden_size": 0}, "hidden_size must be an integer >= 1, got 0"),
    ({"hidden_size": -32}, "hidden_size must be an integer >= 1, got -32"),
    ({"hidden_size": None}, "no hidden_size"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer >= 1, got True"),
    ({"vocab_size": 0}, "vocab_size must be an integer >= 1, got 0"),
    ({"intermediate_size": "64"}, "intermediate_size must be an integer >= 1, got '64'"),
    ({"num_key_value_heads": -1}, "num_key_value_heads must be an integer >= 1, got -1"),
    ({"num_key_value_heads": 3},
     "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"head_dim": None}, "Validation error for field 'head_dim'"),
    ({"model_type": "llama", "head_dim": None, "num_attention_heads": 5,
      "num_key_value_heads": 5},
     "The hidden size (32) is not a multiple of the number of attention heads (5)"),
    ({"num_hidden_layers": 10**6, "layer_types": ...},
     "num_hidden_layers 1,000,000 is more layers than the estimate traces (at most 256)"),
], ids=["no-hidden", "no-vocab", "str", "float", "zero", "negative", "null", "bool", "vocab-0",
        "str-width", "kv-negative", "kv-3", "qwen3-head-dim-null", "llama-heads-uneven",
        "a-million-layers"])
def test_estimate_refuses_a_config_json_field_it_reads_naming_the_file_and_key(
        tmp_path, capsys, changes, message):
    """Each field the estimate reads, checked before anything is built: one line, exit 2
    (a missing width is not transformers' default of 4096)."""
    from lengthwise.cli import main

    file = config_json(tmp_path, **changes)
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--device", "cpu",
                 "--max-tokens", "256", "--block-size", "4", "--draft-layers", "1"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lengthwise dflash: error: {file}: ")
    assert message in lines[0]


def test_optional_fields_left_out_keep_the_models_own_defaults(tmp_path):
    """What transformers builds when it loads the target, the estimate traces."""
    cfg = read_target_config(config_json(tmp_path, model_type="llama", head_dim=None,
                                          num_key_value_heads=...))
    assert cfg.head_dim == 8 and cfg.num_key_value_heads == 4


def test_fields_are_read_under_the_models_own_names():
    from lengthwise.dflash.cost.memory import check_target_fields

    data = {"n_embd": "wide", "n_layer": 2, "n_head": 4, "intermediate_size": 64,
            "vocab_size": 10}
    with pytest.raises(ConfigError, match="^c.json: n_embd must be an integer >= 1, got 'wide'"):
        check_target_fields(data, "c.json", {"hidden_size": "n_embd", "num_hidden_layers":
                                             "n_layer", "num_attention_heads": "n_head"})


HERE = Path(__file__).resolve().parent

def _cfg(**kw: object) -> DFlashTrainConfig:
    base = dict(steps=1, max_tokens=256, max_len=256, block_size=4, num_anchors=16,
                draft_layers=1, grad_accum=1, head_chunk=32, device="cpu", progress=False)
    return DFlashTrainConfig(**{**base, **kw})


def _can_measure() -> bool:
    return sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)


@pytest.mark.slow
@pytest.mark.skipif(not _can_measure(), reason="needs Linux /proc/self/clear_refs")
@pytest.mark.parametrize("index", [0, 1, 2], ids=["b8", "b16-accum2", "b4-rows2-vocab32k"])
def test_predicted_step_peak_is_within_15_percent_of_the_measured_one(index):
    """Traced under fake tensors vs the resident memory of the real step, one process each."""
    sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
    import memory_estimate

    assert len(memory_estimate.SHAPES) == 3
    got = memory_estimate.measure_in_subprocess(memory_estimate.SHAPES[index])
    assert got["measured"] > 0
    assert abs(got["predicted"] - got["measured"]) <= 0.15 * got["measured"], got


def test_parts_add_up_and_grow_with_the_slot_budget():
    t = tiny_qwen3_config()
    small = estimate_step(t, _cfg(max_slots=64))
    large = estimate_step(t, _cfg(max_slots=512))
    assert small.peak == sum(small.parts.values())
    assert small.slots == 64 and large.slots == 512
    assert large.parts["activations"] > small.parts["activations"]
    assert large.parts["weights"] == small.parts["weights"] > 0
    # AdamW: two fp32 moments per trainable parameter (and a step count each)
    assert small.parts["optimizer"] >= 2 * small.parts["gradients"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_cached_step_peaks_below_the_online_one_by_the_target_forward(device):
    """With the features read from a cache, the step runs no target forward: the target's
    weights stay, its activations go, and the micro-batch's features count instead."""
    t = tiny_qwen3_config()
    cfg = _cfg(max_tokens=1024, max_len=1024, max_slots=64, device=device)
    online, cached = estimate_step(t, cfg), estimate_step(t, cfg, cached=True)
    assert cached.parts["weights"] == online.parts["weights"]
    assert cached.parts["optimizer"] == online.parts["optimizer"]
    assert cached.peak < online.peak
    elt = 2 if device == "cuda" else 4  # the target's dtype: bf16 on CUDA, fp32 on CPU
    assert cached.settings["features_cached"] == 1024 * 32 * elt  # one layer of width 32
    assert online.settings["features_cached"] == 0
    assert "no target forward" in cached.render() and "no target" not in online.render()


def test_weights_are_the_target_in_bf16_and_the_draft_in_fp32_on_cuda():
    t = tiny_qwen3_config()
    est = estimate_step(t, _cfg(device="cuda", grad_accum=2))
    target = transformers.AutoModelForCausalLM.from_config(t)
    n_target = sum(p.numel() for p in target.parameters())
    # with a second micro-batch the first one's gradients are alive at the peak
    draft_bytes = est.parts["gradients"]
    assert draft_bytes > 0
    assert est.parts["weights"] >= 2 * n_target + draft_bytes
    assert est.settings["dtype"] == "bfloat16" and est.device == "cuda"


def test_world_adds_ddp_buckets_the_size_of_the_gradients():
    t = tiny_qwen3_config()
    one = estimate_step(t, _cfg(grad_accum=2))
    eight = estimate_step(t, _cfg(grad_accum=2), world=8)
    assert "ddp_buckets" not in one.parts
    assert eight.parts["ddp_buckets"] == one.parts["gradients"]
    assert eight.peak == one.peak + eight.parts["ddp_buckets"]


def test_head_chunk_bounds_the_logits_buffers():
    t = tiny_qwen3_config()
    small = estimate_step(t, _cfg(head_chunk=16, max_slots=256))
    large = estimate_step(t, _cfg(head_chunk=128, max_slots=256))
    assert 0 < small.logits_high < large.logits_high
    assert large.logits_high <= 4 * 128 * 512 * 4  # a few fp32 chunk x vocab buffers


def test_fits_leaves_a_reserve():
    est = estimate_step(tiny_qwen3_config(), _cfg())
    assert est.fits(est.peak + 2**30)
    assert not est.fits(est.peak + 2**30 - 1)
    assert est.fits(est.peak, reserve=0)


def test_the_context_is_converted_to_the_autocast_dtype_once_with_unchanged_outputs(
        monkeypatch):
    """K and V read one bf16 copy of ``[context | block]``; the outputs are the same bits."""
    import lengthwise.dflash.model as model_mod
    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    cfg = DFlashConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=64, num_features=2, block_size=4, mask_token_id=3)
    torch.manual_seed(0)
    draft = DFlashDraft(cfg)
    feats, block = torch.randn(1, 6, 64), torch.randn(1, 4, 32)
    pos, mask = torch.arange(10).unsqueeze(0), torch.ones(1, 4, 10, dtype=torch.bool)

    def run() -> tuple[torch.Tensor, int]:
        seen = []

        class Casts(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == (
                        1, 10, 32) and (kwargs or {}).get("dtype") == torch.bfloat16:
                    seen.append(func)
                return func(*args, **(kwargs or {}))

        with Casts(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = draft(feats, block, pos, mask)
        return out, len(seen)

    once, n_once = run()
    monkeypatch.setattr(model_mod, "_autocast_once", lambda x: x)  # each projection casts
    twice, n_twice = run()
    assert (n_once, n_twice) == (cfg.num_layers, 2 * cfg.num_layers)
    assert torch.equal(once, twice)


def test_the_head_traces_three_of_its_chunks_with_the_peak_of_all_of_them(monkeypatch):
    """Every LM-head chunk holds the same buffers: the trace runs the first two and the
    last one, whatever the slots, and predicts what the trace of every chunk predicts."""
    import lengthwise.dflash.cost.memory as memory
    import lengthwise.dflash.head as head

    calls = []
    logits = head._logits
    monkeypatch.setattr(head, "_logits", lambda *a: calls.append(1) or logits(*a))
    cfg = _cfg(max_tokens=4096, max_len=4096, max_slots=4096, head_chunk=16)
    few = estimate_step(tiny_qwen3_config(), cfg)
    assert len(calls) == 2 * 3  # the forward's chunks and the backward's
    monkeypatch.setattr(memory, "_chunks_kept", lambda n, chunk: range(0, n, chunk))
    every = estimate_step(tiny_qwen3_config(), cfg)
    assert len(calls) > 2 * 3 * 50
    assert (few.peak, few.parts, few.logits_high) == (every.peak, every.parts,
                                                      every.logits_high)


@settings(max_examples=4, deadline=None)
@given(chunk=st.integers(1, 40), slots=st.integers(4, 300), accum=st.integers(1, 2))
def test_the_peak_does_not_depend_on_how_many_head_chunks_are_traced(chunk, slots, accum):
    import lengthwise.dflash.cost.memory as memory

    cfg = _cfg(head_chunk=chunk, max_slots=max(4, slots), grad_accum=accum)
    few = estimate_step(tiny_qwen3_config(), cfg)
    saved = memory._chunks_kept
    memory._chunks_kept = lambda n, c: range(0, n, c)
    try:
        every = estimate_step(tiny_qwen3_config(), cfg)
    finally:
        memory._chunks_kept = saved
    assert (few.peak, few.parts, few.logits_high) == (every.peak, every.parts,
                                                      every.logits_high)


def test_a_billion_tokens_is_estimated_and_more_is_refused_by_name():
    """A million LM-head chunks traced as three: the answer comes; beyond what torch can
    count (the target's tokens x tokens mask), the limit is named."""
    big = estimate_step(tiny_qwen3_config(), _cfg(max_tokens=10**9, max_slots=10**9))
    assert big.tokens == 10**9 and big.slots == 10**9 and not big.fits(DEVICE_MEMORY["h200"])
    for kw, message in (
            ({"max_tokens": 10**9 + 1}, "max_tokens 1,000,000,001 is more tokens than the "
                                        "estimate traces (at most 1,000,000,000)"),
            ({"max_tokens": 10**9, "max_slots": None},
             "block_size 4 x max_tokens 1,000,000,000 (no max_slots): 3,999,999,984 draft slots "
             "are more than the estimate traces"),
            ({"draft_layers": 257, "num_features": 1},
             "draft_layers 257 is more layers than the estimate traces (at most 256)")):
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            estimate_step(tiny_qwen3_config(), _cfg(**kw))
    deep = transformers.Qwen3Config(**{**tiny_qwen3_config().to_dict(), "num_hidden_layers": 257,
                                       "layer_types": None})
    with pytest.raises(ConfigError, match="^num_hidden_layers 257 is more layers"):
        estimate_step(deep, _cfg())


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
    from lengthwise.dflash.cost.memory import estimate_eval, estimate_regenerate

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


def test_depth_is_extrapolated_exactly_from_two_shallow_traces(monkeypatch):
    """Each stage's per-layer extrapolation gives what a trace at full depth gives."""
    import lengthwise.dflash.cost.memory as memory
    from lengthwise.dflash.features import FeaturesConfig

    def stages(layers: int) -> list[object]:
        t = transformers.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=layers,
                                     num_attention_heads=4, intermediate_size=128)
        return [memory.estimate_regenerate(t, batch_size=3, max_len=40, max_new_tokens=8),
                memory.estimate_eval(t, batch_size=2, max_len=30, max_new_tokens=10,
                                     block_size=4, draft_layers=1, num_features=2,
                                     max_tokens=120),
                memory.estimate_features(t, FeaturesConfig(num_features=2, max_tokens=64))]

    fast = {n: stages(n) for n in (7, 9)}
    monkeypatch.setattr(memory, "SHALLOW_TARGET", False)
    for n, got in fast.items():
        assert [(e.peak, e.parts, e.phases) for e in got] == \
            [(e.peak, e.parts, e.phases) for e in stages(n)]


@pytest.mark.parametrize("kw", [
    {"max_tokens": 2048, "block_size": 4, "max_slots": 16},  # the target's forward peaks
    {"max_tokens": 512, "block_size": 8, "max_slots": 1024, "grad_accum": 2},  # the draft's
    {"max_tokens": 1024, "block_size": 4, "max_slots": 16, "device": "cuda"},
], ids=["target-peak", "draft-peak-accum2", "cuda"])
def test_the_step_traced_on_a_shallow_target_equals_the_full_trace(monkeypatch, kw):
    import lengthwise.dflash.cost.memory as memory
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
    from lengthwise.dflash.cost.memory import grown_rows

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
        from lengthwise.dflash.cost.memory import estimate_regenerate

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
