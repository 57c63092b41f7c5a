"""Settings of a resumed ``dflash train``: each one either applied and said, or refused by name.

Every checkpoint of a run holds ``train_settings.json`` (:func:`settings_json`): the
loop's and the run's settings, the prepared data's fingerprint and its tokenizer hash. On
``--resume``, :func:`check_resume` compares them with the settings given, before anything
is loaded:

- settings that fix the draft's shape or the data and its order (:data:`REFUSED`: block
  size, layers, token budget, seed, order, held-out split, the prepared data) cannot
  change in a resumed run: a :class:`~lengthwise.errors.ConfigError` names each flag with
  its old and new value;
- every other change (learning rate, schedule, steps, clipping, anchors, ...) is applied
  from the resumed step on and listed, so the run says what it does.

A checkpoint without this file, written by an older lengthwise, is refused naming it.
:func:`apply_optimizer_settings` puts the learning rate and weight decay given into the
optimizer and schedule a checkpoint restored.

Example::

    >>> old = {"cfg": {"lr": 0.01, "block_size": 4}, "run": {}, "data": None}
    >>> changed({"cfg": {"lr": 0.001, "block_size": 4}, "run": {}, "data": None}, old)
    (['--lr 0.01 -> 0.001'], [])
    >>> changed({"cfg": {"lr": 0.01, "block_size": 8}, "run": {}, "data": None}, old)
    ([], ['--block-size 4 -> 8'])
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from lengthwise.errors import ConfigError

__all__ = ["REFUSED", "SETTINGS_FILE", "apply_optimizer_settings", "changed", "check_resume",
           "settings_json"]

#: file name of the run's settings inside every checkpoint folder
SETTINGS_FILE = "train_settings.json"
#: settings a resumed run cannot change: the draft's shape, the data, its split and order
REFUSED = ("block_size", "draft_layers", "num_features", "standardize_features", "max_tokens",
           "max_len", "grad_accum", "seed", "buckets", "pad_multiple", "order", "eval_samples",
           "split_seed", "data")
#: fields that are not settings of the run (or change every time)
_SKIP = ("progress", "resume", "overwrite", "target", "data", "out", "epochs")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def snapshot(cfg: Any, run: Any, data_info: dict[str, Any]) -> dict[str, Any]:
    """The settings compared on resume: the loop's, the run's and the data's fingerprint."""
    return {"cfg": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _SKIP},
            "run": {k: v for k, v in dataclasses.asdict(run).items() if k not in _SKIP},
            "data": _data_identity(data_info)}


def _data_identity(info: dict[str, Any]) -> str | None:
    """The prepared data's fingerprint (source and settings) and its tokenizer's hash."""
    fp = info.get("fingerprint")
    if fp is None:
        return None
    tok = info.get("tokenizer_sha256")
    return f"{fp}:{tok[:16]}" if tok else fp


def settings_json(cfg: Any, run: Any, data_info: dict[str, Any]) -> str:
    """The text of ``train_settings.json``."""
    return json.dumps(snapshot(cfg, run, data_info), indent=2, sort_keys=True) + "\n"


def changed(new: dict[str, Any], old: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(applied, refused)``: the settings that differ, as ``--flag old -> new``."""
    applied, refused = [], []
    pairs = [(k, v, new["cfg"].get(k)) for k, v in old.get("cfg", {}).items()]
    pairs += [(k, v, new["run"].get(k)) for k, v in old.get("run", {}).items()]
    for name, before, now in pairs:
        if before == now:
            continue
        line = f"{_flag(name)} {before} -> {now}"
        (refused if name in REFUSED else applied).append(line)
    if old.get("data") is not None and old["data"] != new.get("data"):
        refused.append(f"--data (other data or tokenizer: {old['data']} -> "
                       f"{new.get('data')})")
    return applied, refused


def check_resume(checkpoint: Path, cfg: Any, run: Any, data_info: dict[str, Any]) -> list[str]:
    """Refuse settings a resume from ``checkpoint`` cannot change; return the changes applied."""
    new = snapshot(cfg, run, data_info)
    file = checkpoint / SETTINGS_FILE
    if not file.is_file():
        raise ConfigError(f"--resume from {checkpoint}: it holds no {SETTINGS_FILE}: it was "
                          "written by an older lengthwise, which this version does not resume; "
                          "start a new run in another --out")
    try:
        old = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(old, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise ConfigError(f"{file}: not readable ({exc})") from None
    applied, refused = changed(new, old)
    if refused:
        raise ConfigError(f"--resume from {checkpoint}: {', '.join(refused)}: a resumed run "
                          "keeps the draft's shape, its data and their order; give the "
                          "checkpoint's values, or start a new run in another --out")
    return applied


def apply_optimizer_settings(optimizer: Any, scheduler: Any, cfg: Any) -> list[str]:
    """Put ``cfg.lr`` and ``cfg.weight_decay`` into a restored optimizer and schedule.

    A checkpoint restores the learning rate and weight decay it was saved with; a
    resumed run uses the ones given. Returns the changes made, as ``--flag old -> new``.
    """
    said = []
    before = float(scheduler.base_lrs[0])
    if before != cfg.lr:
        scheduler.base_lrs = [cfg.lr for _ in scheduler.base_lrs]
        for group, rule in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
            group["initial_lr"] = cfg.lr
            group["lr"] = cfg.lr * rule(scheduler.last_epoch)
        said.append(f"--lr {before:g} -> {cfg.lr:g}")
    decay = optimizer.param_groups[0]["weight_decay"]
    if decay != cfg.weight_decay:
        optimizer.param_groups[0]["weight_decay"] = cfg.weight_decay
        said.append(f"--weight-decay {decay:g} -> {cfg.weight_decay:g}")
    return said
