"""The settings of a `lengthwise dflash train` run: defaults, `--config run.yaml`, then flags.

Read by ``dflash train`` and by the memory estimate (``dflash estimate``, ``train --estimate``).

Example::

    >>> from lengthwise.cli.dflash._settings import DEFAULTS
    >>> DEFAULTS["block_size"], DEFAULTS["max_tokens"]
    (16, 16384)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

#: defaults of the command where they differ from ``DFlashTrainConfig`` (the reference run)
DEFAULTS: dict[str, Any] = {
    "draft_layers": 5, "num_anchors": 512, "block_size": 16, "max_tokens": 16384,
    "grad_accum": 1, "checkpoint_every": 2000, "lr": 6e-4, "warmup_ratio": 0.04,
    "schedule": "cosine", "max_slots": 32768,
}

FLAGS: list[tuple[str, type, str]] = [
    ("steps", int, "optimizer steps (or --epochs)"),
    ("epochs", float, "passes over the training samples (sets --steps from the plan)"),
    ("grad_accum", int, "micro-batches per optimizer step and rank (default 1)"),
    ("max_tokens", int, "token budget of a micro-batch (default 16384)"),
    ("max_len", int, "longest sample; longer ones are truncated (default: the data's longest, "
                     "at most max_tokens)"),
    ("lr", float, "peak learning rate (default 6e-4)"),
    ("warmup", int, "warm-up steps (default: warmup_ratio of the steps)"),
    ("warmup_ratio", float, "warm-up share of the steps (default 0.04)"),
    ("schedule", str, "learning-rate schedule after warm-up: cosine (default) or constant"),
    ("block_size", int, "draft block size (default 16)"),
    ("draft_layers", int, "draft decoder layers (default 5)"),
    ("num_features", int, "target layers feeding the draft (default: draft_layers)"),
    ("num_anchors", int, "anchors drawn per sample and step (default 512)"),
    ("max_slots", int, "draft slots (anchors x block size) per micro-batch (default 32768)"),
    ("head_chunk", int, "supervised slots per LM-head and cross-entropy chunk (default 1024)"),
    ("gamma", float, "loss decay over block slots (default: 7 for block 16, 5 for 10, 4 for 8)"),
    ("seed", int, "seed of the draft's initialisation, the sampler and the anchors"),
    ("device", str, "cpu, cuda or cuda:N (default cpu)"),
    ("dtype", str, "dtype of the target's weights and of autocast: bf16, fp16 or fp32 "
                   "(default fp32 on CPU; on CUDA the checkpoint's weights and bf16 autocast)"),
    ("checkpoint_every", int, "steps between checkpoints (default 2000; 0: none)"),
    ("keep_checkpoints", int, "checkpoints kept (default 2)"),
    ("clip", float, "gradient-norm clipping, > 0 (default 1.0; inf: no clipping)"),
    ("weight_decay", float, "AdamW weight decay (default 0)"),
    ("buckets", int, "length buckets of the sampler (default: chosen automatically)"),
    ("threads", int, "torch threads per process on CPU (default 1)"),
    ("eval_samples", int, "prepared samples held out for evaluation (default 64)"),
    ("eval_every", int, "steps between held-out evaluations (default: a tenth of the run; "
                        "0: none)"),
    ("eval_anchors", int, "anchors per held-out sample (default: num_anchors)"),
    ("order", str, "batching order of the sampler (default stratified) or packed"),
    ("wandb_project", str, "W&B project (with --wandb)"),
    ("tensorboard", str, "also log to TensorBoard event files in this folder"),
    ("features", str, "a feature cache of --data from `dflash features`: the target's "
                      "features are read from it, not computed each step"),
]


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The settings of a YAML file, keys with ``-`` read as ``_``."""
    from lengthwise.errors import ConfigError, MissingDependencyError

    try:
        import yaml
    except ImportError as exc:
        raise MissingDependencyError("--config needs PyYAML (pip install "
                                     "'lengthwise[dflash]')") from exc
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not YAML ({' '.join(str(exc).split())})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: must be a mapping of settings, "
                          f"got {type(data).__name__}")
    out = {str(k).replace("-", "_"): v for k, v in data.items()}
    for key, value in out.items():
        wrong = _wrong_type(key, value)
        if wrong:
            raise ConfigError(f"--config {path}: {key} must be {wrong}, got {value!r}")
    return out


#: YAML keys that are switches (``--resume``, ``--wandb``, ``--no-progress``)
_SWITCHES = ("resume", "wandb", "progress")


def _wrong_type(key: str, value: Any) -> str | None:
    """What a YAML setting must be when ``value`` is not that (``None``: fine or unknown key).

    Example::

        >>> _wrong_type("resume", "false"), _wrong_type("max_tokens", [1, 2])
        ('true or false', 'an integer')
        >>> _wrong_type("lr", "6e-4") is None  # YAML reads 6e-4 as text: converted later
        True
    """
    from lengthwise.dflash.train_config import DFlashTrainConfig

    kinds = {name: kind for name, kind, _ in FLAGS}
    kinds.update({f.name: type(f.default) for f in dataclasses.fields(DFlashTrainConfig)
                  if "help" in f.metadata})
    kinds.update(target=str, data=str, out=str)
    if value is None:
        return None
    kind = kinds.get(key)
    if key in _SWITCHES or kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return "an integer"
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
        return "a number"
    if kind is str and not isinstance(value, str):
        return "text"
    return None


def settings(given: dict[str, Any], *, defaults: dict[str, Any] | None = None,
             estimate: bool = False) -> tuple[Any, Any, bool]:
    """``(DFlashTrainConfig, RunSettings, progress)`` from defaults, ``--config`` and flags.

    ``defaults``: over :data:`DEFAULTS`; ``estimate``: the settings of a memory estimate,
    which reads no data (``--data`` may be left out; ``max_len`` defaults to ``max_tokens``).
    """
    from lengthwise.dflash.prepared import open_prepared
    from lengthwise.dflash.recipe import RunSettings
    from lengthwise.dflash.train_config import DFlashTrainConfig
    from lengthwise.errors import ConfigError

    given = dict(given)
    given.pop("func", None)
    given.pop("command", None)
    given.pop("stage", None)
    source = given.pop("config", None)
    merged = {**DEFAULTS, **(defaults or {}), **(read_yaml(source) if source else {}), **given}
    progress = bool(merged.pop("progress", True))
    cfg_fields = {f.name: f for f in dataclasses.fields(DFlashTrainConfig)}
    run_fields = {f.name for f in dataclasses.fields(RunSettings)}
    unknown = sorted(set(merged) - set(cfg_fields) - run_fields)
    if unknown:
        where = f"--config {source}" if source else "settings"
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    if "epochs" in merged and "steps" in merged:
        raise ConfigError("give --steps or --epochs, not both")
    for key in ("target",) if estimate else ("target", "data"):
        if not merged.get(key):
            raise ConfigError(f"--{key} is required (on the command line or in --config)")
    for name, value in merged.items():  # YAML reads 6e-4 as a string
        if name in cfg_fields and isinstance(value, str) and isinstance(
                cfg_fields[name].default, float):
            try:
                merged[name] = float(value)
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if estimate:  # the data is not read: any sample fits a micro-batch of max_tokens
        merged.setdefault("data", "")
        merged["max_len"] = merged.get("max_len") or merged["max_tokens"]
    if merged.get("max_len") is None:
        lengths = open_prepared(merged["data"]).lengths
        merged["max_len"] = int(min(int(lengths.max()), merged["max_tokens"]))
    run = RunSettings(**{k: v for k, v in merged.items() if k in run_fields})
    cfg = DFlashTrainConfig(**{k: v for k, v in merged.items() if k in cfg_fields},
                            progress=False)
    return cfg, run, progress
