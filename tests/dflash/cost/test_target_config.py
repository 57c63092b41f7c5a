"""The target's config.json: read alone, and each field the estimates read refused in one line."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from _dflash_tiny import config_json, tiny_qwen3_config  # noqa: E402

from lengthwise.dflash.cost.target_config import read_target_config  # noqa: E402
from lengthwise.errors import ConfigError  # noqa: E402


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
    from lengthwise.dflash.cost.target_config import check_target_fields

    data = {"n_embd": "wide", "n_layer": 2, "n_head": 4, "intermediate_size": 64,
            "vocab_size": 10}
    with pytest.raises(ConfigError, match="^c.json: n_embd must be an integer >= 1, got 'wide'"):
        check_target_fields(data, "c.json", {"hidden_size": "n_embd", "num_hidden_layers":
                                             "n_layer", "num_attention_heads": "n_head"})
