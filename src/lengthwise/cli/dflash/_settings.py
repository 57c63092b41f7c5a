"""The settings of a `lengthwise dflash train` run: defaults, `--config run.yaml`, then flags.

Read by ``dflash train`` and by the memory estimate (``dflash estimate``, ``train --estimate``).

Example::

    >>> from lengthwise.cli.dflash._settings import DEFAULTS
    >>> DEFAULTS["draft_layers"], DEFAULTS["max_tokens"]
    (5, 16384)
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from lengthwise.cli._options import add_config_flags, field_type
from lengthwise.dflash.train_config import DFlashTrainConfig, RunSettings
from lengthwise.errors import ConfigError, MissingDependencyError

#: defaults of the command where they differ from ``DFlashTrainConfig``'s
DEFAULTS: dict[str, Any] = {
    "draft_layers": 5, "max_tokens": 16384, "grad_accum": 1, "checkpoint_every": 2000,
    "max_slots": 32768,
}
#: defaults the help shows that no setting holds (computed when the run starts)
_COMPUTED = {"max_len": None}


def add_run_flags(p: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None,
                  defaults: dict[str, Any] | None = None) -> None:
    """The flags of a run's settings (``DFlashTrainConfig``, ``RunSettings``), or of those
    named in ``only``; a flag left out leaves its setting to ``--config`` or the defaults
    (:data:`DEFAULTS`, then ``defaults``), which its help shows."""
    for cls in (RunSettings, DFlashTrainConfig):
        add_config_flags(p, cls, only=only, given_only=True,
                         defaults={**DEFAULTS, **_COMPUTED, **(defaults or {})})


def run_flags() -> dict[str, Any]:
    """Every run setting that is a flag, and what its flag parses.

    Example::

        >>> kinds = run_flags()
        >>> kinds["steps"], kinds["epochs"], kinds["resume"]
        (<class 'int'>, <class 'float'>, <class 'bool'>)
    """
    return {f.name: field_type(f) for cls in (RunSettings, DFlashTrainConfig)
            for f in dataclasses.fields(cls) if "help" in f.metadata}


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The settings of a YAML file, keys with ``-`` read as ``_``."""
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


def _wrong_type(key: str, value: Any) -> str | None:
    """What a YAML setting must be when ``value`` is not that (``None``: fine or unknown key).

    Example::

        >>> _wrong_type("resume", "false"), _wrong_type("max_tokens", [1, 2])
        ('true or false', 'an integer')
        >>> _wrong_type("lr", "6e-4") is None  # YAML reads 6e-4 as text: converted later
        True
    """
    if value is None:
        return None
    kind = run_flags().get(key)
    if kind is bool:
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

    given = {k: v for k, v in given.items() if k not in ("func", "command", "stage")}
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
