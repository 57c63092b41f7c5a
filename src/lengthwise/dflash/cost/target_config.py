"""The target's ``config.json``: read, and refused where the estimates cannot use it.

Example::

    >>> check_target_fields({"hidden_size": 32, "num_hidden_layers": 2,
    ...     "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 0}, "c.json")
    Traceback (most recent call last):
    ...
    lengthwise.errors.ConfigError: c.json: vocab_size must be an integer >= 1, got 0
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lengthwise.errors import ConfigError

__all__ = ["MAX_LAYERS", "check_layers", "check_target_fields", "read_target_config"]

#: the fields of a target config the estimates read: required, and optional (absent or null)
TARGET_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "vocab_size")
OPTIONAL_TARGET_FIELDS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
#: the most decoder layers (the target's, the draft's) the estimates trace: each costs the
#: trace tens of milliseconds, and the deepest open models have fewer than 128
MAX_LAYERS = 256


def read_target_config(path: str | Path) -> Any:
    """The ``transformers`` config of a target: its folder or its ``config.json``, nothing else."""
    import transformers
    from huggingface_hub.errors import StrictDataclassError

    from lengthwise.dflash.target import check_builtin_model

    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"--target {path}: no config.json there")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not readable as JSON ({exc})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{file}: not a Hugging Face model config (no model_type)")
    check_builtin_model(path, data)
    known = transformers.CONFIG_MAPPING  # a lazy mapping: its get() finds nothing
    if str(data["model_type"]) in known:
        check_target_fields(data, file, getattr(known[str(data["model_type"])],
                                                "attribute_map", {}))
    try:
        config = transformers.AutoConfig.for_model(**data)
    except (ValueError, KeyError, TypeError, StrictDataclassError) as exc:
        raise ConfigError(f"{file}: {' '.join(str(exc).split())}") from None
    heads, width = config.num_attention_heads, config.hidden_size
    if getattr(config, "head_dim", None) is None and width % heads:
        raise ConfigError(f"{file}: hidden_size {width} is not a multiple of "
                          f"num_attention_heads {heads} and there is no head_dim")
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv:
        raise ConfigError(f"{file}: num_attention_heads {heads} is not a multiple of "
                          f"num_key_value_heads {kv}")
    return config


def check_target_fields(data: dict[str, Any], file: Path | str,
                        names: dict[str, str] | None = None) -> None:
    """Refuse a ``config.json`` (``data``) whose fields the estimates read cannot be used:
    each of :data:`TARGET_FIELDS` there (a default would stand in for the target's own
    size) and, like the optional ones that are not null, an integer >= 1. ``names`` maps a
    field to the model's own key (``attribute_map``: ``n_embd`` for ``hidden_size``)."""
    names = names or {}
    for name in (*TARGET_FIELDS, *OPTIONAL_TARGET_FIELDS):
        key = names.get(name, name)
        value = data.get(key)
        if value is None:
            if name in TARGET_FIELDS:
                raise ConfigError(f"{file}: no {key}: the estimate needs the target's own value "
                                  "(there is no default for it)")
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{file}: {key} must be an integer >= 1, got {value!r}")
    key = names.get("num_hidden_layers", "num_hidden_layers")
    check_layers(f"{file}: {key}", data[key])


def check_layers(what: str, layers: int) -> None:
    """Refuse more than :data:`MAX_LAYERS` layers.

    >>> check_layers("draft_layers", 5)
    """
    if layers > MAX_LAYERS:
        raise ConfigError(f"{what} {layers:,} is more layers than the estimate traces (at most "
                          f"{MAX_LAYERS})")
