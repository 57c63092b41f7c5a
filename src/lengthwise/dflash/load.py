"""Drafts back from disk: a training run or checkpoint, or a folder in the served layout.

:func:`load_draft` takes either; :func:`trained_draft` reads a run's final
draft (``final/``, when the run finished) or a checkpoint with its
``draft_config.json``, and names the one it took; :func:`load_exported` reads the
reference ``dflash`` layout that :mod:`~lengthwise.dflash.export` writes (and
drafts published in it). :func:`check_target` refuses a target the draft was
not trained for.

Example::

    >>> import tempfile
    >>> from lengthwise.dflash.export import export_draft
    >>> from lengthwise.dflash.model import DFlashConfig, DFlashDraft
    >>> cfg = DFlashConfig(hidden_size=32, num_heads=4, num_kv_heads=2, block_size=4,
    ...                    target_layers=[1, 2], num_target_layers=4, mask_token_id=49,
    ...                    target_vocab_size=50)
    >>> draft = load_draft(export_draft(DFlashDraft(cfg), tempfile.mkdtemp()))
    >>> draft.config.mask_token_id, draft.config.target_layers
    (49, [1, 2])
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lengthwise.dflash.rope import rope_settings
from lengthwise.dflash.target_match import DRAFT_TARGET_FIX
from lengthwise.errors import ConfigError

__all__ = ["ARCHITECTURE", "FINAL", "FINAL_STEP", "RENAME", "check_target", "load_draft",
           "load_draft_checkpoint", "load_exported", "missing_draft_files", "open_draft",
           "trained_draft"]

#: the draft class the reference package and SGLang instantiate
ARCHITECTURE = "DFlashDraftModel"
#: our module names -> the reference's (the rest are the same)
RENAME = {"context_norm.": "hidden_norm."}
#: buffers recomputed from the config, never stored
DERIVED = ("rotary.",)


#: the trained draft a finished run leaves in its folder (``draft.pt``, ``config.json``)
FINAL = "final"
#: the step a run's final draft was trained for, beside it (``{"step": N}``)
FINAL_STEP = "step.json"


def trained_draft(path: str | os.PathLike) -> tuple[Any, str]:
    """A :class:`~lengthwise.dflash.model.DFlashDraft` from a training run, and which one it is.

    ``path``: a run folder (its final draft when the run finished, else its newest
    complete checkpoint), its ``final`` folder, its ``checkpoints`` folder (the newest
    complete checkpoint) or one ``step_N`` folder. The text names the draft taken, e.g.
    ``"run/final (step 80)"`` or ``"run/checkpoints/step_60 (step 60; the run has no
    final draft)"``.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such run or checkpoint folder")
    if (path / FINAL / "draft.pt").is_file():
        path = path / FINAL
    if (path / "draft.pt").is_file():
        return _final_draft(path)
    run = (path / "checkpoints").is_dir()
    if run:
        path = path / "checkpoints"
    draft, step = _checkpoint_draft(path)
    return draft, f"{step} (step {step.name.removeprefix('step_')}" + (
        "; the run has no final draft)" if run else ")")


def load_draft_checkpoint(path: str | os.PathLike) -> Any:
    """The draft of a training run or checkpoint (:func:`trained_draft`)."""
    return trained_draft(path)[0]


def _checkpoint_draft(path: Path) -> tuple[Any, Path]:
    """The draft of one checkpoint (``path``, or the newest complete one under it)."""
    from lengthwise.dflash.model import DFlashDraft, read_draft_config
    from lengthwise.train.checkpoint import load_checkpoint
    from lengthwise.train.checkpoint.folder import CheckpointError, resolve_checkpoint

    try:
        step, _ = resolve_checkpoint(path)
    except (FileNotFoundError, CheckpointError) as exc:  # the message may name ``path`` already
        raise ConfigError(str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}",
                          ) from exc
    draft = DFlashDraft(read_draft_config(step))
    try:
        load_checkpoint(step, model=draft, restore_rng=False)
    except CheckpointError as exc:  # its message names the file, inside ``step``
        raise ConfigError(str(exc) if str(step) in str(exc) else f"{step}: {exc}") from exc
    return draft.eval(), step


def _final_draft(folder: Path) -> tuple[Any, str]:
    """The final draft a run wrote to ``folder`` (``draft.pt`` read with ``weights_only``)."""

    import torch

    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    try:
        fields = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        draft = DFlashDraft(DFlashConfig(**fields))
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{folder}/config.json: not a readable draft config "
                          f"({' '.join(str(exc).split())[:200]})") from None
    try:
        state = torch.load(folder / "draft.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(f"{folder}/draft.pt holds objects other than tensors; refused, not "
                          "loaded") from None
    except (OSError, RuntimeError, EOFError) as exc:  # damaged or cut short
        raise ConfigError(f"{folder}/draft.pt: not readable, damaged or cut short "
                          f"({' '.join(str(exc).split())[:200]})") from None
    try:
        draft.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:  # other weights or not a dict
        raise ConfigError(f"{folder}/draft.pt: not the weights of this draft, damaged or cut "
                          f"short ({' '.join(str(exc).split())[:200]})") from None
    try:
        step = int(json.loads((folder / FINAL_STEP).read_text(encoding="utf-8"))["step"])
        named = f"{folder} (step {step})"
    except (OSError, ValueError, KeyError, TypeError):  # a run written before it was saved
        named = f"{folder} (the run's final draft)"
    return draft.eval(), named


def check_target(cfg: Any, target_config: Any) -> None:
    """Refuse a target whose width, layer count or vocabulary differ from the draft's."""
    text = getattr(target_config, "get_text_config", lambda: target_config)()
    vocab = int(text.vocab_size)
    if cfg.target_vocab_size is None:
        cfg.target_vocab_size = vocab
    pairs = (("hidden_size", cfg.hidden_size, text.hidden_size),
             ("num_target_layers", cfg.num_target_layers, text.num_hidden_layers),
             ("target_vocab_size", cfg.target_vocab_size, vocab))
    for name, ours, theirs in pairs:
        if ours is not None and int(ours) != int(theirs):
            raise ConfigError(f"--target: the draft was trained with {name} {ours}, the "
                              f"target has {theirs}; {DRAFT_TARGET_FIX}")


def load_exported(folder: str | os.PathLike) -> Any:
    """A :class:`~lengthwise.dflash.model.DFlashDraft` from a folder in the reference layout.

    Reads what :func:`export_draft` writes, and drafts published in that layout
    (``block_size`` and ``mask_token_id`` in ``dflash_config`` or at the top level).
    """

    from safetensors.torch import load_file

    from lengthwise.dflash.model import DFlashConfig, DFlashDraft

    folder = Path(folder)
    try:
        c = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{folder}: no readable config.json ({exc})") from exc
    if ARCHITECTURE not in (c.get("architectures") or []):
        raise ConfigError(f"{folder}/config.json: architectures {c.get('architectures')} do "
                          f"not name {ARCHITECTURE}")
    d = c.get("dflash_config") or {}

    def value(key: str) -> Any:
        return d.get(key, c.get(key))

    try:
        cfg = DFlashConfig(
            hidden_size=c["hidden_size"], num_layers=c["num_hidden_layers"],
            num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"],
            head_dim=c.get("head_dim"), intermediate_size=c["intermediate_size"],
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            max_position_embeddings=c.get("max_position_embeddings", 32768),
            **rope_settings(SimpleNamespace(**{k: c.get(k) for k in (
                "rope_parameters", "rope_theta", "rope_scaling")})),
            block_size=value("block_size"), target_layers=value("target_layer_ids"),
            num_target_layers=value("num_target_layers"), mask_token_id=value("mask_token_id"),
            target_vocab_size=c.get("vocab_size"), tokenizer=d.get("tokenizer"),
            target_weights=d.get("target_weights"))
    except KeyError as exc:
        raise ConfigError(f"{folder}/config.json: no {exc.args[0]!r}") from exc
    draft = DFlashDraft(cfg)
    ours = {v: k for k, v in RENAME.items()}
    state = {}
    from lengthwise.dflash.target import weight_errors

    try:
        tensors = load_file(str(folder / "model.safetensors"))
    except weight_errors() as exc:
        raise ConfigError(f"{folder}/model.safetensors: not a readable safetensors file, "
                          f"damaged or cut short ({' '.join(str(exc).split())[:200]})") from None
    for name, tensor in tensors.items():
        for theirs, mine in ours.items():
            if name.startswith(theirs):
                name = mine + name[len(theirs):]
        state[name] = tensor
    missing, unexpected = draft.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(DERIVED)]
    if missing or unexpected:
        raise ConfigError(f"{folder}/model.safetensors: missing {missing[:4]}, unexpected "
                          f"{unexpected[:4]} weights for a DFlash draft")
    return draft.to(next(iter(state.values())).dtype).eval()


def load_draft(path: str | os.PathLike) -> Any:
    """A draft from an exported folder (``config.json``) or a training run or checkpoint."""
    return open_draft(path)[0]


def open_draft(path: str | os.PathLike) -> tuple[Any, str]:
    """:func:`load_draft` and the text naming the draft taken (:func:`trained_draft`).

    A folder holding part of a draft's files is refused naming the ones it lacks.
    """
    path = Path(path)
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return load_exported(path), f"{path} (exported)"
    missing = missing_draft_files(path)
    if missing:
        raise ConfigError(f"{path}: not a draft: missing {missing} (a draft folder holds "
                          "config.json and model.safetensors, as `dflash export` writes, or "
                          "config.json and draft.pt, as `dflash train` writes under final/)")
    return trained_draft(path)


def missing_draft_files(path: Path) -> str | None:
    """What a folder holding only part of a draft's files lacks; ``None`` for anything else.

    Example::

        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> missing_draft_files(folder) is None
        True
        >>> _ = (folder / "model.safetensors").write_bytes(b"")
        >>> missing_draft_files(folder)
        'config.json'
    """
    if (path / FINAL).is_dir() or (path / "checkpoints").is_dir():
        return None  # a run folder: trained_draft names what it lacks
    weights = [f for f in ("model.safetensors", "draft.pt") if (path / f).is_file()]
    config = (path / "config.json").is_file()
    if weights and not config:
        return "config.json"
    if config and not weights:  # a run's final/ config has no architectures
        try:
            final = "architectures" not in json.loads((path / "config.json").read_text())
        except (OSError, ValueError, TypeError):
            final = False
        return "draft.pt" if final else "model.safetensors"
    return None
