"""Export a trained draft in the format serving engines load (the reference ``dflash`` layout).

The folder holds ``config.json`` (a Qwen3 config whose ``architectures`` is
``DFlashDraftModel``, with ``block_size``, ``num_target_layers`` and a
``dflash_config`` holding ``mask_token_id``, ``target_layer_ids`` and
``block_size``) and ``model.safetensors`` under the reference module names
(``fc``, ``hidden_norm``, ``layers.N...``, ``norm``): what
``dflash.DFlashDraftModel.from_pretrained`` and SGLang's ``DFLASH`` algorithm read.
The draft keeps no embedding and no LM head: the engine uses the target's.

Example::

    >>> import tempfile, json
    >>> from lengthwise.dflash.model import DFlashConfig, DFlashDraft
    >>> cfg = DFlashConfig(hidden_size=32, num_heads=4, num_kv_heads=2, block_size=4,
    ...                    target_layers=[1, 2], num_target_layers=4, mask_token_id=49,
    ...                    target_vocab_size=50)
    >>> out = export_draft(DFlashDraft(cfg), tempfile.mkdtemp())
    >>> c = json.loads((out / "config.json").read_text())
    >>> c["architectures"], c["dflash_config"]["mask_token_id"], c["block_size"]
    (['DFlashDraftModel'], 49, 4)
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lengthwise.atomic import fsync_dir, replace_folder, temporary_name
from lengthwise.dflash.load import ARCHITECTURE, DERIVED, RENAME, check_target, trained_draft
from lengthwise.dflash.mask_token import check_mask_token
from lengthwise.dflash.target_match import check_draft_tokenizer
from lengthwise.disk import full_disk_error, full_disk_reason
from lengthwise.errors import ConfigError, MissingDependencyError

__all__ = ["SPECULATORS_IMPORTS", "export_checkpoint", "export_draft", "exported_config",
           "exported_weights", "speculators_converter", "to_speculators"]

#: noise of ``PretrainedConfig.to_dict`` that says nothing about the draft
_NOISE = ("id2label", "label2id", "problem_type", "chunk_size_feed_forward", "return_dict",
          "output_hidden_states", "output_attentions", "is_encoder_decoder", "_name_or_path",
          "architectures", "dtype", "torch_dtype", "transformers_version")
_DTYPES = ("float32", "bfloat16", "float16")


def exported_config(cfg: Any, *, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` of a draft with config ``cfg`` (a ``DFlashConfig``)."""
    vocab = cfg.target_vocab_size
    if vocab is None:
        raise ConfigError("target_vocab_size: the draft config does not know the target's "
                          "vocabulary size (give the target)")
    mask = check_mask_token(cfg.mask_token_id, int(vocab))
    block = cfg.block_size
    if isinstance(block, bool) or not isinstance(block, int) or not 2 <= block:
        raise ConfigError(f"block_size {block!r}: the dflash format holds an integer block "
                          "size >= 2 (the anchor and at least one drafted token)")
    if block > cfg.max_position_embeddings:
        raise ConfigError(f"block_size {block} exceeds max_position_embeddings "
                          f"{cfg.max_position_embeddings}")
    if cfg.target_layers is None or cfg.num_target_layers is None:
        raise ConfigError("target_layers and num_target_layers must be known to export a draft")
    bad = [i for i in cfg.target_layers if not 0 <= i < cfg.num_target_layers]
    if bad:
        raise ConfigError(f"target_layers {cfg.target_layers} must lie in "
                          f"[0, {cfg.num_target_layers})")
    base = {k: v for k, v in cfg.qwen3_config(vocab_size=int(vocab)).to_dict().items()
            if k not in _NOISE}
    base["rope_theta"] = float(cfg.rope_theta)  # read by transformers 4.x and engines alike
    if cfg.rope_scaling is not None:
        base["rope_scaling"] = dict(cfg.rope_scaling)
    layers = [int(i) for i in cfg.target_layers]
    return {
        "architectures": [ARCHITECTURE], **base, "dtype": dtype,
        "block_size": int(block), "num_target_layers": int(cfg.num_target_layers),
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": layers,
                          "block_size": int(block),
                          **({"tokenizer": cfg.tokenizer} if cfg.tokenizer else {}),
                          **({"target_weights": cfg.target_weights}
                             if cfg.target_weights else {})},
    }


def exported_weights(draft: Any, *, dtype: str | None = None) -> dict[str, Any]:
    """The draft's tensors under the reference names (contiguous CPU copies).

    A draft trained with ``standardize_features`` has its feature scale folded into
    ``fc`` (:func:`~lengthwise.dflash.model.folded_state`): the same output.
    """
    import torch

    if dtype is not None and dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    from lengthwise.dflash.model import folded_state

    out = {}
    for name, tensor in folded_state(draft.state_dict()).items():
        if name.startswith(DERIVED):
            continue
        for ours, theirs in RENAME.items():
            if name.startswith(ours):
                name = theirs + name[len(ours):]
        t = tensor.detach().to("cpu")
        if dtype is not None:
            t = t.to(getattr(torch, dtype))
        out[name] = t.contiguous()
    return out


def export_draft(draft: Any, out: str | os.PathLike, *, dtype: str | None = None) -> Path:
    """Write ``draft`` into the folder ``out`` (created, or replaced whole); return it.

    ``dtype``: ``float32``, ``bfloat16`` or ``float16`` (default: the draft's own). The
    files are written to a hidden folder beside ``out`` and checked, then renamed to
    ``out``: a failure or a kill leaves no cut ``model.safetensors`` there (an older
    ``out`` stays as it was), and a full disk is a
    :class:`~lengthwise.errors.DiskFullError` naming the folder.
    """
    weights = exported_weights(draft, dtype=dtype)
    kept = str(next(iter(weights.values())).dtype).removeprefix("torch.")
    config = exported_config(draft.config, dtype=kept)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_name(out)
        try:
            tmp.mkdir()
            _write_export(tmp, weights, config)
            replace_folder(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException as exc:
        full = full_disk_error(exc, out.parent, what="exporting the draft",
                               needed=sum(w.numel() * w.element_size() for w in weights.values()))
        if full is not None:
            raise full from None
        raise
    return out


def _write_export(folder: Path, weights: dict[str, Any], config: dict[str, Any]) -> None:
    """``model.safetensors`` (read back: every tensor there) and ``config.json`` in ``folder``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = folder / "model.safetensors"
    save_file(weights, str(path), metadata={"format": "pt"})
    from lengthwise.dflash.target import weight_errors

    try:  # a cut file fails here, not when it is served
        with safe_open(str(path), framework="pt") as fh:
            names = set(fh.keys())
            for name in names:
                fh.get_slice(name)
    except weight_errors() as exc:
        if full_disk_reason(exc) is not None:
            raise
        names = set()
    if names != set(weights) or path.stat().st_size < sum(
            w.numel() * w.element_size() for w in weights.values()):
        raise OSError(errno.EIO, "was not written whole (is the disk full?): the draft was not "
                      "exported", str(path))
    with open(folder / "config.json", "w", encoding="utf-8") as fh:
        fh.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(folder)


def export_checkpoint(path: str | os.PathLike, out: str | os.PathLike, *,
                      dtype: str | None = None, target_config: Any = None,
                      target_tokenizer: Any = None, target: str = "",
                      said: Callable[[str], None] | None = None) -> Path:
    """Export the draft of a run or checkpoint (``load.trained_draft``) into ``out``.

    A run folder gives its final draft when it has one, else its newest checkpoint;
    ``said`` receives the text naming the draft taken. ``target_config``: the
    target's Hugging Face config, checked against the draft (layers, width,
    vocabulary) and supplying the vocabulary size when the draft config lacks it.
    ``target_tokenizer``: the target's tokenizer (``target`` names its folder),
    refused before anything is written when it is not the one the draft was trained with.
    """

    draft, named = trained_draft(path)
    if said is not None:
        said(named)
    if target_tokenizer is not None:
        check_draft_tokenizer(draft.config, target_tokenizer, draft=str(path), target=target)
    if target_config is not None:
        check_target(draft.config, target_config)
    return export_draft(draft, out, dtype=dtype)


#: modules the speculators DFlash converter imports, and the package each comes from
SPECULATORS_IMPORTS = {"speculators": "speculators", "loguru": "loguru",
                       "pydantic_settings": "pydantic-settings", "openai": "openai",
                       "hs_connectors": "hs-connectors"}


def speculators_converter() -> Any:
    """The ``speculators`` package's DFlash converter class.

    A :class:`~lengthwise.errors.MissingDependencyError` names every package it needs
    that is not installed (not only the first one the import trips on).
    """


    missing = [pkg for mod, pkg in SPECULATORS_IMPORTS.items()
               if importlib.util.find_spec(mod) is None]
    if not missing:
        try:
            from speculators.convert.dflash.converter import DFlashConverter

            return DFlashConverter
        except ModuleNotFoundError as exc:  # a dependency of a newer speculators
            missing = [(exc.name or str(exc)).split(".")[0]]
    extra = [p for p in missing if p != "speculators"]
    how = "pip install --no-deps speculators" if "speculators" in missing else ""
    how = " && ".join(x for x in (how, f"pip install {' '.join(extra)}" if extra else "") if x)
    raise MissingDependencyError(f"the speculators format needs packages that are not "
                                 f"installed: {', '.join(missing)} ({how})")


def to_speculators(folder: str | os.PathLike, out: str | os.PathLike,
                   target: str | os.PathLike) -> Path:
    """Convert an exported draft ``folder`` to the speculators (vLLM) format in ``out``.

    Runs the ``speculators`` package's own DFlash converter (``pip install --no-deps
    speculators`` and the packages :data:`SPECULATORS_IMPORTS` names are enough on CPU);
    ``target`` is the target's local folder (the converter copies its embedding, LM head
    and final norm into the checkpoint).
    """
    converter = speculators_converter()
    target = Path(target)
    if not (target / "config.json").is_file():
        raise ConfigError(f"--target {target}: not a local Hugging Face model (no config.json)")
    converter().convert(str(folder), str(out), base_model=str(target), validate=True)
    return Path(out)
