"""Which tokenizer prepared data belongs to: vocabulary size, tokenizer and template hashes.

``dflash prepare`` records :func:`tokenizer_record` in ``prepare.json``; ``dflash
train`` checks the target's tokenizer against it with :func:`check_tokenizer` before
loading the model, so ids of one tokenizer never train a draft for another, and keeps
the record in the draft's config, which ``dflash export --target`` and ``dflash eval``
check the same way (:func:`check_draft_tokenizer`). The
tokenizer hash covers the ids below the recorded vocabulary size: a target grown by
the mask token's row (``run/target``) still matches the data it was trained on.

Example::

    >>> import transformers
    >>> from tokenizers import Tokenizer, models
    >>> tok = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(
    ...     models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>")))
    >>> rec = tokenizer_record(tok)
    >>> rec["vocab_size"], len(rec["tokenizer_sha256"])
    (3, 64)
    >>> check_tokenizer(rec, tok, data="prepared", target="model")
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from lengthwise.errors import DataError

#: the fields of a tokenizer record (``prepare.json`` and ``DFlashConfig.tokenizer``)
TOKENIZER_FIELDS = ("vocab_size", "tokenizer_sha256", "chat_template_sha256")
#: what to do when a target is not the one a draft was trained for
DRAFT_TARGET_FIX = ("give the target the draft was trained for (its run's target/ folder when "
                    "training added the mask token)")

__all__ = ["DRAFT_TARGET_FIX", "TOKENIZER_FIELDS", "check_draft_tokenizer", "check_tokenizer",
           "template_sha256", "tokenizer_record", "tokenizer_sha256"]


def tokenizer_sha256(tokenizer: Any, size: int | None = None) -> str:
    """Hash of the tokenizer's ``token -> id`` map over the ids below ``size`` (all if None)."""
    vocab = tokenizer.get_vocab()
    n = size if size is not None else max(vocab.values(), default=-1) + 1
    tokens: list[str | None] = [None] * n  # by id; an id no token has stays null
    for token, i in vocab.items():
        if 0 <= i < n:
            tokens[i] = token
    return hashlib.sha256(json.dumps(tokens, ensure_ascii=False).encode("utf-8")).hexdigest()


def template_sha256(tokenizer: Any) -> str | None:
    """Hash of the tokenizer's (default) chat template text, ``None`` without one."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        return None
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def tokenizer_record(tokenizer: Any) -> dict[str, Any]:
    """``vocab_size``, ``tokenizer_sha256`` and ``chat_template_sha256`` of a tokenizer."""
    return {"vocab_size": len(tokenizer), "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "chat_template_sha256": template_sha256(tokenizer)}


def check_tokenizer(record: dict[str, Any], tokenizer: Any, *, data: str, target: str) -> None:
    """Refuse a tokenizer other than the one ``record`` (from ``prepare.json``) names.

    The target's tokenizer must hold the recorded vocabulary (the same token for every
    id below ``vocab_size``; tokens added above it, such as the mask token, are fine)
    and the same chat template. A record without one of :func:`tokenizer_record`'s
    fields, written by an older lengthwise, is refused.
    """
    missing = [k for k in ("vocab_size", "tokenizer_sha256", "chat_template_sha256")
               if k not in record]
    if missing:
        raise DataError(f"--data {data}: prepare.json records no {', '.join(missing)}: it was "
                        "written by an older lengthwise, which this version does not train on; "
                        f"prepare --data again with --target {target}")
    _check(record, tokenizer, f"--data {data} was prepared", "prepare.json", target,
           f"prepare --data again with --target {target}, or train with the target it was "
           "made for")


def check_draft_tokenizer(draft_config: Any, tokenizer: Any, *, draft: str, target: str) -> None:
    """Refuse a target whose tokenizer is not the one the draft was trained with.

    A draft records its training data's tokenizer (``DFlashConfig.tokenizer``); one
    without the record (a draft published elsewhere) is not checked.
    """
    record = getattr(draft_config, "tokenizer", None)
    if record:
        _check(record, tokenizer, f"the draft {draft} was trained", "the draft", target,
               DRAFT_TARGET_FIX)


def _check(record: dict[str, Any], tokenizer: Any, subject: str, source: str, target: str,
           fix: str) -> None:
    size = record.get("vocab_size")
    theirs = len(tokenizer)
    if isinstance(size, int):
        ours = record.get("tokenizer_sha256")
        mine = tokenizer_sha256(tokenizer, size)
        if theirs < size or (ours and mine != ours):
            raise DataError(
                f"{subject} with another tokenizer than --target {target}'s ({source}: "
                f"vocabulary {size}, tokenizer sha256 {str(ours)[:12]}; --target: vocabulary "
                f"{theirs}, tokenizer sha256 {mine[:12]}); {fix}")
    ours = record.get("chat_template_sha256")
    mine = template_sha256(tokenizer)
    if ours and mine != ours:
        raise DataError(f"{subject} with another chat template than --target {target}'s "
                        f"({source}: template sha256 {ours[:12]}; --target: "
                        f"{mine[:12] if mine else 'none'}); {fix}")
