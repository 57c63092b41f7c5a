"""Which tokenizer and which target weights prepared data and a draft belong to.

``dflash prepare`` records :func:`tokenizer_record` in ``prepare.json``; ``dflash
train`` checks the target's tokenizer against it with :func:`check_tokenizer` before
loading the model, so ids of one tokenizer never train a draft for another, and keeps
the record in the draft's config, which ``dflash export --target`` and ``dflash eval``
check the same way (:func:`check_draft_tokenizer`). The
tokenizer hash covers the ids below the recorded vocabulary size: a target grown by
the mask token's row (``run/target``) still matches the data it was trained on.

Likewise ``dflash train`` records :func:`weights_record` of the target it trains on (grown by the
mask token's row where training added it) in the draft's config, which ``dflash export``
keeps; ``dflash eval`` refuses a target whose weights are not those
(:func:`check_draft_target_weights`), as it refuses another tokenizer: a target of the same
shapes and tokenizer with other weights (another checkpoint, weights drawn afresh) would
give figures of a draft that was never trained for it.

The record holds the parameters' count, the sha256 of their shapes (in name order) and
:data:`SAMPLES` values read at fixed places, compared within a relative tolerance that a
float32 target read in bfloat16 or float16 keeps (:data:`REL_TOL`).

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
import math
from typing import Any

from lengthwise.errors import DataError

__all__ = ["DRAFT_TARGET_FIX", "REL_TOL", "SAMPLES", "TOKENIZER_FIELDS",
           "check_draft_target_weights", "check_draft_tokenizer", "check_tokenizer", "differs",
           "template_sha256", "tokenizer_record", "tokenizer_sha256", "weights_record"]

#: the fields of a tokenizer record (``prepare.json`` and ``DFlashConfig.tokenizer``)
TOKENIZER_FIELDS = ("vocab_size", "tokenizer_sha256", "chat_template_sha256")
#: what to do when a target is not the one a draft was trained for
DRAFT_TARGET_FIX = ("give the target the draft was trained for (its run's target/ folder when "
                    "training added the mask token)")

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
    missing = [k for k in TOKENIZER_FIELDS if k not in record]
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


#: values of the target's weights a record keeps
SAMPLES = 64
#: relative difference two records' values may have (a float32 weight read in bfloat16 or
#: float16 moves by at most 2**-9 of itself)
REL_TOL = 1e-2
#: absolute difference below which two values are equal (float16's subnormal steps)
ABS_TOL = 1e-6
#: the golden ratio's fraction: sample ``i`` sits at this times ``i + 1`` (mod 1) of its tensor
_SPREAD = (math.sqrt(5) - 1) / 2


def weights_record(model: Any) -> dict[str, Any]:
    """``parameters``, ``shapes_sha256`` and ``sample`` of a model's weights (module doc).

    Example::

        >>> import torch, transformers
        >>> cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
        ...                                num_attention_heads=2, intermediate_size=32)
        >>> model = transformers.LlamaForCausalLM(cfg)
        >>> rec = weights_record(model)
        >>> rec["parameters"], len(rec["sample"])
        (21, 64)
        >>> differs(rec, weights_record(model.to(torch.bfloat16)))
        0
    """
    params = [p for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0])]
    shapes = json.dumps([list(p.shape) for p in params])
    sample = []
    for i in range(SAMPLES if params else 0):
        flat = params[i * len(params) // SAMPLES].detach().reshape(-1)
        if flat.numel():
            value = float(flat[int((i + 1) * _SPREAD % 1.0 * flat.numel())])
            sample.append(value if math.isfinite(value) else None)
    return {"parameters": len(params),
            "shapes_sha256": hashlib.sha256(shapes.encode("utf-8")).hexdigest(),
            "sample": sample}


def differs(record: dict[str, Any], other: dict[str, Any]) -> int:
    """How many sampled values of two records differ (all of them when the shapes differ).

    Example::

        >>> a = {"parameters": 2, "shapes_sha256": "x", "sample": [1.0, 0.5]}
        >>> differs(a, {**a, "sample": [1.001, -0.5]}), differs(a, {**a, "shapes_sha256": "y"})
        (1, 2)
    """
    ours, theirs = record.get("sample") or [], other.get("sample") or []
    if (record.get("shapes_sha256") != other.get("shapes_sha256")
            or record.get("parameters") != other.get("parameters") or len(ours) != len(theirs)):
        return max(len(ours), len(theirs))
    return sum(not _close(a, b) for a, b in zip(ours, theirs, strict=True))


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) + ABS_TOL


def check_draft_target_weights(draft_config: Any, model: Any, *, draft: str,
                               target: str) -> None:
    """Refuse a target whose weights are not those the draft was trained on.

    A draft without the record (``DFlashConfig.target_weights``: published elsewhere) is
    not checked, as :func:`check_draft_tokenizer` does not
    check a draft without its tokenizer record.
    """
    record = getattr(draft_config, "target_weights", None)
    if not record:
        return
    mine = weights_record(model)
    n = differs(record, mine)
    if n:
        raise DataError(
            f"the draft {draft} was trained on other weights than --target {target}'s ({n} "
            f"of {len(record.get('sample') or [])} sampled values differ; the draft: "
            f"{record.get('parameters')} tensors, shapes sha256 "
            f"{str(record.get('shapes_sha256'))[:12]}; --target: {mine['parameters']} "
            f"tensors, shapes sha256 {mine['shapes_sha256'][:12]}); {DRAFT_TARGET_FIX}")
