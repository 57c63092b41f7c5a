"""The mask token: a vocabulary id that fills draft blocks, embedded by the target's embedding.

Serving engines (the reference ``dflash`` package, SGLang, vLLM) fill slots
``1 .. B-1`` of every block with ``mask_token_id`` and embed them with the
target's frozen embedding, so a servable draft trains the same way.
:func:`ensure_mask_token` finds the tokenizer's mask token or adds ``<|MASK|>``
(as the reference drafts for Qwen3 do: id 151669, a padding row of the target's
151,936-row embedding); when the new id lies beyond the target's embedding,
the target's embedding and LM head grow by the rows needed (save that target
with the draft: the engine must embed the id) unless the tokenizer has a special
token the target never writes, which is taken instead. :func:`save_grown_target` saves
that grown target, with its tokenizer, as the run's ``target/``, whole or not at all.

Example::

    >>> from tokenizers import Tokenizer, models
    >>> tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    >>> ensure_mask_token(tok)
    MaskToken(id=2, token='<|MASK|>', added=True, resized=False, unused=False)
    >>> ensure_mask_token(tok).added
    False
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lengthwise.atomic import replace_folder
from lengthwise.disk import reporting_full_disk
from lengthwise.errors import ConfigError
from lengthwise.progress import no_transformers_bars

__all__ = ["MASK_TOKEN", "MaskToken", "check_mask_token", "ensure_mask_token", "grow_vocabulary",
           "mask_token_choice", "save_grown_target", "unused_special_token"]

#: the token the reference drafts add when a tokenizer has no mask token
MASK_TOKEN = "<|MASK|>"


@dataclass(frozen=True)
class MaskToken:
    """The mask token's id and text; whether it was added to the tokenizer and the target grown,
    or is a special token of the tokenizer that the target never writes (``unused``)."""

    id: int
    token: str
    added: bool
    resized: bool
    unused: bool = False


def ensure_mask_token(tokenizer: Any, model: Any = None) -> MaskToken:
    """The tokenizer's mask token, adding ``<|MASK|>`` as a special token when it has none.

    ``tokenizer``: a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``. With
    ``model`` (the target), an id beyond its embedding grows the embedding and LM
    head (``resize_token_embeddings``) so that the target can embed it; before that,
    a special token the target never writes (:func:`unused_special_token`) is taken
    instead, so that the draft is served with the target as it is.
    """
    token, tid, added, unused = mask_token_choice(tokenizer, model)
    if unused:
        return MaskToken(id=tid, token=token, added=False, resized=False, unused=True)
    resized = model is not None and grow_vocabulary(model, int(tid) + 1)
    return MaskToken(id=int(tid), token=token, added=added, resized=resized)


def mask_token_choice(tokenizer: Any, model: Any = None) -> tuple[str, int, bool, bool]:
    """``(token, id, added, unused)``: the mask token :func:`ensure_mask_token` takes, the
    model left as it is (``<|MASK|>`` is added to ``tokenizer`` when it is the choice).

    ``model`` is read for its embedding's rows, config and generation config only, so a
    stand-in with those serves (the memory estimate's, which reads no weights).

    Example::

        >>> from tokenizers import Tokenizer, models
        >>> mask_token_choice(Tokenizer(models.WordLevel({"a": 0}, unk_token="a")))
        ('<|MASK|>', 1, True, False)
    """
    if hasattr(tokenizer, "add_special_tokens") and hasattr(tokenizer, "convert_tokens_to_ids"):
        if model is not None and _hf_has_no_mask(tokenizer) and len(tokenizer) >= int(
                model.get_input_embeddings().weight.shape[0]):
            spare = unused_special_token(tokenizer, model)
            if spare is not None:
                return spare[0], int(spare[1]), False, True
        token, tid, added = _hf_mask(tokenizer)
    elif hasattr(tokenizer, "token_to_id"):
        tid = tokenizer.token_to_id(MASK_TOKEN)
        added = tid is None
        if added:
            tokenizer.add_special_tokens([MASK_TOKEN])
            tid = tokenizer.token_to_id(MASK_TOKEN)
        token = MASK_TOKEN
    else:
        raise ConfigError(f"tokenizer: {type(tokenizer).__name__} is neither a transformers "
                          "tokenizer nor a tokenizers.Tokenizer")
    return token, int(tid), bool(added), False


def grow_vocabulary(model: Any, rows: int) -> bool:
    """Grow a causal LM's embedding and LM head to ``rows`` rows; ``False`` if it has them.

    New embedding rows are the mean of the old ones; new LM head rows too, so a new
    token's logit is the mean of the others' and greedy decoding never picks it.

    Example::

        >>> import transformers
        >>> m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        ...     vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...     intermediate_size=16))
        >>> grow_vocabulary(m, 12), m.get_input_embeddings().weight.shape[0]
        (True, 12)
    """
    import torch

    old = int(model.get_input_embeddings().weight.shape[0])
    if rows <= old:
        return False
    model.resize_token_embeddings(rows, mean_resizing=False)
    with torch.no_grad():
        for layer in {id(m): m for m in (model.get_input_embeddings(),
                                         model.get_output_embeddings()) if m is not None}.values():
            layer.weight[old:] = layer.weight[:old].mean(dim=0)
            bias = getattr(layer, "bias", None)
            if bias is not None:
                bias[old:] = bias[:old].mean()
    return True


#: names of special tokens that tokenizers keep spare (Llama 3's, Gemma's, BERT's)
_SPARE = re.compile(r"reserved|unused", re.IGNORECASE)


def unused_special_token(tokenizer: Any, model: Any) -> tuple[str, int] | None:
    """A special token of ``tokenizer`` the target never writes in a chat, within its embedding.

    A candidate is a special added token that is none of the tokenizer's named tokens
    (bos, eos, pad, unk, ...), none of the model's end-of-sequence, bos or pad ids, and
    absent from the chat template's text. Names of spare tokens (``reserved``,
    ``unused``) come first, then the lowest id; ``None`` when there is no candidate.
    """
    rows = int(model.get_input_embeddings().weight.shape[0])
    named = {str(v) for v in getattr(tokenizer, "special_tokens_map", {}).values()
             if isinstance(v, str)}
    taken: set[int] = set()
    for src in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            value = getattr(src, key, None) if src is not None else None
            taken.update(int(t) for t in (value if isinstance(value, (list, tuple))
                                          else [value]) if t is not None)
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(str(t) for t in template.values())
    found = [(not _SPARE.search(t.content), int(i), t.content)
             for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
             if getattr(t, "special", False) and int(i) < rows and int(i) not in taken
             and t.content not in named and t.content not in template]
    if not found:
        return None
    _, tid, token = min(found)
    return token, tid


def _hf_has_no_mask(tokenizer: Any) -> bool:
    """Whether a transformers tokenizer has neither a mask token nor ``<|MASK|>``."""
    return (getattr(tokenizer, "mask_token_id", None) is None
            and MASK_TOKEN not in tokenizer.get_vocab())


def _hf_mask(tokenizer: Any) -> tuple[str, int, bool]:
    existing = getattr(tokenizer, "mask_token", None)
    if existing is not None and getattr(tokenizer, "mask_token_id", None) is not None:
        return str(existing), int(tokenizer.mask_token_id), False
    vocab = tokenizer.get_vocab()
    if MASK_TOKEN in vocab:
        return MASK_TOKEN, int(vocab[MASK_TOKEN]), False
    tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    return MASK_TOKEN, int(tokenizer.convert_tokens_to_ids(MASK_TOKEN)), True


def check_mask_token(mask_token_id: Any, vocab_size: int, *, where: str = "mask_token_id") -> int:
    """``mask_token_id`` as an int, or a :class:`~lengthwise.errors.ConfigError` naming ``where``.

    It must index a row of the target's embedding (``0 <= id < vocab_size``).

    Example::

        >>> check_mask_token(5, 10)
        5
        >>> check_mask_token(10, 10)
        Traceback (most recent call last):
        ...
        lengthwise.errors.ConfigError: mask_token_id 10 is outside the target's vocabulary [0, 10)
    """
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise ConfigError(f"{where} must be an integer token id, got {mask_token_id!r}")
    if not 0 <= mask_token_id < vocab_size:
        raise ConfigError(f"{where} {mask_token_id} is outside the target's vocabulary "
                          f"[0, {vocab_size})")
    return int(mask_token_id)


#: the files of a saved model's weights (one file, or shards and their index)
_WEIGHTS_INDEX = "model.safetensors.index.json"


def save_grown_target(model: Any, tokenizer: Any, folder: str | os.PathLike[str]) -> bool:
    """Save ``model`` and ``tokenizer`` to ``folder`` atomically; ``False`` if it already held them.

    The files go to a hidden folder beside ``folder``, renamed over it on success
    (an older ``folder`` is removed after). A full disk is a
    :class:`~lengthwise.errors.DiskFullError`; nothing half-written is left: a failure
    (a full disk, a file over ``ulimit -f``) never leaves a ``folder`` that looks complete.
    A ``folder`` that already holds these weights, config and tokenizer (a resumed run) is
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
            replace_folder(tmp, folder)
            return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
