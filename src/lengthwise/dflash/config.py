"""The draft's config on disk: ``draft_config.json``, saved with every checkpoint.

:func:`draft_config_json` writes a :class:`~lengthwise.dflash.model.DFlashConfig`
(block size, target layer ids, mask token id, rotary settings, sizes);
:func:`read_draft_config` reads it back, refusing files it cannot trust.

Example::

    >>> from lengthwise.dflash.model import DFlashConfig
    >>> c = DFlashConfig(hidden_size=32, num_heads=4, num_kv_heads=2, block_size=4,
    ...                  target_layers=[1], mask_token_id=7)
    >>> json.loads(draft_config_json(c))["draft"]["mask_token_id"]
    7
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from lengthwise.dflash.model import DFlashConfig
from lengthwise.errors import ConfigError

__all__ = ["DRAFT_CONFIG", "FORMAT", "draft_config_json", "read_draft_config"]

#: file name of the draft's config inside every checkpoint folder
DRAFT_CONFIG = "draft_config.json"
FORMAT = "lengthwise-dflash-draft"
_VERSION = 1


def draft_config_json(cfg: DFlashConfig) -> str:
    """The text of ``draft_config.json``: the format, its version and every field of ``cfg``."""
    return json.dumps({"format": FORMAT, "version": _VERSION, "draft": cfg.to_dict()},
                      indent=2, sort_keys=True) + "\n"


def read_draft_config(path: str | Path) -> DFlashConfig:
    """The :class:`~lengthwise.dflash.model.DFlashConfig` saved in ``path``.

    ``path`` is a ``draft_config.json`` file or the checkpoint folder holding one.
    A folder without one (a checkpoint saved before drafts carried their config)
    or a file in another format raises :class:`~lengthwise.errors.ConfigError`.
    """
    path = Path(path)
    file = path / DRAFT_CONFIG if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{path}: no {DRAFT_CONFIG} (a draft checkpoint saved before drafts "
                          "carried their config cannot be exported; train it again)")
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not readable as JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{file}: not a {FORMAT} file")
    if data.get("version") != _VERSION:
        raise ConfigError(f"{file}: version {data.get('version')!r}; this lengthwise reads "
                          f"version {_VERSION}")
    fields = dict(data["draft"])
    known = set(inspect.signature(DFlashConfig).parameters)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(f"{file}: unknown draft fields {unknown} (written by a newer "
                          "lengthwise?)")
    return DFlashConfig(**fields)
