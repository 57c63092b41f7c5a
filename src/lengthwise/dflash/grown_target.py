"""The run's ``target/``: the target grown by the mask token's row, saved whole or not at all.

:func:`save_grown_target` writes the model and its tokenizer into a hidden folder beside
``target/`` and renames it over ``target/`` once every file is written, so a failure (a
full disk, a file over ``ulimit -f``) never leaves a ``target/`` that looks complete: the
failed folder is removed and a full disk is a one-line
:class:`~lengthwise.errors.DiskFullError` naming the folder and the size needed. A
``target/`` that already holds these weights, config and tokenizer (a resumed run) is
kept as it is, not written again.

Example::

    >>> import tempfile, transformers
    >>> from pathlib import Path
    >>> cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
    ...                                num_attention_heads=2, intermediate_size=32)
    >>> model = transformers.LlamaForCausalLM(cfg)
    >>> tok = transformers.PreTrainedTokenizerFast(tokenizer_object=__import__(
    ...     "tokenizers").Tokenizer(__import__("tokenizers").models.WordLevel({"a": 0}, "a")))
    >>> run = Path(tempfile.mkdtemp())
    >>> save_grown_target(model, tok, run / "target")
    True
    >>> save_grown_target(model, tok, run / "target")  # the same target: kept
    False
    >>> sorted(p.name for p in run.iterdir())
    ['target']
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from lengthwise.atomic import fsync_dir
from lengthwise.disk import reporting_full_disk
from lengthwise.progress import no_transformers_bars

__all__ = ["save_grown_target"]

#: the files of a saved model's weights (one file, or shards and their index)
_WEIGHTS_INDEX = "model.safetensors.index.json"


def save_grown_target(model: Any, tokenizer: Any, folder: str | os.PathLike[str]) -> bool:
    """Save ``model`` and ``tokenizer`` to ``folder`` atomically; ``False`` if it already held them.

    The files go to a hidden folder beside ``folder``, renamed over it on success
    (an older ``folder`` is removed after). A full disk is a
    :class:`~lengthwise.errors.DiskFullError`; nothing half-written is left.
    """
    from lengthwise.train.checkpoint.state import state_bytes

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    state = model.state_dict()
    try:
        with reporting_full_disk(folder, needed=state_bytes(state),
                                 what="saving the grown target"):
            tmp.mkdir()
            tokenizer.save_pretrained(str(tmp))
            model.config.save_pretrained(str(tmp))
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(str(tmp))
            if _holds(folder, tmp, state):
                return False
            with no_transformers_bars():  # the command's own lines are its stderr
                model.save_pretrained(str(tmp))
            _replace(tmp, folder)
            return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace(tmp: Path, folder: Path) -> None:
    """Rename ``tmp`` to ``folder``; an older ``folder`` is moved aside first, removed after."""
    old = None
    if folder.exists() or folder.is_symlink():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(folder, old)
    os.replace(tmp, folder)
    fsync_dir(folder.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def _holds(folder: Path, fresh: Path, state: dict[str, Any]) -> bool:
    """Whether ``folder`` holds ``fresh``'s files byte for byte and weights equal to ``state``."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    written = {p.name for p in fresh.iterdir()}
    weights = {p.name for p in folder.iterdir()} - written
    if not weights or any(not (n.endswith(".safetensors") or n == _WEIGHTS_INDEX)
                          for n in weights):
        return False
    for name in written:
        if not (folder / name).is_file() or (
                (folder / name).read_bytes() != (fresh / name).read_bytes()):
            return False
    return _same_weights([folder / n for n in sorted(weights) if n.endswith(".safetensors")],
                         state)


def _same_weights(files: list[Path], state: dict[str, Any]) -> bool:
    """Whether the safetensors ``files`` hold exactly ``state`` (tied copies may be left out)."""
    import torch
    from safetensors import safe_open

    from lengthwise.dflash.target import weight_errors

    saved: set[str] = set()
    try:
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    mine = state.get(key)
                    if mine is None:
                        return False
                    theirs = handle.get_tensor(key)
                    if theirs.dtype != mine.dtype or not torch.equal(theirs, mine.cpu()):
                        return False
                    saved.add(key)
    except (*weight_errors(), OSError):
        return False  # a damaged file: written again
    stored = {state[k].untyped_storage().data_ptr() for k in saved}
    return all(k in saved or v.untyped_storage().data_ptr() in stored
               for k, v in state.items())
