"""The memory estimate of a DFlash training step: against measured peaks, its parts, its CLI."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lengthwise.dflash.cost.device_memory import DEVICE_MEMORY, memory_size  # noqa: E402
from lengthwise.dflash.cost.step_memory import estimate_step  # noqa: E402
from lengthwise.dflash.cost.target_config import read_target_config  # noqa: E402
from lengthwise.dflash.train_config import DFlashTrainConfig  # noqa: E402
from lengthwise.errors import ConfigError  # noqa: E402

HERE = Path(__file__).resolve().parent

def _tiny_target() -> object:
    return transformers.Qwen3Config(vocab_size=512, hidden_size=32, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    intermediate_size=64, tie_word_embeddings=False)


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
    t = _tiny_target()
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
    t = _tiny_target()
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
    t = _tiny_target()
    est = estimate_step(t, _cfg(device="cuda", grad_accum=2))
    target = transformers.AutoModelForCausalLM.from_config(t)
    n_target = sum(p.numel() for p in target.parameters())
    # with a second micro-batch the first one's gradients are alive at the peak
    draft_bytes = est.parts["gradients"]
    assert draft_bytes > 0
    assert est.parts["weights"] >= 2 * n_target + draft_bytes
    assert est.settings["dtype"] == "bfloat16" and est.device == "cuda"


def test_world_adds_ddp_buckets_the_size_of_the_gradients():
    t = _tiny_target()
    one = estimate_step(t, _cfg(grad_accum=2))
    eight = estimate_step(t, _cfg(grad_accum=2), world=8)
    assert "ddp_buckets" not in one.parts
    assert eight.parts["ddp_buckets"] == one.parts["gradients"]
    assert eight.peak == one.peak + eight.parts["ddp_buckets"]


def test_head_chunk_bounds_the_logits_buffers():
    t = _tiny_target()
    small = estimate_step(t, _cfg(head_chunk=16, max_slots=256))
    large = estimate_step(t, _cfg(head_chunk=128, max_slots=256))
    assert 0 < small.logits_high < large.logits_high
    assert large.logits_high <= 4 * 128 * 512 * 4  # a few fp32 chunk x vocab buffers


def test_memory_size_reads_sizes_and_device_names():
    assert memory_size("141GiB") == 141 * 2**30
    assert memory_size("80 GB") == 80 * 10**9
    assert memory_size("1.5TiB") == int(1.5 * 2**40)
    assert memory_size("H200") == DEVICE_MEMORY["h200"]
    for bad in ("", "12zz", "-3GiB", "0GB", "h300"):
        with pytest.raises(ConfigError, match="device memory"):
            memory_size(bad)


def test_fits_leaves_a_reserve():
    est = estimate_step(_tiny_target(), _cfg())
    assert est.fits(est.peak + 2**30)
    assert not est.fits(est.peak + 2**30 - 1)
    assert est.fits(est.peak, reserve=0)


def test_read_target_config_needs_only_config_json(tmp_path):
    _tiny_target().save_pretrained(tmp_path)
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


def test_estimate_cli_prints_parts_and_exits_1_when_it_does_not_fit(tmp_path, capsys):
    from lengthwise.cli import main

    _tiny_target().save_pretrained(tmp_path)
    flags = ["dflash", "estimate", "--target", str(tmp_path), "--max-tokens", "256",
             "--block-size", "4", "--max-slots", "128", "--draft-layers", "1",
             "--head-chunk", "32"]
    assert main([*flags, "--device-memory", "141GiB"]) == 0
    text = capsys.readouterr().out
    for part in ("weights", "optimizer", "gradients", "activations", "logits_chunk", "fits in"):
        assert part in text
    assert main([*flags, "--device-memory", "1GiB"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main([*flags, "--json", "--world", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["slots"] == 128 and data["settings"]["world"] == 2
    assert "ddp_buckets" in data["parts_gib"]


def test_estimate_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    from lengthwise.cli import main

    assert main(["dflash", "estimate", "--target", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    _tiny_target().save_pretrained(tmp_path)
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--device-memory",
                 "lots"]) == 2
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--block-size", "1"]) == 2
    err = capsys.readouterr().err
    assert "device memory 'lots'" in err and "block_size" in err


def test_estimate_cli_reads_the_run_yaml_of_dflash_train(tmp_path, capsys):
    """The settings of `dflash train --config`: its other keys are left alone, 6e-4 is a number,
    and flags override the file."""
    pytest.importorskip("yaml")
    from lengthwise.cli import main

    _tiny_target().save_pretrained(tmp_path)
    run = tmp_path / "run.yaml"
    run.write_text("target: ./t\ndata: prepared/\nout: run/\nlr: 6e-4\nmax-tokens: 256\n"
                   "block_size: 4\nmax_slots: 64\ndraft_layers: 1\nhead_chunk: 32\n")
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--config", str(run),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["slots"] == 64 and data["settings"]["block_size"] == 4
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--config", str(run),
                 "--max-slots", "128", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == 128
    run.write_text("lr: fast\n")
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--config", str(run)]) == 2
    assert "lr must be a number" in capsys.readouterr().err


def _estimate_target(folder: Path) -> Path:
    """A target folder of config.json, a tokenizer and weights that cannot be read."""
    from _chat_tiny import chat_tokenizer

    _tiny_target().save_pretrained(folder)
    chat_tokenizer().save_pretrained(str(folder))
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def test_train_estimate_prints_dflash_estimate_and_reads_and_writes_nothing(tmp_path, capsys):
    """`dflash train --estimate`: the numbers of `dflash estimate` at the same settings, from
    config.json alone (unreadable weights, no data), and --out neither made nor touched."""
    pytest.importorskip("yaml")
    from lengthwise.cli import main

    target = _estimate_target(tmp_path / "target")
    shape = ["--max-tokens", "256", "--block-size", "4", "--max-slots", "128",
             "--draft-layers", "1", "--head-chunk", "32", "--grad-accum", "2"]
    run = tmp_path / "run.yaml"
    run.write_text(f"target: {target}\ndata: {tmp_path / 'no-data'}\nout: {tmp_path / 'out'}\n"
                   "device: cuda\nnum_anchors: 8\n")
    assert main(["dflash", "estimate", "--target", str(target), *shape, "--num-anchors", "8",
                 "--world", "2", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(["dflash", "train", "--config", str(run), *shape, "--world", "2", "--json",
                 "--estimate"]) == 0
    assert json.loads(capsys.readouterr().out) == alone
    assert alone["device"] == "cuda" and alone["settings"]["num_anchors"] == 8
    assert not (tmp_path / "out").exists()
    # a folder of an earlier run (training would refuse it) is left exactly as it was
    out = tmp_path / "earlier"
    (out / "checkpoints" / "step_2").mkdir(parents=True)
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    flags = ["dflash", "train", "--target", str(target), "--out", str(out), "--device", "cpu",
             *shape, "--estimate"]
    # on CPU: the process's peak (its own ~0.4 GiB included) against the machine's memory
    assert main([*flags, "--device-memory", "300MiB"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("predicted peak resident memory of the process (CPU)")
    assert "per GPU" not in text and "does NOT fit in 0.3 GiB" in text
    assert main(["dflash", "estimate", "--target", str(target), "--device", "cpu", *shape,
                 "--device-memory", "300MiB"]) == 1
    step = "predicted peak of the training step's tensors"  # this process's size may move
    again = capsys.readouterr().out
    assert again[again.index(step):] == text[text.index(step):]
    assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) == before


#: each rank runs `dflash train --estimate` three times (a user error, an estimate as JSON, one
#: that does not fit), records the exit statuses, waits for the other rank's record (torchrun
#: stops the others at the first rank that exits non-zero) and exits with the last status
RANK_WORKER = """
import json, os, sys, time
from pathlib import Path
from lengthwise.cli import main

out, flags = Path(sys.argv[1]), ["dflash", "train", *sys.argv[2:], "--estimate"]
codes = [main([*flags, "--block-size", "1"]), main([*flags, "--json"]),
         main([*flags, "--device-memory", "300MiB"])]
import torch
(out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({
    "codes": codes, "group": torch.distributed.is_initialized(),
    "cuda": torch.cuda.is_initialized()}))
deadline = time.monotonic() + 60
while len(list(out.glob("rank*.json"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(codes[-1])
"""


@pytest.mark.slow
def test_train_estimate_under_torchrun_prints_once_and_every_rank_exits_alike(tmp_path):
    """Two real ranks: rank 0 prints the estimate, both exit with its verdict, neither joins a
    process group or starts CUDA; a user error is its one line on each rank, exit 2 on both."""
    import subprocess

    from _cli import launcher

    target = _estimate_target(tmp_path / "target")
    script = tmp_path / "worker.py"
    script.write_text(RANK_WORKER)
    launch, env = launcher(nproc=2)
    proc = subprocess.run(
        [*launch, str(script), str(tmp_path), "--target", str(target), "--out",
         str(tmp_path / "out"), "--device", "cpu", "--max-tokens", "256", "--block-size", "4",
         "--max-slots", "128", "--draft-layers", "1", "--head-chunk", "32"],
        env=env, capture_output=True, text=True, timeout=180)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1] == {"codes": [2, 0, 1], "group": False, "cuda": False}, \
        proc.stderr[-3000:]
    assert proc.returncode != 0  # torchrun reports the ranks' verdict: does not fit
    assert proc.stdout.count("predicted peak resident memory of the process (CPU): ") == 1
    assert proc.stdout.count("does NOT fit in 0.3 GiB") == 1
    assert proc.stdout.count('"measure"') == 1
    printed = json.loads(proc.stdout[:proc.stdout.index("}\npredicted peak") + 1])
    assert len(printed["parts_gib"]) >= 4 and len(printed["step"]["parts_gib"]) >= 4
    assert proc.stderr.count("lengthwise dflash: error:") == 2  # the package's errors: each rank
    assert "block_size" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_train_lists_estimate_and_refuses_its_flags_without_it(tmp_path, capsys):
    from lengthwise.cli import main

    assert main(["dflash", "train", "--target", str(tmp_path), "--data", str(tmp_path),
                 "--world", "2", "--device-memory", "h200"]) == 2
    assert "--world, --device-memory: read with --estimate only" in capsys.readouterr().err
    assert main(["dflash", "train", "--estimate"]) == 2
    assert "--target is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dflash", "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--estimate print the run's predicted peak memory (per GPU on CUDA, the process's "
            "resident memory on CPU)") in text
    # the estimate's own options are named once, with where their help is
    assert "(--rows, --world, --device-memory, --json, --time, --profile-steps, " in text
    assert "--device-profile, --save-profile): see its --help" in text
    assert "--device-memory SIZE" not in text
    with pytest.raises(SystemExit):
        main(["dflash", "--help"])
    assert "with --time the run's time" in " ".join(capsys.readouterr().out.split())


def test_without_device_memory_the_selected_cuda_device_is_judged(tmp_path, capsys,
                                                                   monkeypatch):
    """A run on a CUDA device torch sees is judged against that device's memory; a CPU run,
    or no GPU, gets no verdict."""
    from types import SimpleNamespace

    from lengthwise.cli import main

    _tiny_target().save_pretrained(tmp_path)
    asked = []

    def properties(device):
        asked.append(str(device))
        return SimpleNamespace(total_memory=2**30)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    flags = ["--target", str(tmp_path), "--max-tokens", "256", "--block-size", "4",
             "--draft-layers", "1", "--head-chunk", "32"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["dflash", "estimate", *flags]) == 0
    assert "fit" not in capsys.readouterr().out and not asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["dflash", "estimate", *flags, "--device", "cuda:1"]) == 1
    assert "does NOT fit in 1.0 GiB" in capsys.readouterr().out and asked == ["cuda:1"]
    assert main(["dflash", "train", *flags, "--estimate"]) == 0  # training's default: cpu
    assert "fit" not in capsys.readouterr().out and asked == ["cuda:1"]


def _config_json(folder: Path, **changes: object) -> Path:
    """The tiny target's config.json with ``changes`` (a value of ``...`` drops the key)."""
    _tiny_target().save_pretrained(folder)
    file = folder / "config.json"
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps({k: v for k, v in data.items() if v is not ...}))
    return file


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

    file = _config_json(tmp_path, **changes)
    assert main(["dflash", "estimate", "--target", str(tmp_path), "--device", "cpu",
                 "--max-tokens", "256", "--block-size", "4", "--draft-layers", "1"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lengthwise dflash: error: {file}: ")
    assert message in lines[0]


def test_optional_fields_left_out_keep_the_models_own_defaults(tmp_path):
    """What transformers builds when it loads the target, the estimate traces."""
    cfg = read_target_config(_config_json(tmp_path, model_type="llama", head_dim=None,
                                          num_key_value_heads=...))
    assert cfg.head_dim == 8 and cfg.num_key_value_heads == 4


def test_fields_are_read_under_the_models_own_names():
    from lengthwise.dflash.cost.target_config import check_target_fields

    data = {"n_embd": "wide", "n_layer": 2, "n_head": 4, "intermediate_size": 64,
            "vocab_size": 10}
    with pytest.raises(ConfigError, match="^c.json: n_embd must be an integer >= 1, got 'wide'"):
        check_target_fields(data, "c.json", {"hidden_size": "n_embd", "num_hidden_layers":
                                             "n_layer", "num_attention_heads": "n_head"})


def test_the_head_traces_three_of_its_chunks_with_the_peak_of_all_of_them(monkeypatch):
    """Every LM-head chunk holds the same buffers: the trace runs the first two and the
    last one, whatever the slots, and predicts what the trace of every chunk predicts."""
    import lengthwise.dflash.cost.trace as trace
    import lengthwise.dflash.head as head

    calls = []
    logits = head._logits
    monkeypatch.setattr(head, "_logits", lambda *a: calls.append(1) or logits(*a))
    cfg = _cfg(max_tokens=4096, max_len=4096, max_slots=4096, head_chunk=16)
    few = estimate_step(_tiny_target(), cfg)
    assert len(calls) == 2 * 3  # the forward's chunks and the backward's
    monkeypatch.setattr(trace, "_chunks_kept", lambda n, chunk: range(0, n, chunk))
    every = estimate_step(_tiny_target(), cfg)
    assert len(calls) > 2 * 3 * 50
    assert (few.peak, few.parts, few.logits_high) == (every.peak, every.parts,
                                                      every.logits_high)


@settings(max_examples=4, deadline=None)
@given(chunk=st.integers(1, 40), slots=st.integers(4, 300), accum=st.integers(1, 2))
def test_the_peak_does_not_depend_on_how_many_head_chunks_are_traced(chunk, slots, accum):
    import lengthwise.dflash.cost.trace as trace

    cfg = _cfg(head_chunk=chunk, max_slots=max(4, slots), grad_accum=accum)
    few = estimate_step(_tiny_target(), cfg)
    saved = trace._chunks_kept
    trace._chunks_kept = lambda n, c: range(0, n, c)
    try:
        every = estimate_step(_tiny_target(), cfg)
    finally:
        trace._chunks_kept = saved
    assert (few.peak, few.parts, few.logits_high) == (every.peak, every.parts,
                                                      every.logits_high)


def test_a_billion_tokens_is_estimated_and_more_is_refused_by_name():
    """A million LM-head chunks traced as three: the answer comes; beyond what torch can
    count (the target's tokens x tokens mask), the limit is named."""
    big = estimate_step(_tiny_target(), _cfg(max_tokens=10**9, max_slots=10**9))
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
            estimate_step(_tiny_target(), _cfg(**kw))
    deep = transformers.Qwen3Config(**{**_tiny_target().to_dict(), "num_hidden_layers": 257,
                                       "layer_types": None})
    with pytest.raises(ConfigError, match="^num_hidden_layers 257 is more layers"):
        estimate_step(deep, _cfg())
